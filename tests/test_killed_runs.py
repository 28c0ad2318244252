"""A killed run's FIFO directories go at the next start (issue 19, item 15)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
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


def _gone(pid: int) -> bool:
    """PID has exited (a zombie nobody reaped yet counts)."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except FileNotFoundError:
        return True


def test_a_killed_worker_takes_the_compiler_it_started_with_it(tmp_path):
    # a compiler that never opens its channel, so that only its death signal can end it
    pid_file = tmp_path / "pid"
    worker = subprocess.Popen(
        [sys.executable, "-c",
         "import sys\n"
         "from mlgo.llvm.channel import compile_interactive\n"
         f"compile_interactive(['sh', '-c', 'echo $$ > {pid_file}; exec sleep 120'],"
         " lambda obs: 0, lambda base: [], 300)\n"],
    )  # fmt: skip
    try:
        for _ in range(200):
            if pid_file.exists() and pid_file.read_text().strip():
                break
            time.sleep(0.05)
        compiler = int(pid_file.read_text())
        assert not _gone(compiler)
    finally:
        worker.kill()
        worker.wait()
    for _ in range(100):
        if _gone(compiler):
            break
        time.sleep(0.05)
    left = not _gone(compiler)
    if left:
        os.kill(compiler, signal.SIGKILL)
    assert not left
