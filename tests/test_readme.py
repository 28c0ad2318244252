"""README.md stays a first screen: short, with every relative link leading to a file that is
there (the long forms live in docs/)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
MAX_LINES = 160
# [text](target) in Markdown: the target up to a space, a closing parenthesis or an anchor
LINK = re.compile(r"\]\(([^)\s#]*)(?:#[^)\s]*)?\)")


@pytest.mark.unit
def test_readme_is_under_the_line_limit():
    lines = len(README.read_text().splitlines())
    assert lines <= MAX_LINES, f"README.md has {lines} lines; move detail into docs/"


@pytest.mark.unit
def test_every_relative_link_in_the_readme_leads_to_a_file():
    targets = [t for t in LINK.findall(README.read_text()) if t and "://" not in t]
    assert targets, "README.md links to nothing in docs/"
    missing = sorted({t for t in targets if not (ROOT / t).exists()})
    assert missing == []


@pytest.mark.unit
def test_the_results_table_is_one_figure_and_one_cost_a_cell():
    """README's results table: at most 8 lines, no cell over 30 words, and a column that says
    what each row was measured on (the long story is in docs/records/)."""
    text = README.read_text().split("## Results", 1)[1].split("\n## ", 1)[0]
    table = [line for line in text.splitlines() if line.startswith("|")]
    assert 0 < len(table) <= 8
    assert "measured on" in table[0]
    long = [c.strip() for line in table for c in line.strip("|").split("|") if len(c.split()) > 30]
    assert long == []


@pytest.mark.unit
def test_every_relative_link_in_the_docs_leads_to_a_file():
    missing = [
        f"{page.relative_to(ROOT)}: {target}"
        for page in (ROOT / "docs").rglob("*.md")
        for target in LINK.findall(page.read_text())
        if target and "://" not in target and not (page.parent / target).exists()
    ]
    assert missing == []
