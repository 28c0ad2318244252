"""Child processes that end with their parent: a SIGKILLed `mlgo` must not leave pool
workers behind, nor a clang waiting forever on a channel nobody will answer."""

from __future__ import annotations

import ctypes
import signal

PR_SET_PDEATHSIG = 1


def die_with_parent() -> None:
    """Asks Linux to SIGKILL this process when its parent exits (as a pool initializer or
    a Popen preexec_fn)."""
    ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
