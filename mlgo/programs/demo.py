"""`mlgo demo`: `mlgo tune`'s whole loop (mlgo.programs.tune) on one real Debian package,
run as a new user runs it on their own project: the package's source fetched once into
OUT/source, then recorded, trained on for a few minutes from the shipped policy, built twice
from that source (plain clang, and `mlgo-cc` with what was smallest on its code), tested,
timed and reported in OUT/tune. With `lto`, the inliner of the package's full-LTO link is
tuned, against plain `-Oz -flto` linked by lld."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import Recipe
from mlgo.programs.build import pristine_source
from mlgo.programs.tune import tune
from mlgo.programs.tune_run import TuneOptions

DEMO_PACKAGE = "units"  # in no split: no shipped policy trained on it, as on your code


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    lto: bool = False  # tune the full-LTO link's inliner instead of each file's
    minutes: float = 2.0  # of training from the shipped policy
    train_steps: int = 0  # stop after this many iterations as well (0: only the minutes)
    bench_rounds: int = 10  # paired ABBA rounds of the workload
    # as built only: a size tune's speed is a side figure, and the demo's time is README's
    # (`mlgo tune --layouts` times over shuffled layouts too)
    layouts: int = 0


def run_demo(
    recipe: Recipe, out: Path, tc: Toolchain, opts: DemoOptions, say: Callable[[str], None] = print
) -> dict:
    """The loop of the module doc on RECIPE; returns the report (also OUT/tune/report.json
    and report.html). A rerun reuses the source and resumes the tune."""
    source = pristine_source(recipe, out / "source")
    tuning = TuneOptions(
        problem="inlining-size-link" if opts.lto else "inlining-size",
        minutes=opts.minutes,
        train_steps=opts.train_steps,
        bench_rounds=opts.bench_rounds,
        layouts=opts.layouts,
    )
    return tune(source, recipe, out / "tune", tc, tuning, say)
