"""The Ray backend of `mlgo.workers`: the same tasks, on every core of a Ray cluster.

Selected with `--workers ray` (the running cluster, else a new one on this machine) or a
Ray address; `ray` is imported only then. Each node needs mlgo and the same clang.

Corpus modules are files on the driver, which other nodes may not see. Each module's
bitcode is put in Ray's object store once per `RayWorkers` (a trainer's thousands of tasks
share it) and the task carries a reference, not the bytes; a node fetches a module the
first time one of its workers needs it and keeps it in a content-addressed cache, so the
compile command is the same file content at a node-local path.

Faults: a task whose worker or node dies is re-run elsewhere by Ray (`RETRIES` times);
an exception inside a task is caught in the worker (`guarded`) and comes back once as
`Failed`, never retried, since a module that fails to compile fails every time.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import socket
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from mlgo.corpus import Module
from mlgo.workers import Failed, guarded

try:
    import ray
    from ray.exceptions import NodeDiedError, ObjectLostError, OutOfMemoryError, WorkerCrashedError
except ImportError as e:  # a user error: the optional extra is not installed
    raise ValueError("--workers ray needs Ray: pip install 'mlgo[ray]'") from e

RETRIES = 3
# A task that still has no worker after its retries comes back Failed; other Ray errors
# (the driver lost its cluster) stop the run.
_LOST = (WorkerCrashedError, NodeDiedError, ObjectLostError, OutOfMemoryError)
CACHE_DIR = Path(tempfile.gettempdir()) / "mlgo-ray-bitcode"


@dataclasses.dataclass(frozen=True)
class _Bitcode:
    """A module's bitcode in the object store; the reference sits in a list so that Ray
    hands it to the task unresolved and a node with a cached copy never fetches it."""

    digest: str
    ref: list


def _local_copy(bitcode: _Bitcode) -> Path:
    path = CACHE_DIR / f"{bitcode.digest}.bc"
    if not path.exists():
        CACHE_DIR.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_bytes(ray.get(bitcode.ref[0]))
        tmp.rename(path)  # atomic: concurrent workers on a node write the same bytes
    return path


@ray.remote(max_retries=RETRIES, retry_exceptions=False)
def _run(fn: Callable[[Any], Any], item: Any, bitcode: _Bitcode | None) -> Any:
    if bitcode is not None:
        module = dataclasses.replace(item.module, bitcode=_local_copy(bitcode))
        item = dataclasses.replace(item, module=module)
    return guarded(fn, item)


def _module_of(item: Any) -> Module | None:
    """mlgo's tasks are dataclasses that carry their corpus module as `module`."""
    module = getattr(item, "module", None)
    return module if dataclasses.is_dataclass(item) and isinstance(module, Module) else None


def _check_reachable(address: str) -> None:
    """Ray retries an unreachable address for minutes; a user should hear at once."""
    host, port = address.removeprefix("ray://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as e:
        raise ValueError(f"cannot reach a Ray cluster at {address}: {e}") from e


class RayWorkers:
    """`Workers` on a Ray cluster: `address` None joins the running cluster (or starts one
    on this machine), else `ray://HOST:PORT` (Ray Client) or `HOST:PORT`."""

    def __init__(self, address: str | None = None):
        if address:
            _check_reachable(address)
        # Ray lowers its workers' CPU priority by default; a Ray that mlgo starts itself
        # runs compiles at the driver's priority, as the local pool does. A cluster
        # started with `ray start` keeps its own setting.
        os.environ.setdefault("RAY_worker_niceness", "0")
        try:
            ray.init(address=address, logging_level="WARNING", configure_logging=False)
        except (ConnectionError, RuntimeError) as e:
            where = address or "the local Ray cluster"
            raise ValueError(f"cannot reach {where}: {str(e).splitlines()[0]}") from e
        self._bitcode: dict[tuple[str, int, int], _Bitcode] = {}

    def _ship(self, module: Module) -> _Bitcode:
        st = module.bitcode.stat()
        key = (str(module.bitcode), st.st_size, st.st_mtime_ns)
        if key not in self._bitcode:
            data = module.bitcode.read_bytes()
            self._bitcode[key] = _Bitcode(hashlib.sha256(data).hexdigest(), [ray.put(data)])
        return self._bitcode[key]

    def _submit(self, fn_ref: Any, item: Any) -> Any:
        module = _module_of(item)
        return _run.remote(fn_ref, item, self._ship(module) if module else None)

    def imap(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        items = list(items)
        if not items:
            return
        fn_ref = ray.put(fn)
        # Twice the cluster's cores in flight: every worker busy, results stream back.
        window = 2 * max(1, int(ray.cluster_resources().get("CPU", 1)))
        pending = iter(items)
        running = {}
        for item in pending:
            running[self._submit(fn_ref, item)] = item
            if len(running) >= window:
                break
        while running:
            done, _ = ray.wait(list(running), num_returns=1)
            for ref in done:
                item = running.pop(ref)
                try:
                    result = ray.get(ref)
                except _LOST as e:
                    first = str(e).strip().splitlines()[0] if str(e).strip() else ""
                    module = _module_of(item)
                    who = f"{module.name}: " if module else ""
                    result = Failed(f"{who}Ray worker lost {RETRIES + 1} times ({first})")
                yield item, result
                nxt = next(pending, None)
                if nxt is not None:
                    running[self._submit(fn_ref, nxt)] = nxt

    def close(self) -> None:
        ray.shutdown()

    def __enter__(self) -> RayWorkers:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
