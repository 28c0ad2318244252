"""Checks of command-line values that typer's `min=` cannot express, so that a bad value
fails at parse time (exit 2, one line) rather than running nothing or failing every module."""

from __future__ import annotations

import math
from collections.abc import Callable

import typer

from mlgo.runtime.workers import parse_workers

# No duration, scale or step here means more than this; past it, arithmetic on it (minutes
# to seconds, a deadline) overflows or stops meaning anything.
LARGEST = 1e9


def _in_range(value: float, low: float, high: float, low_too: bool) -> float:
    """VALUE if it is a number in (LOW, HIGH], or [LOW, HIGH] with LOW_TOO; else the one
    line typer prints with the option's name (NaN and inf are never in range)."""
    above = value >= low if low_too else value > low
    if not (math.isfinite(value) and above and value <= high):
        interval = f"{'[' if low_too else '('}{low:g}, {high:g}]"
        raise typer.BadParameter(f"{value:g} is not a number in {interval}")
    return value


def positive(value: float) -> float:
    """A duration or step size: zero or less would fail or do nothing."""
    return _in_range(value, 0, LARGEST, low_too=False)


def non_negative(value: float) -> float:
    return _in_range(value, 0, LARGEST, low_too=True)


def positive_up_to(high: float) -> Callable[[float], float]:
    """`positive`, for an option with a bound of its own below LARGEST (a value past it would
    run for days, not fail)."""

    def check(value: float) -> float:
        return _in_range(value, 0, high, low_too=False)

    return check


def workers_spec(value: str) -> str:
    try:
        parse_workers(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    return value


OPT_LEVELS = ("-O0", "-O1", "-O2", "-O3", "-Os", "-Oz")


def opt_level(value: str) -> str:
    """A level clang has: a corpus recorded at another would be refused by every problem."""
    if value not in OPT_LEVELS:
        raise typer.BadParameter(f"{value!r} is not one of -O0..-O3, -Os, -Oz")
    return value
