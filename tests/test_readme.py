"""README.md stays a first screen: short, with every relative link leading to a file that is
there (the long forms live in docs/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 250
# [text](target) in Markdown: the target up to a space, a closing parenthesis or an anchor
LINK = re.compile(r"\]\(([^)\s#]*)(?:#[^)\s]*)?\)")


@pytest.mark.unit
def test_readme_is_under_the_line_limit():
    lines = len(README.read_text().splitlines())
    assert lines < MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


@pytest.mark.unit
def test_every_relative_link_in_the_readme_leads_to_a_file():
    targets = [t for t in LINK.findall(README.read_text()) if t and "://" not in t]
    assert targets, "README.md links to nothing in docs/"
    missing = sorted({t for t in targets if not (ROOT / t).exists()})
    assert missing == []
