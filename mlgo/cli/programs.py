"""`mlgo build` and `mlgo demo`: real programs built with a policy, and the main job on a
small default."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from mlgo.cli.options import DEFAULT_POLICIES, ClangOpt, PoliciesOpt, console
from mlgo.llvm.toolchain import find_toolchain
from mlgo.programs.demo import DemoOptions


def build(
    packages: Annotated[list[str], typer.Argument(help="recipes, e.g. lua sqlite3 zstd")],
    policy: PoliciesOpt = DEFAULT_POLICIES,
    out: Annotated[Path, typer.Option(help="where sources, builds and build.json go")] = Path(
        "data/programs"
    ),
    tests: Annotated[bool, typer.Option(help="run each package's own tests on both")] = True,
    backend: Annotated[
        str, typer.Option(help="service backend: auto, plugin, native or python")
    ] = "auto",
    guard: Annotated[
        bool,
        typer.Option(help="MLGO_GUARD=size: per file, the smaller of the policy's and -Oz's"),
    ] = False,
    clang: ClangOpt = None,
) -> None:
    """Build real programs from their Debian source packages twice, with plain clang and
    with mlgo-cc serving the policies (same -Oz flags), run the package's own tests on
    both, and compare the linked programs' .text."""
    from mlgo.corpus.extract import BuildError, load_recipe
    from mlgo.programs.compare import compare_programs

    tc = find_toolchain(clang)
    recipes = [load_recipe(name) for name in packages]  # a misspelt name fails before any build
    result = compare_programs(recipes, policy, out, tc, tests, backend, guard)
    table = Table("program", "clang -Oz .text", "mlgo .text", "delta", "build s", "tests")
    for plain, ml in result.pairs:
        for prog, base in plain.text.items():
            table.add_row(
                f"{plain.package}: {prog}",
                f"{base:,}",
                f"{ml.text[prog]:,}",
                f"{100 * (ml.text[prog] / base - 1):+.2f}%",
                f"{plain.build_seconds:.0f} / {ml.build_seconds:.0f}",
                f"{plain.tests} / {ml.tests}",
            )
    base_total, ml_total, delta = result.totals()
    table.add_row("total", f"{base_total:,}", f"{ml_total:,}", f"{delta:+.2f}%", style="bold")
    console.print(table)
    console.print(f"wrote {out / 'build.json'}")
    for error in result.failed.values():
        console.print(f"[red]{error}")
    if result.failed:
        failed = ", ".join(result.failed)
        raise BuildError(f"{len(result.failed)} of {len(packages)} packages failed: {failed}")


def demo(
    out: Annotated[Path, typer.Option(help="where the corpus, policy, builds and report go")] = (
        Path("data/demo")
    ),
    package: Annotated[str, typer.Option(help="recipe to build")] = "zlib",
    train_steps: Annotated[
        int, typer.Option(help="ES steps from the shipped policy; 0: use it as is", min=0)
    ] = DemoOptions.train_steps,
    bench_rounds: Annotated[
        int, typer.Option(help="paired rounds of the recipe's workload", min=1)
    ] = DemoOptions.bench_rounds,
    clang: ClangOpt = None,
) -> None:
    """The whole loop on one real package: record its corpus and inlining decisions, train
    briefly from the shipped policy, build the package twice (plain clang and mlgo-cc with
    the better policy), run its tests and workload on both, and report size and throughput."""
    from mlgo.cli.corpus import corpus_build, corpus_stats
    from mlgo.cli.train import collect
    from mlgo.corpus.extract import load_recipe
    from mlgo.programs.demo import report_table, run_demo, training_line

    recipe = load_recipe(package)
    tc = find_toolchain(clang)
    corpus_build([package], out=out / "corpus", work=out / "build", opt_level="-Oz", clang=clang)
    collect("inlining-size", out / "corpus", out=out / "traces", clang=clang)
    corpus_stats(out / "corpus", clang=clang)
    opts = DemoOptions(train_steps, bench_rounds)
    report = run_demo(recipe, out / "corpus", DEFAULT_POLICIES[0], out, tc, opts, console.print)
    console.print(report_table(report))
    console.print(training_line(report["training"]))
    console.print(f"wrote {out / 'report.json'}")
