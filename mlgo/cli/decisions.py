"""`mlgo decisions show|diff|check`: a build's inlining decisions kept as data that plain
clang replays (mlgo.ship.decisions)."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from mlgo.cli.options import PolicyOpt, console, err, own_output

app = typer.Typer(
    help="Inlining decisions as data: what a decisions directory holds, what changed, "
    "what still matches the sources.",
    no_args_is_help=True,
)
DirArg = Annotated[Path, typer.Argument(help="a decisions directory")]


@app.command()
def show(
    directory: DirArg,
    functions: Annotated[bool, typer.Option(help="also per function")] = False,
) -> None:
    """Per file and linked program (and function): decisions, how many inline, how many
    depart from clang's own, conflicting sites dropped."""
    from mlgo.ship.decisions import read, show

    for line in show(read(directory), functions):
        console.print(line, markup=False, highlight=False)


@app.command()
def diff(old: DirArg, new: DirArg) -> None:
    """What changed from OLD to NEW, per file and function: decisions added (+), removed (-),
    answered the other way (~)."""
    from mlgo.ship.decisions import diff, read

    for line in diff(read(old), read(new)):
        console.print(line, markup=False, highlight=False)


@app.command()
def check(
    directory: DirArg,
    root: Annotated[
        Path | None, typer.Option(help="the project's root (default: as DIR/FORMAT says)")
    ] = None,
    cflags: Annotated[
        list[str] | None,
        typer.Argument(help="after --, the recorded compile flags: count what still matches"),
    ] = None,
) -> None:
    """First, DIR's cc and c++ if they are not the wrappers mlgo writes for it; then per
    file: whether its source is still the one decided (all decisions match), changed
    (stale ones get clang's own decisions) or gone. With CFLAGS, each file that inlines is
    compiled once through clang's replay: how many decisions of a changed one still match,
    and each inline clang would refuse (it can change what the program does). Exits 1 if
    anything is refused."""
    from mlgo.ship.decisions import check, foreign_wrappers, read, recheck_command

    artifact = read(directory)
    recheck = recheck_command(cflags) if cflags else None
    found, refused = check(artifact, root or directory / artifact.root_from_dir, recheck)
    foreign = foreign_wrappers(artifact)
    for line in [*foreign, *found]:
        console.print(line, markup=False, highlight=False)
    if not cflags and any(unit["inlined"] for unit in artifact.files.values()):
        err.print("mlgo: note: inlines not checked for clang's refusals: give the recorded "
                  "compile flags after --", highlight=False)  # fmt: skip
    if foreign or refused:
        raise typer.Exit(1)


@app.command()
def record(
    policy: PolicyOpt,
    out: Annotated[
        Path, typer.Option(help="the decisions directory to write", callback=own_output)
    ],
    build: Annotated[list[str], typer.Argument(help="after --, your build command (clean)")],
    root: Annotated[Path, typer.Option(help="the project's root: where the build runs")] = Path(),
) -> None:
    """Run your build with POLICY served by the clang plugin and keep what it decided, per
    source and per full-LTO program, as OUT: then build with OUT/cc and OUT/c++, plain
    clang only."""
    from mlgo.llvm.toolchain import find_toolchain
    from mlgo.problems.policy_files import load_policy
    from mlgo.ship.decisions_record import record_build

    written, skipped = record_build(load_policy(policy), out, root, build, find_toolchain())
    for line in skipped:
        err.print(f"mlgo: note: {line}", markup=False, highlight=False)
    console.print(f"wrote {written}: build with CC={written}/cc CXX={written}/c++")
