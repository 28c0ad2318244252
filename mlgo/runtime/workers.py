"""Where tasks run. The local process pool is the default; the Ray backend
(`mlgo/runtime/ray_workers.py`) runs the same tasks on a cluster, behind the same `imap`
(`mlgo/runtime/tasks.py` is what both agree on). `make_workers` picks one from `--workers`.
"""

from __future__ import annotations

import multiprocessing
import os
import re
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Any

from mlgo.errors import UsageError
from mlgo.runtime.lifetime import die_with_parent
from mlgo.runtime.tasks import Failed, Workers, guarded

__all__ = ["WORKERS_HELP", "Failed", "LocalPool", "Workers", "make_workers"]


class LocalPool:
    """A process pool on this machine; `spawn` keeps workers free of the driver's threads.
    The processes start on the first `imap` and live until `close`, so a trainer's many
    small batches do not pay for starting them each time."""

    def __init__(self, processes: int | None = None):
        self.processes = processes or os.cpu_count() or 1
        self._pool: ProcessPoolExecutor | None = None

    def imap(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        items = list(items)
        if not items:
            return
        if self._pool is None:
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(
                self.processes, mp_context=ctx, initializer=die_with_parent
            )
        pool = self._pool
        # Keep a bounded window in flight so results stream back as they finish.
        pending = iter(items)
        running: dict[Future, Any] = {}
        for item in pending:
            running[pool.submit(guarded, fn, item)] = item
            if len(running) >= 2 * self.processes:
                break
        while running:
            done, _ = wait(running, return_when=FIRST_COMPLETED)
            for fut in done:
                item = running.pop(fut)
                yield item, fut.result()
                nxt = next(pending, None)
                if nxt is not None:
                    running[pool.submit(guarded, fn, nxt)] = nxt

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(cancel_futures=True)
            self._pool = None

    def __enter__(self) -> LocalPool:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


_ADDRESS = re.compile(r"^(ray://)?[\w.-]+:\d+$")
WORKERS_HELP = (
    "'local' (a process per core), a process count, 'ray' (the running Ray cluster, "
    "else a new one on this machine), or a Ray address (ray://HOST:PORT or HOST:PORT)"
)


def parse_workers(spec: str | int | None) -> tuple[str, int | str | None]:
    """The one place `--workers` is parsed (see WORKERS_HELP): ("local", processes or
    None) or ("ray", address or None)."""
    if spec in (None, "", "local"):
        return "local", None
    if isinstance(spec, int) or str(spec).isdigit():
        if int(spec) < 1:
            raise UsageError(f"--workers {spec}: need at least one process")
        return "local", int(spec)
    if spec == "ray" or _ADDRESS.match(str(spec)):
        return "ray", None if spec == "ray" else str(spec)
    raise UsageError(f"--workers {spec!r}: {WORKERS_HELP}")


def make_workers(spec: str | int | None) -> Workers:
    kind, arg = parse_workers(spec)
    if kind == "local":
        return LocalPool(arg if isinstance(arg, int) else None)
    from mlgo.runtime.ray_workers import RayWorkers

    return RayWorkers(arg if isinstance(arg, str) else None)
