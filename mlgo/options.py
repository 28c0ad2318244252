"""Checks of command-line values that typer's `min=` cannot express, so that a bad value
fails at parse time (exit 2, one line) rather than running nothing or failing every module."""

from __future__ import annotations

import math

import typer

from mlgo.runtime.workers import parse_workers

# No duration, scale or step here means more than this; past it, arithmetic on it (minutes
# to seconds, a deadline) overflows or stops meaning anything.
LARGEST = 1e9


def _bounded(value: float, ok: bool, rule: str) -> float:
    if not (ok and math.isfinite(value) and value <= LARGEST):  # also refuses NaN and inf
        raise typer.BadParameter(f"{value:g} is not a number {rule} and at most {LARGEST:g}")
    return value


def positive(value: float) -> float:
    """A duration or step size: zero or less would fail or do nothing."""
    return _bounded(value, value > 0, "> 0")


def non_negative(value: float) -> float:
    return _bounded(value, value >= 0, ">= 0")


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
