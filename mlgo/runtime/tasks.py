"""What a task is to the workers that run it, whatever backend runs them.

A task's exception is caught in the worker and comes back as a `Failed` value, so one bad
input never stops a run; only the backend itself breaking is fatal. Backends implement
`Workers` and know nothing of what a task computes; a task that reads a file a remote
worker may not see carries it as a `ShippedFile`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol, runtime_checkable


@dataclass(frozen=True)
class Failed:
    message: str


def guarded(fn: Callable[[Any], Any], item: Any) -> Any:
    try:
        return fn(item)
    except Exception as e:  # reported to the driver, which decides what to do
        return Failed(str(e).splitlines()[0] if str(e) else type(e).__name__)


class Workers(Protocol):
    def imap(self, fn: Callable[[Any], Any], items: Iterable[Any]) -> Iterator[tuple[Any, Any]]:
        """Yields (item, result or Failed) as tasks finish, in any order, each item once."""
        ...

    def close(self) -> None:
        """Releases the workers (processes, cluster connection)."""
        ...


@runtime_checkable
class ShippedFile(Protocol):
    """A task input whose bytes sit in one file on the driver (a corpus module's bitcode).
    A backend whose workers may not see the driver's files sends the bytes and hands the
    task the same input at a worker-local path."""

    name: str

    @property
    def path(self) -> Path: ...

    def at(self, path: Path) -> ShippedFile: ...


def shipped_field(item: Any) -> tuple[str, ShippedFile] | None:
    """The (field name, value) of a dataclass task's shipped input, if it has one."""
    if not dataclasses.is_dataclass(item):
        return None
    for f in dataclasses.fields(item):
        value = getattr(item, f.name)
        if isinstance(value, ShippedFile):
            return f.name, value
    return None
