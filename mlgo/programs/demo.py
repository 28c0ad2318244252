"""`mlgo demo`'s loop on one recipe: record its corpus and traces (`record_demo_corpus`),
train briefly from the shipped policy, keep what is smallest on the corpus
(`tune.choose_policy`), build the program twice (plain clang, and `mlgo-cc` with that
policy), run its tests and its workload on both, and report size and throughput side by
side (report.json, report.html with plots and a table). The stages are `mlgo tune`'s
(mlgo.programs.tune), but the demo records its corpus as `mlgo corpus build` does (the
recipe's Debian build, modules named as in every other recipe corpus)."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from mlgo.corpus.extract import combine
from mlgo.corpus.format import load_corpus
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.build import extract_package
from mlgo.packages.recipes import Recipe
from mlgo.problems import get_problem
from mlgo.programs.compare import compare_programs
from mlgo.programs.report import write_report
from mlgo.programs.tune import UNTIL_BUDGET, choose_policy, export
from mlgo.runtime.commands import BuildError
from mlgo.runtime.files import output_dir
from mlgo.runtime.workers import make_workers
from mlgo.traces.collect import collect

PROBLEM = "inlining-size"


@dataclass(frozen=True, kw_only=True)
class DemoOptions:
    minutes: float = 2.0  # of training from the shipped policy; 0: the shipped policy as is
    train_steps: int = 0  # stop after this many iterations as well (0: only the minutes)
    bench_rounds: int = 10  # paired ABBA rounds of the workload
    bench_seconds: float = 1.0  # CPU seconds per timed sample (the workload loops to it)


def record_demo_corpus(
    recipe: Recipe, out: Path, tc: Toolchain, say: Callable[[str], None] = print
) -> Path:
    """RECIPE's corpus in OUT/corpus, built from its Debian source in OUT/build as `mlgo
    corpus build` builds it (a finished build is reused), and its default inlining decisions
    in OUT/traces, as `mlgo collect` collects them. Returns the corpus directory."""
    corpus_dir = out / "corpus"
    with output_dir(corpus_dir):
        built = extract_package(recipe, tc, corpus_dir, out / "build" / recipe.name, "-Oz")
        combine(corpus_dir)
    say(f"{'reused' if built.reused else 'built'} {recipe.name}: {built.modules} modules")
    with closing(make_workers("local")) as pool:
        manifest = collect(get_problem(PROBLEM), load_corpus(corpus_dir), out / "traces", tc, pool)
    if manifest.failed:
        name, why = next(iter(manifest.failed.items()))
        raise BuildError(f"{len(manifest.failed)} modules failed to compile; first {name}: {why}")
    decisions = sum(m["decisions"] for m in manifest.modules.values())
    say(f"{out / 'traces'}: {len(manifest.modules)} modules, {decisions:,} decisions")
    return corpus_dir


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
