"""A build's commands, run with their output appended to its log: what `mlgo corpus build`,
`mlgo corpus record` and the throughput measurements share, so that a failing step is one
line naming the log, wherever it ran.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

from mlgo.errors import MlgoError
from mlgo.runtime.messages import error_line, writing


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
        try:
            proc = subprocess.run(
                cmd,
                cwd=cwd,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=env,
                shell=isinstance(cmd, str),
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as e:
            raise BuildError(f"{what or cmd} timed out after {timeout_s:g} s (log: {log})") from e
    if proc.returncode != 0:
        output = log.read_bytes()[start:].decode(errors="replace")
        raise BuildError(f"{what or cmd} failed ({error_line(output, 200)}; log: {log})")
