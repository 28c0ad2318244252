"""`mlgo demo`'s loop on one recipe, after its corpus and traces are recorded: train briefly
from the shipped policy, keep what is smallest on the corpus (`tune.choose_policy`), build the
program twice (plain clang, and `mlgo-cc` with that policy), run its tests and its workload
on both, and report size and throughput side by side (report.json, report.html with plots
and a table). The stages are `mlgo tune`'s (mlgo.programs.tune), but the demo records its
corpus with `mlgo corpus build` (the recipe's Debian build, modules named as in every other
recipe corpus) and fetches its source with apt."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from mlgo.corpus.extract import BuildError, Recipe
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import get_problem
from mlgo.programs.compare import compare_programs
from mlgo.programs.report import write_report
from mlgo.programs.tune import UNTIL_BUDGET, choose_policy, export

PROBLEM = "inlining-size"


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    minutes: float = 2.0  # of training from the shipped policy; 0: the shipped policy as is
    train_steps: int = 0  # stop after this many iterations as well (0: only the minutes)
    bench_rounds: int = 10  # paired ABBA rounds of the workload
    bench_seconds: float = 1.0  # CPU seconds per timed sample (the workload loops to it)


def run_demo(
    recipe: Recipe,
    corpus_dir: Path,
    shipped: Path,
    out: Path,
    tc: Toolchain,
    opts: DemoOptions,
    say: Callable[[str], None] = print,
) -> dict:
    """The loop after collection (see the module doc); writes OUT/report.json and
    report.html, and returns the report. A failing build or test stops with its log."""
    problem = get_problem(PROBLEM)
    steps = (opts.train_steps or UNTIL_BUDGET) if opts.minutes else 0
    say(f"training from {shipped} for {opts.minutes:g} minutes")
    chosen, training = choose_policy(
        corpus_dir, problem, shipped, out, tc, steps, 60 * opts.minutes
    )
    policy = export(chosen, out)
    say(f"building {recipe.name} twice (clang -Oz, and mlgo-cc with {policy}), with its tests")
    if recipe.bench:
        say(f"then measuring its workload on both ({opts.bench_rounds} paired rounds)")
    built = compare_programs(
        [recipe],
        [policy],
        out / "programs",
        tc,
        bench_rounds=opts.bench_rounds,
        bench_seconds=opts.bench_seconds,
    )
    if built.failed:
        raise BuildError(built.failed[recipe.name])
    report = dict(built.reports[recipe.name], training=training)
    write_report(report, out)
    return report
