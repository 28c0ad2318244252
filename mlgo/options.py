"""Checks of command-line values that typer's `min=` cannot express, so that a bad value
fails at parse time (exit 2, one line) rather than running nothing or failing every module."""

from __future__ import annotations

import math
import os
from collections.abc import Callable

import typer

from mlgo.runtime.workers import parse_workers

# No duration, scale or step here means more than this; past it, arithmetic on it (minutes
# to seconds, a deadline) overflows or stops meaning anything.
LARGEST = 1e9
# The sane maxima of what a run counts or waits for: past them a value is a typo or an attack
# (`--bench-rounds 100000000` ran until killed), not a run anyone waits for.
MOST_STEPS = 1_000_000  # a trainer's steps, epochs or iterations
MOST_MINUTES = 7 * 24 * 60.0  # a budget of training: a week
MOST_SECONDS = 24 * 3600.0  # a timeout: a day
MOST_ROUNDS = 1_000  # timing rounds, relinks of a build
MOST_PER_STEP = 10_000  # modules, perturbations or compiles in one step of a trainer
MOST_UNITS = 4_096  # a network's or an embedding's width
# Local worker processes per core: more only wait on each other and take memory each.
WORKERS_PER_CORE = 4


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


def positive_up_to(high: float, zero: bool = False) -> Callable[[float], float]:
    """`positive` (or with ZERO, `non_negative`), for an option with a bound of its own below
    LARGEST (a value past it would run for days, not fail)."""

    def check(value: float) -> float:
        return _in_range(value, 0, high, low_too=zero)

    return check


def workers_spec(value: str) -> str:
    """--workers as `parse_workers` reads it, and a process count at most WORKERS_PER_CORE
    per core: `--workers 100000` started an interpreter per module."""
    try:
        kind, processes = parse_workers(value)
    except ValueError as e:
        raise typer.BadParameter(str(e)) from e
    cores = os.cpu_count() or 1
    if kind == "local" and isinstance(processes, int) and processes > WORKERS_PER_CORE * cores:
        raise typer.BadParameter(
            f"{processes} processes: at most {WORKERS_PER_CORE * cores} "
            f"({WORKERS_PER_CORE} per core, {cores} here)"
        )
    return value


OPT_LEVELS = ("-O0", "-O1", "-O2", "-O3", "-Os", "-Oz")


def opt_level(value: str) -> str:
    """A level clang has: a corpus recorded at another would be refused by every problem."""
    if value not in OPT_LEVELS:
        raise typer.BadParameter(f"{value!r} is not one of -O0..-O3, -Os, -Oz")
    return value
