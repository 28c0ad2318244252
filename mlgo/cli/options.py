"""What the command groups share: the consoles, the typed options, and reading a corpus
selection. The value checks themselves live in `mlgo.options`, shared with the XLA wing."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

from mlgo.corpus.format import Corpus, load_corpus
from mlgo.data import default_policies
from mlgo.options import workers_spec
from mlgo.problems import LTO_STAGES, Problem
from mlgo.runtime.trust import output_dir_checked
from mlgo.runtime.workers import WORKERS_HELP

console = Console(soft_wrap=True)  # a path or a count never breaks a line
err = Console(stderr=True, soft_wrap=True)

ClangOpt = Annotated[
    str | None, typer.Option(help="clang to use (default: $MLGO_CLANG, clang-22, clang)")
]
WorkersOpt = Annotated[str, typer.Option(help=WORKERS_HELP, callback=workers_spec)]
PackagesOpt = Annotated[str, typer.Option(help="comma-separated packages (default: all)")]
PolicyOpt = Annotated[Path, typer.Option(help="policy directory (or its run)")]
PoliciesOpt = Annotated[
    list[Path], typer.Option(help="policy directory; repeat for one per problem")
]
DEFAULT_POLICIES = default_policies()  # wherever mlgo is run from
SocketOpt = Annotated[
    Path | None, typer.Option(help="service socket (default: $MLGO_SOCKET or the runtime dir)")
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
