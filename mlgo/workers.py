"""Where compilations run. The local process pool is the default; anything with the same
`imap` (e.g. a Ray backend) can stand in for it.

A task's exception is caught in the worker and comes back as a `Failed` value, so one bad
module never stops a run; only the pool itself breaking is fatal.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from dataclasses import dataclass
from typing import Any, Protocol


@dataclass(frozen=True)
class Failed:
    message: str


def _guarded(fn: Callable[[Any], Any], item: Any) -> Any:
    try:
        return fn(item)
    except Exception as e:  # reported to the driver, which decides what to do
        return Failed(str(e).splitlines()[0] if str(e) else type(e).__name__)


class Workers(Protocol):
    def imap(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        """Yields (item, result or Failed) as tasks finish, in any order."""
        ...


class LocalPool:
    """A process pool on this machine; `spawn` keeps workers free of the driver's threads."""

    def __init__(self, processes: int | None = None):
        self.processes = processes or os.cpu_count() or 1

    def imap(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        items = list(items)
        if not items:
            return
        ctx = multiprocessing.get_context("spawn")
        with ProcessPoolExecutor(self.processes, mp_context=ctx) as pool:
            # Keep a bounded window in flight so results stream back as they finish.
            pending = iter(items)
            running = {}
            for item in pending:
                running[pool.submit(_guarded, fn, item)] = item
                if len(running) >= 2 * self.processes:
                    break
            while running:
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    item = running.pop(fut)
                    yield item, fut.result()
                    nxt = next(pending, None)
                    if nxt is not None:
                        running[pool.submit(_guarded, fn, nxt)] = nxt


def make_workers(spec: str | int | None) -> Workers:
    """`None`/`local`/`N`: a local pool (N processes)."""
    if spec in (None, "", "local"):
        return LocalPool()
    if isinstance(spec, int) or str(spec).isdigit():
        return LocalPool(int(spec))
    raise ValueError(f"unknown workers {spec!r}: use 'local' or a process count")
