"""Issue 59's figure on a finished tune: its project built again from OUT/decisions by plain
clang, each ELF file's machine code compared with the tune's kept build, and that build's
CPU against plain clang's in interleaved rounds beside an A/A control; and, for the
release-to-release figure, how many decisions still match in another release's build.

The tune's kept build is OUT/programs/mlgo (every unit whose decisions were kept) and
OUT/programs/plain (clang's own, which every file without a decisions file must match).
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from mlgo.corpus.extract import logged_invocations
from mlgo.llvm.cmdline import without_outputs
from mlgo.llvm.driver import source_files
from mlgo.llvm.sizes import elf_texts, text_digest
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import Recipe, project
from mlgo.problems import Problem, get_problem
from mlgo.programs.build import Variant, build_program, problem_flags
from mlgo.programs.decide import DECISIONS, from_decisions
from mlgo.programs.measure import paired_change, round_order
from mlgo.runtime.commands import BuildError
from mlgo.runtime.inputs import read_json
from mlgo.ship.decisions import Artifact, read, recheck_command, still_matching

A_A = "plain A/A"


@dataclass
class Identity:
    """How many ELF files of a build from decisions have the kept build's machine code,
    of how many, and the paths of those that differ."""

    same: int
    compared: int
    differing: list[str]


def tuned_project(out: Path) -> tuple[Recipe, Problem]:
    """The project a finished tune at OUT built (its shell lines, from OUT/tune.json, without
    its workload) and its problem; a tune that wrote no decisions is refused."""
    if not (out / "tune.json").is_file():
        raise BuildError(f"{out}: has no tune.json (not a tune's directory)")
    args = read_json(out / "tune.json", BuildError)
    if not (out / DECISIONS).is_dir():
        raise BuildError(f"{out}: has no {DECISIONS}/ (not a finished tune of an inlining problem)")
    try:
        name = Path(args["source"]).name
        recipe = project(name, args["configure"], args["build"], args["test"], None)
        return recipe, get_problem(args["problem"])
    except (KeyError, TypeError) as e:
        raise BuildError(f"{out / 'tune.json'}: not a tune's arguments (no {e})") from e


def kept_identity(tree: Path, out: Path) -> Identity:
    """TREE's objects and programs against the tune at OUT: every program, and an object
    named like a source with kept decisions, against OUT/programs/mlgo; every other object
    against OUT/programs/plain (clang's own: such a file must pay nothing for the tune)."""
    kept = {Path(name).stem for name in read(out / DECISIONS).files}
    differing, compared = [], 0
    for path, (_, linked) in elf_texts(tree).items():
        decided = linked or Path(path).name.split(".")[0] in kept
        reference = out / "programs" / ("mlgo" if decided else "plain") / path
        if not reference.is_file():
            differing.append(f"{path} (not in {reference.parent})")
            continue
        compared += 1
        if text_digest(tree / path) != text_digest(reference):
            differing.append(path)
    return Identity(compared - len(differing), compared, differing)


def cpu_rounds(
    recipe: Recipe, out: Path, work: Path, tc: Toolchain, problem: Problem, rounds: int
) -> dict[str, dict]:
    """Build CPU (user + system) of ROUNDS clean builds each of plain clang, plain again and
    the build from OUT/decisions, interleaved (`round_order`), tests not run: each variant's
    change against plain, round by round (`paired_change`)."""
    flags = problem_flags(problem)
    plain, ours = from_decisions(tc, out / DECISIONS, work / "decisions")
    variants = {v.name: v for v in (plain, Variant(A_A, plain.compilers, {}), ours)}
    cpu: dict[str, list[float]] = {name: [] for name in variants}
    for r in range(rounds):
        for name in round_order(r, tuple(variants)):
            v = variants[name]
            tree = work / ("decisions" if v is ours else "plain")
            built = build_program(
                recipe, out / "pristine", tree, tc, name, v.compilers, v.env, False, flags
            )
            cpu[name].append(built.build_cpu_seconds)
    return {name: paired_change(cpu[name], cpu["plain"]) for name in (A_A, ours.name)}


def identity_build(
    recipe: Recipe, out: Path, work: Path, tc: Toolchain, problem: Problem
) -> Identity:
    """The project built and tested from OUT/decisions at WORK/decisions (a failing test
    raises BuildError naming its log), and its `kept_identity`."""
    _, ours = from_decisions(tc, out / DECISIONS, work / "decisions")
    tree = work / "decisions"
    build_program(
        recipe, out / "pristine", tree, tc, ours.name, ours.compilers, ours.env, True,
        problem_flags(problem),
    )  # fmt: skip
    return kept_identity(tree, out)


def still_matching_in(
    artifact: Artifact, calls: Path, tree: Path, flags: list[str]
) -> dict[str, tuple[int, int]]:
    """Per file of ARTIFACT that the build of TREE logged to CALLS compiled: how many of its
    decisions still meet a call site there, and how many there are (`still_matching`). Each
    compile runs again as its wrapper ran it: the logged arguments, then the FLAGS the
    wrapper appends (a build that names no level would otherwise be rechecked at -O0, where
    nothing is inlined and no decision matches)."""
    matching = {}
    for call in logged_invocations(calls):
        sources = source_files(call.argv[1:])
        if "-c" not in call.argv or len(sources) != 1:
            continue
        name = os.path.relpath((call.cwd / sources[0]).resolve(), tree)
        if name in artifact.files:
            command = recheck_command([*without_outputs(call.argv)[1:], *flags])
            matching[name] = still_matching(artifact, name, [*command, "-o", os.devnull], call.cwd)
    return matching
