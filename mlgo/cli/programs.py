"""`mlgo build`, `mlgo demo` and `mlgo tune`: real programs built with a policy, the main job
on a small default, and the same loop on the user's own code base."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlgo.cli.options import (
    DEFAULT_POLICIES,
    BenchRoundsOpt,
    BenchSecondsOpt,
    ClangOpt,
    LayoutsOpt,
    PoliciesOpt,
    UseFeatureOpt,
    console,
    lto_mode,
    own_output,
    pgo_row_option,
    workers_option,
)
from mlgo.llvm.toolchain import find_toolchain
from mlgo.options import MOST_MINUTES, MOST_ROUNDS, MOST_SECONDS, MOST_STEPS, positive_up_to
from mlgo.packages.recipes import BENCH_TIMEOUT_S
from mlgo.programs.demo import DEMO_PACKAGE, DemoOptions
from mlgo.programs.layouts import LAYOUTS
from mlgo.programs.tune_run import EXPERIMENTS, TuneOptions

BENCH_ROUNDS = 5  # mlgo build: a modest default, a few seconds per package
# A test's knob, not a user's flag: hidden from --help
TrainStepsOpt = Annotated[
    int,
    typer.Option(
        help="stop training after this many iterations; 0: the minutes",
        min=0,
        max=MOST_STEPS,
        hidden=True,
    ),
]


def build(
    packages: Annotated[list[str], typer.Argument(help="recipes, e.g. lua sqlite3 zstd")],
    policy: PoliciesOpt = DEFAULT_POLICIES,
    out: Annotated[
        Path, typer.Option(help="where sources, builds and build.json go", callback=own_output)
    ] = Path("data/programs"),
    tests: Annotated[bool, typer.Option(help="run each package's own tests on both")] = True,
    backend: Annotated[
        str, typer.Option(help="service backend: auto, plugin, native or python")
    ] = "auto",
    guard: Annotated[
        bool,
        typer.Option(help="MLGO_GUARD=size: per file, the smaller of the policy's and -Oz's"),
    ] = False,
    bench_rounds: BenchRoundsOpt = BENCH_ROUNDS,
    bench_seconds: BenchSecondsOpt = 1.0,
    layouts: LayoutsOpt = LAYOUTS,
    lto: Annotated[
        str | None,
        typer.Option(
            help="full or thin: both builds -flto(=thin) by lld (link-time policies)",
            callback=lto_mode,
        ),
    ] = None,
    pgo_row: Annotated[bool, pgo_row_option()] = True,
    clang: ClangOpt = None,
) -> None:
    """Build real programs from their Debian source packages twice, with plain clang and
    with mlgo-cc serving the policies (same -Oz flags), run the package's own tests and
    its workload (if its recipe has one) on both, and compare the linked programs' .text
    and the workload's CPU time. Each package's report.json and report.html go in OUT/<package>."""
    from mlgo.packages.recipes import load_recipe
    from mlgo.problems import at_link, get_problem
    from mlgo.programs.compare import Serving, compare_programs, comparison_table
    from mlgo.programs.measure import Timing
    from mlgo.runtime.commands import BuildError

    tc = find_toolchain(clang)
    recipes = [load_recipe(name) for name in packages]  # a misspelt name fails before any build
    problem = at_link("inlining-size", lto) if lto else get_problem("inlining-size")
    timing = Timing(bench_rounds, bench_seconds, layouts)
    serving = Serving(tests, backend, guard, pgo_row)
    result = compare_programs(recipes, policy, out, tc, problem, timing, serving)
    console.print(comparison_table(result))
    console.print(f"wrote {out / 'build.json'}")
    for error in result.failed.values():
        console.print(f"[red]{error}")
    if result.failed:
        failed = ", ".join(result.failed)
        raise BuildError(f"{len(result.failed)} of {len(packages)} packages failed: {failed}")


def demo(
    out: Annotated[
        Path, typer.Option(help="where the source, corpus, policy, builds go", callback=own_output)
    ] = (Path("data/demo")),
    package: Annotated[str, typer.Option(help="recipe to build")] = DEMO_PACKAGE,
    lto: Annotated[
        bool, typer.Option(help="tune the full-LTO link's inliner (-flto, lld)")
    ] = DemoOptions.lto,
    minutes: Annotated[
        float,
        typer.Option(
            help="minutes of training from the shipped policy",
            callback=positive_up_to(MOST_MINUTES),
        ),
    ] = DemoOptions.minutes,
    train_steps: TrainStepsOpt = DemoOptions.train_steps,
    bench_rounds: Annotated[
        int, typer.Option(help="paired rounds of the recipe's workload", min=1, max=MOST_ROUNDS)
    ] = DemoOptions.bench_rounds,
    clang: ClangOpt = None,
) -> None:
    """`mlgo tune`'s whole loop on one real Debian package, as on your own project: record
    its build, train briefly from the shipped policy, build it twice (plain clang and
    mlgo-cc with what was smallest on its code), run its tests and workload on both, and
    report size and throughput."""
    from mlgo.packages.recipes import load_recipe
    from mlgo.programs.demo import run_demo
    from mlgo.programs.report import report_table, training_line

    recipe = load_recipe(package)
    opts = DemoOptions(lto=lto, minutes=minutes, train_steps=train_steps, bench_rounds=bench_rounds)
    report = run_demo(recipe, out, find_toolchain(clang), opts, console.print)
    console.print(report_table(report))
    console.print(training_line(report["training"]))
    tuned = out / "tune"
    console.print(f"wrote {tuned / 'report.json'} and {tuned / 'report.html'} (with plots)")


def tune(
    source: Annotated[Path, typer.Option(help="your project's source directory")],
    build: Annotated[list[str], typer.Option(help="build shell line, e.g. 'make -j2'; repeatable")],
    out: Annotated[
        Path, typer.Option(help="where everything goes; rerun to resume", callback=own_output)
    ],
    configure: Annotated[
        list[str] | None, typer.Option(help="shell line run before --build; repeatable")
    ] = None,
    test: Annotated[
        list[str] | None, typer.Option(help="test shell line, run on both builds; repeatable")
    ] = None,
    bench: Annotated[
        str | None, typer.Option(help="workload shell line; its output must match on both")
    ] = None,
    bench_rounds: BenchRoundsOpt = TuneOptions.bench_rounds,
    bench_seconds: BenchSecondsOpt = TuneOptions.bench_seconds,
    bench_timeout: Annotated[
        float,
        typer.Option(
            help="seconds one run of --bench may take; past them it is killed",
            callback=positive_up_to(MOST_SECONDS),
        ),
    ] = BENCH_TIMEOUT_S,
    layouts: LayoutsOpt = LAYOUTS,
    minutes: Annotated[
        float,
        typer.Option(
            help="minutes of training, and of judging where a workload judges",
            min=0.01,
            callback=positive_up_to(MOST_MINUTES),
        ),
    ] = 10.0,
    train_steps: TrainStepsOpt = TuneOptions.train_steps,
    problem: Annotated[
        str,
        typer.Option(
            help="inlining-size (the default), the link's, or for speed (with --bench) "
            "regalloc-eviction or inlining-speed"
        ),
    ] = "inlining-size",
    lto: Annotated[
        str | None,
        typer.Option(
            help="full or thin: tune the inliner of an LTO link by lld", callback=lto_mode
        ),
    ] = None,
    pgo_row: Annotated[bool, pgo_row_option(hidden=True)] = TuneOptions.pgo_row,
    pgo: Annotated[
        bool,
        typer.Option(
            help="tune on top of PGO: every build with a profile of --bench (run once), the "
            "baseline the PGO build"
        ),
    ] = TuneOptions.pgo,
    use_feature: UseFeatureOpt = None,
    policy: Annotated[Path | None, typer.Option(help="start policy (default: shipped)")] = None,
    refresh: Annotated[
        bool,
        typer.Option(
            help="the source changed since --out was tuned: copy it again and judge the "
            "decisions of the changed files, with the policy trained then"
        ),
    ] = False,
    workers: Annotated[
        str,
        workers_option(
            "where collecting and the training's searches compile (recording, the builds, "
            "judging and the report run on this machine; a tune resumes with other workers): "
        ),
    ] = TuneOptions.workers,
    clang: ClangOpt = None,
) -> None:
    """Your code base to a trained policy and a size-and-throughput report: record its
    build, train on its own modules (or, for speed, on --bench) from the shipped policy
    (inlining-speed: from clang's own decisions) for --minutes, build it twice from a
    pristine copy (clang, and mlgo-cc with what was smallest on your code, or cheapest on
    --bench: clang's own decisions if nothing beat them), run --test on both, time --bench
    on both."""
    from mlgo.packages.recipes import project
    from mlgo.problems import at_link
    from mlgo.programs.report import report_table, training_line
    from mlgo.programs.tune import tune as run_tune

    if lto:
        problem = at_link(problem, lto).name
    recipe = project(
        source.resolve().name, configure or [], build, test or [], bench, bench_timeout
    )
    opts = TuneOptions(
        problem=problem,
        policy=policy,
        minutes=minutes,
        train_steps=train_steps,
        bench_rounds=bench_rounds,
        bench_seconds=bench_seconds,
        layouts=layouts,
        pgo_row=pgo_row,
        refresh=refresh,
        pgo=pgo,
        workers=workers,
        **{EXPERIMENTS[name][0]: True for name in use_feature or ()},
    )
    report = run_tune(source, recipe, out, find_toolchain(clang), opts, console.print)
    console.print(report_table(report))
    console.print(training_line(report["training"]))
    console.print(f"wrote {out / 'report.json'} and {out / 'report.html'} (with plots)")
