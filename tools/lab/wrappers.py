"""What the wrapper benchmarks share (tools/bench_wrapper.py for the native mlgo-cc,
tools/bench_decisions_wrapper.py for a decisions directory's cc): a compile's CPU, shuffled
rounds of every source through every wrapper, and the table of each wrapper's change
against the baseline with its A/A control."""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
from collections.abc import Callable
from pathlib import Path

from rich.table import Table

from mlgo.programs.measure import paired_change

# One compile of SOURCE through WRAPPER, its CPU seconds; QUIET: a word on stderr is a failure.
Compile = Callable[[Path, Path, bool], float]


def wrapper_arguments(doc: str) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", required=True, help="git revision of the wrapper to compare")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    return ap.parse_args()


def compile_cpu_s(
    command: list[str], cwd: Path | None = None, env: dict[str, str] | None = None,
    quiet: bool = True,
) -> float:  # fmt: skip
    """CPU seconds of COMMAND, a compile through a wrapper, wrapper and compiler together
    (wait4's rusage); a failure, or with QUIET any word on stderr, is an error."""
    proc = subprocess.Popen(command, cwd=cwd, env=env, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    code = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read() if proc.stderr else b""
    if code != 0 or (quiet and stderr):
        raise RuntimeError(f"{command[0]} on {command[3]}: exit {code}: {stderr[:300]!r}")
    return usage.ru_utime + usage.ru_stime


def cpu_rounds(
    wrappers: dict[str, Path], sources: list[Path], n: int, seed: int, compile_one: Compile
) -> list[dict[str, float]]:
    """Each wrapper warmed up once (not counted, its notes allowed), then N rounds, each
    every source through every wrapper in a shuffled order: CPU seconds by wrapper."""
    rng, rounds = random.Random(seed), []
    for wrapper in wrappers.values():
        compile_one(wrapper, sources[0], False)
    for _ in range(n):
        order = list(wrappers)
        rng.shuffle(order)
        cpu = dict.fromkeys(wrappers, 0.0)
        for source in sources:
            for name in order:
                cpu[name] += compile_one(wrappers[name], source, True)
        rounds.append(cpu)
    return rounds


def changes(rounds: list[dict[str, float]], name: str) -> tuple[float, float, float]:
    """Median, first and third quartile of NAME's per-round change against the baseline, %."""
    change = paired_change([r[name] for r in rounds], [r["baseline"] for r in rounds])
    return 100 * change["median"], 100 * change["q1"], 100 * change["q3"]


def wrapper_table(title: str, rounds: list[dict[str, float]], sources: int) -> Table:
    """Each wrapper's median CPU per compile and, but the baseline's, its change (IQR)."""
    table = Table(title=title)
    for column in ("wrapper", "ms per compile (median)", "change (median)", "IQR"):
        table.add_column(column)
    for name in rounds[0]:
        per_compile = statistics.median(r[name] for r in rounds) / sources * 1e3
        if name == "baseline":
            table.add_row(name, f"{per_compile:.1f}", "", "")
            continue
        median, q1, q3 = changes(rounds, name)
        table.add_row(name, f"{per_compile:.1f}", f"{median:+.2f}%", f"{q1:+.2f}..{q3:+.2f}%")
    return table
