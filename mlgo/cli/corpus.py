"""`mlgo doctor` and `mlgo corpus ...`: the toolchain, and corpora of real Debian packages."""

from __future__ import annotations

from contextlib import closing
from pathlib import Path
from typing import Annotated

import typer
from rich.table import Table

from mlgo.cli.options import ClangOpt, WorkersOpt, console, err, kib, lto_mode, own_output
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.options import MOST_STEPS, MOST_UNITS
from mlgo.options import opt_level as level_check
from mlgo.problems import LTO_STAGES
from mlgo.runtime.commands import BuildError

app = typer.Typer(
    help="Record corpora from your own builds or Debian packages, and inspect them.",
    no_args_is_help=True,
)


def doctor(clang: ClangOpt = None) -> None:
    """Find clang and its LLVM tools, check both MLGO channels answer, and build the plugins
    of the policies served by default: what a first build would need, checked (and cached)
    before it."""
    from mlgo.data import default_policies
    from mlgo.llvm.toolchain import probe
    from mlgo.problems import problems
    from mlgo.problems.policy_files import load_policy
    from mlgo.ship.plugin import inliner_plugin

    tc = find_toolchain(clang)
    table = Table("check", "result", title="mlgo toolchain")
    table.add_row("clang", tc.describe())
    for tool in ("llvm-objcopy", "llvm-size"):
        table.add_row(tool, tc.tool(tool))
    for problem in problems():
        table.add_row(
            f"{problem.name} channel",
            f"ok ({probe(tc, problem)} decisions on the probe): {problem.summary}",
        )
    for directory in default_policies():
        policy = load_policy(directory)
        if policy.problem.plugin:
            plugin = inliner_plugin(policy, tc)
            table.add_row(f"{directory.name} plugin", f"ok (clang loads it): {plugin}")
    console.print(table)


@app.command("build")
def corpus_build(
    packages: Annotated[
        list[str] | None, typer.Argument(help="recipe names from corpus/recipes")
    ] = None,
    split: Annotated[
        str | None,
        typer.Option(
            help="every package of this split in corpus/splits.toml: train, validation or test"
        ),
    ] = None,
    out: Annotated[Path, typer.Option(help="corpus directory", callback=own_output)] = Path(
        "data/corpus"
    ),
    work: Annotated[
        Path,
        typer.Option(help="where sources are unpacked and built; finished packages are reused"),
    ] = Path("data/build"),
    opt_level: Annotated[
        str,
        typer.Option(
            help="the level the problem you train compiles at: -Oz for inlining-size, "
            "-O2 for regalloc-eviction (clang's frontend already optimizes for it)",
            callback=level_check,
        ),
    ] = "-Oz",
    profile: Annotated[
        bool,
        typer.Option(
            help="block counts from the package's own tests (an instrumented build runs "
            "them first) instead of static estimates, in every recorded module"
        ),
    ] = False,
    lto: Annotated[
        str | None,
        typer.Option(
            help="full or thin: each LTO link's modules instead (merged, or each backend's)",
            callback=lto_mode,
        ),
    ] = None,
    clang: ClangOpt = None,
) -> None:
    """Build Debian source packages (named, or a whole split) and extract their bitcode into
    a corpus (with --lto, of their links, for inlining-size-link or -thin); a package that fails
    is named and the others go on."""
    from mlgo.corpus.extract import combine
    from mlgo.corpus.format import DESCRIPTION
    from mlgo.corpus.splits import packages_to_build
    from mlgo.packages.build import extract_package
    from mlgo.packages.recipes import load_recipe
    from mlgo.runtime.files import output_dir

    names, stage = packages_to_build(packages or [], split), LTO_STAGES[lto] if lto else "compile"
    tc, failed = find_toolchain(clang), []
    with output_dir(out):  # nothing built into a new OUT: no OUT (the failures said why)
        for pkg in names:
            try:
                with err.status(f"building {pkg}"):
                    recipe = load_recipe(pkg)
                    b = extract_package(recipe, tc, out, work / pkg, opt_level, profile, stage)
                done = "reused" if b.reused else "built"
                err.print(f"[green]{done}[/green] {pkg}: {b.modules} modules")
                for line in b.skipped:
                    err.print(f"[yellow]skipped[/yellow] {pkg}: {line}", highlight=False)
            except BuildError as e:
                err.print(f"[red]failed[/red] {pkg}: {e}", highlight=False)
                failed.append(pkg)
        if len(failed) == len(names) and not (out / DESCRIPTION).exists():
            raise typer.Exit(1)
        modules = combine(out)
    n_pkgs = len({n.split("/", 1)[0] for n in modules})
    console.print(f"{out}: {len(modules)} modules from {n_pkgs} packages")
    if failed:
        err.print(f"[red]{len(failed)} of {len(names)} failed:[/red] {' '.join(failed)}")
        raise typer.Exit(1)


@app.command("stats")
def corpus_stats(
    corpus: Annotated[Path, typer.Argument(help="corpus directory")],
    workers: WorkersOpt = "local",
    clang: ClangOpt = None,
) -> None:
    """Modules, call sites and .text bytes per package, at the level the corpus was recorded
    at (compiles once, then cached)."""
    print_stats(corpus, find_toolchain(clang), workers)


