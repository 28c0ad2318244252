"""A process and those it started, read from /proc while they run: who they are and how
much memory they hold together (a tune's stage is a build, a pool of compiles, a trainer)."""

from __future__ import annotations

import os
import threading
from pathlib import Path
from types import TracebackType

PAGE = os.sysconf("SC_PAGE_SIZE")


def live_children(pid: int) -> list[int]:
    """PID's live child processes, whichever of its threads started them (each thread
    lists only its own: a service's policy server is the child of a connection thread)."""
    return [
        int(kid)
        for t in Path(f"/proc/{pid}/task").glob("*/children")
        for kid in t.read_text().split()
    ]


def tree_rss(pid: int) -> int:
    """The resident bytes of PID and every live process below it, summed: what they hold
    of the machine's memory together. A process that ends while it is read counts none."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            total += int(Path(f"/proc/{p}/statm").read_text().split()[1]) * PAGE
            todo += live_children(p)
        except (OSError, ValueError, IndexError):
            continue
    return total


class PeakMemory:
    """While entered, the most memory this process and those below it held together
    (`tree_rss`), read every INTERVAL seconds by a thread of its own: a stage's peak, which
    the kernel's peak of a process or of its largest child does not give."""

    def __init__(self, interval: float = 1.0):
        self.interval, self.peak = interval, 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while True:
            self.peak = max(self.peak, tree_rss(os.getpid()))
            if self._stop.wait(self.interval):
                return

    def __enter__(self) -> PeakMemory:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._stop.set()
        self._thread.join()
