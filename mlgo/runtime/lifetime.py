"""Child processes that end with their parent: a SIGKILLed `mlgo` must not leave pool
workers behind, nor a clang waiting forever on a channel nobody will answer."""

from __future__ import annotations

import ctypes
import os
import signal
from collections.abc import Callable
from functools import cache

from mlgo.runtime.trust import path_problem

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Asks Linux to SIGKILL this process when its parent exits (as a pool initializer or
    a Popen preexec_fn)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)


# util-linux's, on every Debian: sets the death signal, then execs the command.
SETPRIV = "/usr/bin/setpriv"


@cache
def _setpriv_trusted() -> bool:
    return os.access(SETPRIV, os.X_OK) and path_problem(SETPRIV, own=False) is None


def dying_with_parent(cmd: list[str]) -> tuple[list[str], Callable[[], None] | None]:
    """CMD to start, and the preexec_fn to start it with, so that it is SIGKILLed when
    this thread exits: through the system's setpriv where no other user could have
    changed it, which lets Python vfork, else `die_with_parent` run in a fork (a fork
    copies this process's page tables: 3 ms of CPU a compile at 55 MB, 10 ms at 550 MB)."""
    if _setpriv_trusted():
        return [SETPRIV, "--pdeathsig", "KILL", "--", *cmd], None
    return cmd, die_with_parent
