"""What the command groups share: the consoles, the typed options, and reading a corpus
selection. The value checks themselves live in `mlgo.options`, shared with the XLA wing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from mlgo.corpus.format import Corpus, load_corpus
from mlgo.data import default_policies
from mlgo.options import MOST_ROUNDS, positive_up_to, workers_spec
from mlgo.problems import LTO_STAGES, Problem
from mlgo.programs.tune_run import EXPERIMENTS
from mlgo.runtime.trust import output_dir_checked
from mlgo.runtime.workers import WORKERS_HELP

console = Console(soft_wrap=True)  # a path or a count never breaks a line
err = Console(stderr=True, soft_wrap=True)

ClangOpt = Annotated[
    str | None, typer.Option(help="clang to use (default: $MLGO_CLANG, clang-22, clang)")
]


def workers_option(what: str = "") -> typer.models.OptionInfo:
    """--workers, WHAT runs there said first where a command runs only part of its work
    there."""
    return typer.Option(help=f"{what}{WORKERS_HELP}", callback=workers_spec)


WorkersOpt = Annotated[str, workers_option()]
PackagesOpt = Annotated[str, typer.Option(help="comma-separated packages (default: all)")]
PolicyOpt = Annotated[Path, typer.Option(help="policy directory (or its run)")]
PoliciesOpt = Annotated[
    list[Path], typer.Option(help="policy directory; repeat for one per problem")
]
DEFAULT_POLICIES = default_policies()  # wherever mlgo is run from
SocketOpt = Annotated[
    Path | None, typer.Option(help="service socket (default: $MLGO_SOCKET or the runtime dir)")
]


# The options that time a workload, one group that `mlgo tune` and `mlgo build` share.
TIMING = "Timing the workload"
MOST_BENCH_SECONDS = 600.0  # a longer sample would make a tune's rounds take days
BenchRoundsOpt = Annotated[
    int,
    typer.Option(
        help="paired rounds of the workload (each build timed in turn, ABBA); 0: not timed",
        min=0,
        max=MOST_ROUNDS,
        rich_help_panel=TIMING,
    ),
]
BenchSecondsOpt = Annotated[
    float,
    typer.Option(
        help="CPU seconds per timed sample of the workload (it loops to fill them; longer: "
        "less noise in each round)",
        callback=positive_up_to(MOST_BENCH_SECONDS),
        rich_help_panel=TIMING,
    ),
]
LayoutsOpt = Annotated[
    int,
    typer.Option(
        help="also time the workload over this many relinks of each build, its functions "
        "shuffled (lld --shuffle-sections); a speed tune keeps only what is faster over "
        "them; 0: as built only",
        min=0,
        max=MOST_ROUNDS,
        rich_help_panel=TIMING,
    ),
]


def pgo_row_option(hidden: bool = False) -> typer.models.OptionInfo:
    """--pgo-row, timing the PGO build beside the others (HIDDEN where it is only a way to
    make a test quicker)."""
    return typer.Option(
        help="with a workload, time beside the others the build with its profile "
        "(instrumented, the workload run once, -fprofile-instr-use); off: a quicker run",
        rich_help_panel=TIMING,
        hidden=hidden,
    )


def features(names: list[str] | None) -> list[str]:
    """--use-feature's check: each an experiment of `EXPERIMENTS`."""
    unknown = sorted(set(names or ()) - set(EXPERIMENTS))
    if unknown:
        known = ", ".join(EXPERIMENTS)
        raise typer.BadParameter(f"no experiment {unknown[0]!r}: use one of {known}")
    return names or []


UseFeatureOpt = Annotated[
    list[str] | None,
    typer.Option(
        help="switch on an experiment, one that has not paid yet: "
        + "; ".join(f"{name}: {what}" for name, (_, what) in EXPERIMENTS.items())
        + "; repeatable",
        callback=features,
    ),
]


def own_output(path: Path | None) -> Path | None:
    """--out's check, before anything runs: a directory of this user's that no one else
    may write (or, not there yet, a place so), since a command resumes from what it finds
    there and runs what it built there (`output_dir_checked`)."""
    return None if path is None else output_dir_checked(path)


def selected(corpus: Path, packages: str, problem: Problem) -> Corpus:
    """The corpus at CORPUS, restricted to the comma-separated PACKAGES if any are named,
    recorded at the level PROBLEM compiles at."""
    chosen = load_corpus(corpus).select([p for p in packages.split(",") if p])
    return chosen.require(problem)


def lto_mode(mode: str | None) -> str | None:
    """--lto's check: full or thin (LTO_STAGES)."""
    if mode not in (None, *LTO_STAGES):
        raise typer.BadParameter(f"{mode!r}: use --lto full or --lto thin")
    return mode


def kib(n: float) -> str:
    return f"{n / 1024:,.1f} KiB"
