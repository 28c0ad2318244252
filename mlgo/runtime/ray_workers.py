"""The Ray backend of `mlgo.runtime.workers`: the same tasks, on every core of a Ray cluster.

Selected with `--workers ray` (the running cluster, else a new one on this machine) or a
Ray address; `ray` is imported only then. Each node needs mlgo and the same clang.

A task's input file (a `ShippedFile`, such as a corpus module's bitcode) is on the driver,
which other nodes may not see. Its bytes are put in Ray's object store once per
`RayWorkers` (a trainer's thousands of tasks share it) and the task carries a reference,
not the bytes; a node fetches a file the first time one of its workers needs it and keeps
it in a content-addressed cache (`mlgo.runtime.files.content_cached`: private to the user,
each file's hash checked before it is used), so the task reads the same content at a
node-local path.

Faults: a task whose worker or node dies is re-run elsewhere by Ray (`RETRIES` times);
an exception inside a task is caught in the worker (`guarded`) and comes back once as
`Failed`, never retried, since a module that fails to compile fails every time.

Stalls: Ray waits without end for a session a head never starts and for tasks nothing
runs, so both have deadlines here and end the run with a one-line error that names them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import socket
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Any

from mlgo.errors import UsageError
from mlgo.runtime.files import content_cached
from mlgo.runtime.messages import error_line
from mlgo.runtime.tasks import Failed, ShippedFile, guarded, shipped_field

try:
    import ray
    from ray.exceptions import NodeDiedError, ObjectLostError, OutOfMemoryError, WorkerCrashedError
except ImportError as e:  # a user error: the optional extra is not installed
    raise UsageError("--workers ray needs Ray: pip install 'mlgo[ray]'") from e

RETRIES = 3
# A task that still has no worker after its retries comes back Failed; other Ray errors
# (the driver lost its cluster) stop the run.
_LOST = (WorkerCrashedError, NodeDiedError, ObjectLostError, OutOfMemoryError)
# A head starts a client's session in seconds, a loaded one in a minute.
SESSION_TIMEOUT_S = 120.0
# Beyond a task's own timeout: worker start-up, bitcode fetch, a busy scheduler.
STALL_MARGIN_S = 300.0
UNTIMED_TASK_S = 900.0  # a task that declares no `timeout_s`


@dataclasses.dataclass(frozen=True)
class _Bitcode:
    """A shipped file's bytes in the object store; the reference sits in a list so that Ray
    hands it to the task unresolved and a node with a cached copy never fetches it."""

    digest: str
    ref: list


def _local_copy(bitcode: _Bitcode) -> Path:
    return content_cached("ray-bitcode", bitcode.digest, ".bc", lambda: ray.get(bitcode.ref[0]))


@ray.remote(max_retries=RETRIES, retry_exceptions=False)
def _run(fn: Callable[[Any], Any], item: Any, bitcode: _Bitcode | None) -> Any:
    shipped = shipped_field(item)
    if bitcode is not None and shipped is not None:
        field, value = shipped
        item = dataclasses.replace(item, **{field: value.at(_local_copy(bitcode))})
    return guarded(fn, item)


def _task_deadline(item: Any) -> float:
    """How long a task may run: its own timeout, if it declares one."""
    return float(getattr(item, "timeout_s", UNTIMED_TASK_S)) + STALL_MARGIN_S


def _check_reachable(address: str) -> None:
    """Ray retries an unreachable address for minutes; a user should hear at once."""
    host, port = address.removeprefix("ray://").rsplit(":", 1)
    try:
        socket.create_connection((host, int(port)), timeout=10).close()
    except OSError as e:
        raise UsageError(f"cannot reach a Ray cluster at {address}: {e}") from e


def _init(address: str | None) -> None:
    ray.init(address=address, logging_level="WARNING", configure_logging=False)


def _init_client(address: str, timeout_s: float) -> None:
    """Ray Client waits forever for a session that a head accepted but never starts (its
    client server stuck starting the per-client server); give up after TIMEOUT_S. The
    waiting thread is a daemon, so nothing of it outlives mlgo."""
    failure: list[BaseException] = []
    # Off the main thread Ray leaves SIGTERM alone and warns; a client has no local
    # processes for its handler to clean up.
    logging.getLogger("ray._private.worker").addFilter(
        lambda record: "SIGTERM handler" not in record.getMessage()
    )

    def connect() -> None:
        try:
            _init(address)
        except BaseException as e:  # re-raised in the caller's thread
            failure.append(e)

    thread = threading.Thread(target=connect, name="ray-client-connect", daemon=True)
    thread.start()
    thread.join(timeout_s)
    if thread.is_alive():
        raise TimeoutError(
            f"the Ray cluster at {address} took the connection but started no session in "
            f"{timeout_s:g} s (see ray_client_server*.err in its head's Ray logs)"
        )
    if failure:
        raise failure[0]


class RayWorkers:
    """`Workers` on a Ray cluster: `address` None joins the running cluster (or starts one
    on this machine), else `ray://HOST:PORT` (Ray Client) or `HOST:PORT`."""

    def __init__(self, address: str | None = None, session_timeout_s: float = SESSION_TIMEOUT_S):
        if address:
            _check_reachable(address)
        # Ray lowers its workers' CPU priority by default; a Ray that mlgo starts itself
        # runs compiles at the driver's priority, as the local pool does. A cluster
        # started with `ray start` keeps its own setting.
        os.environ.setdefault("RAY_worker_niceness", "0")
        try:
            if address and address.startswith("ray://"):
                _init_client(address, session_timeout_s)
            else:
                _init(address)
        except (ConnectionError, RuntimeError) as e:
            where = address or "the local Ray cluster"
            raise UsageError(f"cannot reach {where}: {error_line(e)}") from e
        self._bitcode: dict[tuple[str, int, int], _Bitcode] = {}

    def _ship(self, shipped: ShippedFile) -> _Bitcode:
        st = shipped.path.stat()
        key = (str(shipped.path), st.st_size, st.st_mtime_ns)
        if key not in self._bitcode:
            data = shipped.path.read_bytes()
            self._bitcode[key] = _Bitcode(hashlib.sha256(data).hexdigest(), [ray.put(data)])
        return self._bitcode[key]

    def _submit(self, fn_ref: Any, item: Any) -> Any:
        shipped = shipped_field(item)
        return _run.remote(fn_ref, item, self._ship(shipped[1]) if shipped else None)

    def imap(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        items = list(items)
        if not items:
            return
        fn_ref = ray.put(fn)
        # Twice the cluster's cores in flight: every worker busy, results stream back.
        cpus = int(ray.cluster_resources().get("CPU", 0))
        window = 2 * max(1, cpus)
        pending = iter(items)
        running = {}
        for item in pending:
            running[self._submit(fn_ref, item)] = item
            if len(running) >= window:
                break
        while running:
            stall_s = max(map(_task_deadline, running.values()))
            done, _ = ray.wait(list(running), num_returns=1, timeout=stall_s)
            if not done:
                raise TimeoutError(
                    f"no Ray task finished in {stall_s:g} s ({len(running)} waiting, on a "
                    f"cluster of {cpus} CPUs): its workers are stuck or none is free for them"
                )
            for ref in done:
                item = running.pop(ref)
                try:
                    result = ray.get(ref)
                except _LOST as e:
                    shipped = shipped_field(item)
                    who = f"{shipped[1].name}: " if shipped else ""
                    result = Failed(f"{who}Ray worker lost {RETRIES + 1} times ({error_line(e)})")
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
