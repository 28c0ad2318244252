"""Checks of command-line values that typer's `min=` cannot express, so that a bad value
fails at parse time (exit 2, one line) rather than running nothing or failing every module."""

from __future__ import annotations

import typer

from mlgo.runtime.workers import parse_workers


def positive(value: float) -> float:
    """A duration or step size: zero or less would fail or do nothing."""
    if not value > 0:  # also refuses NaN
        raise typer.BadParameter(f"{value:g} is not > 0")
    return value


def non_negative(value: float) -> float:
    if not value >= 0:
        raise typer.BadParameter(f"{value:g} is not >= 0")
    return value


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
