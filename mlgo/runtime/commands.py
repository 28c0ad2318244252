"""A build's commands, run with their output appended to its log: what `mlgo corpus build`,
`mlgo corpus record` and the throughput measurements share, so that a failing step is one
line naming the log, wherever it ran. Each runs in a process group of its own, killed
whole once it ends: a user's shell line that leaves children in the background
(`server & ./tests`) leaves none running after mlgo.
"""

from __future__ import annotations

import os
import resource
import select
import shlex
import signal
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from mlgo.errors import MlgoError
from mlgo.runtime.messages import error_line, writing

WAKE_S = 0.5  # the longest a wait for a command goes without running signal handlers


class BuildError(MlgoError):
    """A package or a recorded build could not be fetched, built or extracted; the message
    is one line."""


def run_logged(
    cmd: list[str] | str,
    cwd: Path,
    log: Path,
    timeout_s: float | None,
    env: dict[str, str] | None = None,
    what: str = "",
) -> None:
    """Runs CMD (a shell line if a string) with its output appended to LOG; a failure or
    timeout is a BuildError naming WHAT and the line of this command's output that says why
    (not the `$ CMD` line logged before it: a command is not its error)."""
    with open(log, "a", errors="surrogateescape") as f:  # a file name need not be UTF-8
        with writing(log):
            f.write(f"\n$ {cmd if isinstance(cmd, str) else shlex.join(cmd)}\n")
            f.flush()
        start = f.tell()
        returncode, _ = run_grouped(
            cmd, cwd, timeout_s, stdout=f, stderr=subprocess.STDOUT, env=env
        )
        if returncode is None:
            raise BuildError(f"{what or cmd} timed out after {timeout_s:g} s (log: {log})")
    if returncode != 0:
        output = log.read_bytes()[start:].decode(errors="replace")
        raise BuildError(f"{what or cmd} failed ({error_line(output, 200)}; log: {log})")


def run_grouped(
    cmd: Sequence[str] | str, cwd: Path, timeout_s: float | None, **popen: Any
) -> tuple[int | None, resource.struct_rusage]:
    """CMD (a shell line if a string) run in CWD in a process group of its own, waited on
    for at most TIMEOUT_S (None: no limit): its exit code (None past the timeout) and rusage
    (as `wait4` reaps it). However it ends, by exit, timeout or an exception in this process
    (Ctrl-C, SIGTERM's SystemExit), the whole group is killed: children it left running in
    the background, or that hold a pipe open, go with it."""
    shell = isinstance(cmd, str)
    proc = subprocess.Popen(
        cmd, cwd=cwd, stdin=subprocess.DEVNULL, process_group=0, shell=shell, **popen
    )
    pidfd, finished = os.pidfd_open(proc.pid), False
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    try:
        # In slices: a signal the kernel gave another of this process's threads (Ctrl-C)
        # wakes no select here, and Python runs its handler when the slice ends.
        while not finished:
            left = WAKE_S if deadline is None else min(WAKE_S, deadline - time.monotonic())
            if left <= 0:
                break
            finished = bool(select.select([pidfd], [], [], left)[0])
    finally:
        os.close(pidfd)
        # Its leader is not reaped yet (at most a zombie), so the group's id is still its own.
        os.killpg(proc.pid, signal.SIGKILL)
        _, status, usage = os.wait4(proc.pid, 0)
        proc.returncode = os.waitstatus_to_exitcode(status)
    return (proc.returncode if finished else None), usage