def print_stats(corpus: Path, tc: Toolchain, workers: str) -> None:
    """The stats table of CORPUS, and a line for each module that failed to compile."""
    from mlgo.corpus.format import load_corpus
    from mlgo.corpus.stats import corpus_stats as compute
    from mlgo.corpus.stats import per_package, totals
    from mlgo.runtime.workers import make_workers

    loaded = load_corpus(corpus)
    with closing(make_workers(workers)) as pool:
        stats, failures = compute(loaded, tc.describe(), tc.clang, pool)
    levels = "/".join(sorted({m.opt_level for m in loaded.modules}))
    text = f".text at {levels}"
    columns = ("package", "modules", "call sites", text, "inline copies once", "bitcode")
    stage = "" if loaded.stage == "compile" else f", {loaded.stage} stage"
    table = Table(*columns, title=f"{corpus} ({tc.describe()}{stage})")
    rows = per_package(stats)
    for pkg, r in [*sorted(rows.items()), ("[bold]total", totals(rows))]:
        table.add_row(
            pkg,
            str(r["modules"]),
            f"{r['call_sites']:,}",
            kib(r["text_size"]),
            kib(r["text_once"]),
            kib(r["bitcode_bytes"]),
        )
    console.print(table)
    for name, msg in failures.items():
        err.print(f"[red]failed[/red] {name}: {msg}", highlight=False)


@app.command("vocabulary")
def corpus_vocabulary(
    corpus: Annotated[Path, typer.Argument(help="corpus directory (its bitcode)")],
    out: Annotated[Path, typer.Option(help="vocabulary JSON to write")],
    dim: Annotated[int, typer.Option(min=2, max=MOST_UNITS, help="vector length")] = 16,
    steps: Annotated[int, typer.Option(min=1, max=MOST_STEPS, help="TransE training steps")] = 4000,
    clang: ClangOpt = None,
) -> None:
    """Train an IR2Vec vocabulary on the corpus's IR (TransE over llvm-ir2vec's triplets),
    for clang's -ir2vec-vocab-path."""
    from mlgo.corpus.format import load_corpus
    from mlgo.train.vocabulary import TransE, tail_hits, train_vocabulary

    chosen = load_corpus(corpus)
    out.parent.mkdir(parents=True, exist_ok=True)  # a bad --out fails now, not after training
    graph, entity, relation = train_vocabulary(
        find_toolchain(clang), chosen, out, TransE(dim=dim, steps=steps)
    )
    console.print(
        f"{out}: {len(graph.entities)} entities x {dim}, from {int(graph.counts.sum()):,} "
        f"triplets ({len(graph.triplets):,} distinct); the true tail is the nearest for "
        f"{tail_hits(graph, entity, relation):.1%} of them, among the 3 nearest for "
        f"{tail_hits(graph, entity, relation, 3):.1%}"
    )


@app.command("record", context_settings={"allow_interspersed_args": False}, no_args_is_help=True)
def corpus_record(
    out: Annotated[
        Path,
        typer.Option(help="corpus directory (a corpus there is replaced)", callback=own_output),
    ],
    build: Annotated[
        list[str] | None,
        typer.Argument(
            help="your build command, after `--`; configure inside it if your build "
            "system fixes its compiler then: -- sh -c './configure && make'"
        ),
    ] = None,
    package: Annotated[
        str | None,
        typer.Option(help="one package for all modules (default: the sources' top directories)"),
    ] = None,
    opt_level: Annotated[
        str,
        typer.Option(
            help="the level to record at: -Oz for inlining-size, -O2 for regalloc-eviction",
            callback=level_check,
        ),
    ] = "-Oz",
    from_: Annotated[
        Path | None,
        typer.Option("--from", help="recompile this compile_commands.json instead of building"),
    ] = None,
    source_dir: Annotated[Path, typer.Option(help="your source tree")] = Path("."),
    lto: Annotated[
        str | None,
        typer.Option(
            help="full or thin: build with that LTO and record the modules each program's or "
            "shared library's link optimizes, for inlining-size-link or inlining-size-thin",
            callback=lto_mode,
        ),
    ] = None,
    clang: ClangOpt = None,
) -> None:
    """Record a corpus from your own build (make, CMake, Ninja, Meson, autotools...) or from
    its compile_commands.json; names what it could not record."""
    from mlgo.corpus.record import record, record_from

    if bool(from_) == bool(build):
        raise typer.BadParameter("give either a build command after `--` or --from")
    if from_ and lto:
        raise typer.BadParameter("--lto records a build's links, and --from runs none")
    tc = find_toolchain(clang)
    with err.status("recording"):
        if from_:
            result = record_from(from_, out, tc, source_dir, package, opt_level)
        else:
            stage = LTO_STAGES[lto] if lto else "compile"
            result = record(build or [], out, tc, source_dir, package, opt_level, stage=stage)
    for line in result.skipped:
        err.print(f"[yellow]not recorded[/yellow] {line}", highlight=False)
    packages = ", ".join(f"{p} ({n})" for p, n in sorted(result.packages.items()))
    console.print(f"{out}: {result.modules} modules: {packages}", highlight=False)
