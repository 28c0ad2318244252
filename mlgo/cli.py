"""The `mlgo` command."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from mlgo.channel import ChannelError
from mlgo.compile import CompileError
from mlgo.corpus import CorpusError, load_corpus
from mlgo.extract import BuildError
from mlgo.toolchain import ToolchainError, find_toolchain
from mlgo.traces import TraceError

app = typer.Typer(
    help="ML-guided compiler heuristics: corpora, traces and policies for "
    "LLVM's inliner and register allocator.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
corpus_app = typer.Typer(
    help="Build and inspect corpora of real Debian packages.", no_args_is_help=True
)
app.add_typer(corpus_app, name="corpus")
console = Console()
err = Console(stderr=True, soft_wrap=True)

ClangOpt = Annotated[
    str | None, typer.Option(help="clang to use (default: $MLGO_CLANG, clang-22, clang)")
]
WorkersOpt = Annotated[str, typer.Option(help="'local' (a process per core) or a process count")]
# The errors a user can cause or fix; anything else is a bug and keeps its traceback.
USER_ERRORS = (
    ToolchainError,
    CorpusError,
    BuildError,
    TraceError,
    ChannelError,
    CompileError,
    KeyError,
    ValueError,
    OSError,
)


def _kb(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"


@app.command()
def doctor(clang: ClangOpt = None) -> None:
    """Find clang and its LLVM tools, and check both MLGO channels answer."""
    from mlgo.problems import problem_names
    from mlgo.toolchain import probe

    tc = find_toolchain(clang)
    table = Table("check", "result", title="mlgo toolchain")
    table.add_row("clang", tc.describe())
    for tool in ("llvm-objcopy", "llvm-size"):
        table.add_row(tool, tc.tool(tool))
    for name in problem_names():
        table.add_row(f"{name} channel", f"ok ({probe(tc, name)} decisions on the probe)")
    console.print(table)


@corpus_app.command("build")
def corpus_build(
    packages: Annotated[list[str], typer.Argument(help="recipe names from corpus/recipes")],
    out: Annotated[Path, typer.Option(help="corpus directory")] = Path("data/corpus"),
    work: Annotated[Path, typer.Option(help="where sources are unpacked and built")] = Path(
        "data/build"
    ),
    clang: ClangOpt = None,
) -> None:
    """Build Debian source packages and extract their bitcode into a corpus."""
    from mlgo.extract import combine, extract_package, load_recipe

    tc = find_toolchain(clang)
    out.mkdir(parents=True, exist_ok=True)
    failed = []
    for pkg in packages:
        with err.status(f"building {pkg}"):
            try:
                n = extract_package(load_recipe(pkg), tc, out, work.resolve() / pkg)
            except BuildError as e:
                err.print(f"[red]failed[/red] {pkg}: {e}", highlight=False)
                failed.append(pkg)
                continue
        err.print(f"[green]built[/green] {pkg}: {n} modules")
    names = combine(out)
    console.print(
        f"{out}: {len(names)} modules from {len({n.split('/', 1)[0] for n in names})} packages"
    )
    if failed:
        raise typer.Exit(1)


@corpus_app.command("stats")
def corpus_stats(
    corpus: Annotated[Path, typer.Argument(help="corpus directory")],
    workers: WorkersOpt = "local",
    clang: ClangOpt = None,
) -> None:
    """Modules, call sites and .text bytes at -Oz per package (compiles once, then cached)."""
    from mlgo.stats import corpus_stats as compute
    from mlgo.stats import per_package
    from mlgo.workers import make_workers

    tc = find_toolchain(clang)
    stats, failures = compute(load_corpus(corpus), tc.describe(), tc.clang, make_workers(workers))
    table = Table(
        "package",
        "modules",
        "call sites",
        ".text at -Oz",
        "bitcode",
        title=f"{corpus} ({tc.describe()})",
    )
    rows = per_package(stats)
    for pkg, r in sorted(rows.items()):
        table.add_row(
            pkg,
            str(r["modules"]),
            f"{r['call_sites']:,}",
            _kb(r["text_size"]),
            _kb(r["bitcode_bytes"]),
        )
    total = {
        k: sum(r[k] for r in rows.values())
        for k in ("modules", "call_sites", "text_size", "bitcode_bytes")
    }
    table.add_row(
        "[bold]total",
        str(total["modules"]),
        f"{total['call_sites']:,}",
        _kb(total["text_size"]),
        _kb(total["bitcode_bytes"]),
    )
    console.print(table)
    for name, msg in failures.items():
        err.print(f"[red]failed[/red] {name}: {msg}", highlight=False)


@app.command()
def collect(
    problem: Annotated[str, typer.Option(help="inlining-size or regalloc-eviction")],
    corpus: Annotated[Path, typer.Option(help="corpus directory")],
    out: Annotated[Path, typer.Option(help="trace directory (resumed if it exists)")],
    packages: Annotated[str, typer.Option(help="comma-separated packages (default: all)")] = "",
    workers: WorkersOpt = "local",
    timeout: Annotated[float, typer.Option(help="seconds per module")] = 600.0,
    clang: ClangOpt = None,
) -> None:
    """Compile every module with the default heuristic and record its decisions."""
    from mlgo.collect import collect as run
    from mlgo.workers import make_workers

    tc = find_toolchain(clang)
    selected = load_corpus(corpus).select([p for p in packages.split(",") if p])
    manifest = run(problem, selected, out, tc, make_workers(workers), timeout)
    decisions = sum(m["decisions"] for m in manifest.modules.values())
    console.print(
        f"{out}: {len(manifest.modules)} modules, {decisions:,} decisions, "
        f"{len(manifest.failed)} failed"
    )
    if manifest.failed:
        raise typer.Exit(1)


@app.command()
def demo(
    out: Annotated[Path, typer.Option(help="where the demo corpus and traces go")] = Path(
        "data/demo"
    ),
    package: Annotated[str, typer.Option(help="recipe to build")] = "zlib",
) -> None:
    """The main job on a small default: build one real package's corpus, collect its
    inlining decisions, and show the corpus statistics."""
    corpus_build([package], out / "corpus", out / "build", None)
    collect("inlining-size", out / "corpus", out / "traces", "", "local", 600.0, None)
    corpus_stats(out / "corpus", "local", None)


def main() -> None:
    try:
        app()
    except USER_ERRORS as e:
        msg = str(e).splitlines()[0] if str(e) else type(e).__name__
        err.print(f"[red]error:[/red] {msg}", highlight=False)
        sys.exit(2)


if __name__ == "__main__":
    main()
