"""Every script in tools/ still imports and answers --help, and its C peers compile."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

TOOLS = Path(__file__).parents[1] / "tools"
SCRIPTS = sorted(TOOLS.glob("*.py"))
C_SOURCES = sorted(TOOLS.glob("*.c"))


def test_the_tools_are_found():
    assert len(SCRIPTS) >= 8 and len(C_SOURCES) >= 2


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_each_script_answers_help(script):
    r = subprocess.run(
        [sys.executable, str(script), "--help"], capture_output=True, text=True, timeout=60
    )
    assert r.returncode == 0, r.stderr
    assert "usage" in r.stdout.lower()


@pytest.mark.toolchain
@pytest.mark.parametrize("source", C_SOURCES, ids=lambda p: p.name)
def test_each_c_peer_compiles_without_warnings(source, tmp_path):
    # the benchmarks build these with the system's cc, as a user's machine would
    cc = shutil.which("cc")
    assert cc, "no C compiler (cc) on PATH"
    r = subprocess.run(
        [cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / source.stem), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / source.stem).stat().st_size > 0
