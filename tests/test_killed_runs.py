"""A killed run's FIFO directories go at the next start (issue 19, item 15)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from mlgo.llvm import channel
from tests.cli_helpers import mlgo

HOLD_CHANNEL = (
    "import sys, time\n"
    "from mlgo.llvm.channel import fifo_pair\n"
    "with fifo_pair() as base:\n"
    "    print(base, flush=True)\n"
    "    time.sleep(600)\n"
)


def _hold_channel(env: dict[str, str]) -> tuple[subprocess.Popen, Path]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_CHANNEL], stdout=subprocess.PIPE, text=True, env=env
    )
    assert proc.stdout is not None
    return proc, Path(proc.stdout.readline().strip())


@pytest.mark.slow
def test_a_killed_runs_fifos_are_removed_by_the_next_run(mini_corpus, tmp_path):
    env = dict(os.environ, TMPDIR=str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    killed, killed_base = _hold_channel(env)
    live, live_base = _hold_channel(env)
    try:
        killed.send_signal(signal.SIGKILL)
        killed.wait()
        assert Path(f"{killed_base}.in").exists()  # SIGKILL: nothing could clean up
        r = mlgo("collect", "--problem", "inlining-size", "--corpus", str(mini_corpus.root),
                 "--out", str(tmp_path / "t"), "--workers", "2", env=env)  # fmt: skip
        assert r.returncode == 0, r.stderr
        assert not killed_base.parent.parent.exists()  # the killed run's whole directory
        assert Path(f"{live_base}.in").exists()  # a live run's channel is left alone
        runs = list((tmp_path / "tmp" / f"mlgo-{os.getuid()}").iterdir())
        assert runs == [live_base.parent.parent]  # collect removed its own on exit
    finally:
        live.kill()
        live.wait()


def test_a_run_directory_a_sibling_swept_first_is_skipped(tmp_path, monkeypatch):
    """Parallel workers start together and sweep the same dead run: the loser of that race
    finds its lock gone between listing and opening it, and must carry on."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(channel, "_run_dirs", {})
    root = tmp_path / f"mlgo-{os.getuid()}"
    root.mkdir(mode=0o700)
    (root / "run-dead").mkdir()
    (root / "run-dead" / "lock").touch()
    listed = Path.glob

    def sibling_sweeps_between(self: Path, pattern: str):
        for found in list(listed(self, pattern)):
            shutil.rmtree(found.parent)
            yield found

    monkeypatch.setattr(Path, "glob", sibling_sweeps_between)
    mine = channel.run_dir()
    assert [p.name for p in root.iterdir()] == [mine.name]
