"""How a trainer declares what a user may set: a field of its config dataclass whose metadata
is `option(...)`, its type and default the field's. The registry gathers every registered
trainer's (`registry.options`), and `mlgo train`'s flags and the names `run` takes are drawn
from those, so that a trainer's knob is written once, in its own module. The config's other
fields are the trainer's own choices; its `steps`, `max_seconds` and `init` are the run's
(`run.TrainOptions`)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import MISSING, dataclass, fields
from typing import Any, get_type_hints

_KEY = "mlgo.option"


@dataclass(frozen=True)
class Option:
    """One option as `mlgo train` shows and checks it."""

    name: str
    type: type
    default: Any
    help: str
    min: int | None = None  # the least whole number it takes
    max: int | None = None  # the most
    check: Callable[[float], float] | None = None  # a number's parse-time check (mlgo.options)


def option(
    help: str,
    *,
    min: int | None = None,
    max: int | None = None,
    check: Callable[[float], float] | None = None,
) -> dict[str, Any]:
    """The metadata of a config field a user may set: `field(default=D, metadata=option(...))`."""
    return {_KEY: (help, min, max, check)}


def declared(config: type) -> dict[str, Option]:
    """The options CONFIG's fields declare, by name, in the fields' order."""
    hints = get_type_hints(config)
    found = {}
    for f in fields(config):
        if _KEY in f.metadata:
            assert f.default is not MISSING, f"{config.__name__}.{f.name}: an option has a default"
            found[f.name] = Option(f.name, hints[f.name], f.default, *f.metadata[_KEY])
    return found
