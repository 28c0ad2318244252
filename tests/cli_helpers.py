"""What the bad-input tests share: `mlgo` as a user runs it, with an environment, and the
check that a failure is one line."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from tests.conftest import MLGO

POLICIES = Path(__file__).parent.parent / "policies"


def mlgo(*args: str, env: dict[str, str] | None = None, timeout: float = 300):
    return subprocess.run(
        [*MLGO, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=dict(os.environ, **(env or {})),
    )


def one_line_error(r: subprocess.CompletedProcess, *fragments: str, code: int = 2) -> None:
    """The process failed with CODE and said why on one stderr line holding FRAGMENTS."""
    lines = r.stderr.strip().splitlines()
    assert r.returncode == code and len(lines) == 1, r.stderr
    assert lines[0].startswith("error:") and "Traceback" not in r.stderr
    for f in fragments:
        assert f in lines[0], lines[0]


def user_cache(tmp_path: Path) -> dict[str, str]:
    """The environment of a private user cache, so that what a command caches is seen
    (and not shared)."""
    return {"XDG_CACHE_HOME": str(tmp_path / "cache")}
