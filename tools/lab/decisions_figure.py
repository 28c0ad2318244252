"""The decisions figure on a finished tune: its project built again from OUT/decisions by plain
clang, each ELF file's machine code compared with the tune's kept build, and that build's
CPU against plain clang's in interleaved rounds beside an A/A control and beside what the
same policy costs and gives served to mlgo-cc, as a build gets it without decisions; and,
for the release-to-release figure, how many decisions still match in another release's build.

The tune's kept build is OUT/programs/mlgo (every unit whose decisions were kept) and
OUT/programs/plain (clang's own, which every file without a decisions file must match).
"""

from __future__ import annotations

import os
import shlex
import statistics
from dataclasses import dataclass, replace
from pathlib import Path

from mlgo.corpus.extract import logged_invocations
from mlgo.llvm.cmdline import without_outputs
from mlgo.llvm.driver import source_files
from mlgo.llvm.sizes import elf_texts, text_digest
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import Recipe
from mlgo.problems import Problem
from mlgo.programs.build import (
    Building,
    Variant,
    build_program,
    policy_service,
    problem_flags,
    rebuild_cpu_seconds,
)
from mlgo.programs.compare import variants
from mlgo.programs.decide import from_decisions
from mlgo.programs.measure import collected, paired_change, round_order, tree_cpu_seconds
from mlgo.programs.tune_run import TuneDir
from mlgo.runtime.commands import BuildError
from mlgo.serve.client import request
from mlgo.ship.decisions import Artifact, read, recheck_command, still_matching

A_A = "plain A/A"
DECIDED = "from decisions"
SERVED_COLD = "service, guard cold"
SERVED_REMEMBERED = "service, guard remembered"
COUNT_ENV = "MLGO_BENCH_CALLGRIND_LOGS"


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
    recipe, problem, _ = TuneDir(out).tuned_recipe()
    if not TuneDir(out).decisions.is_dir():
        raise BuildError(f"{out}: has no decisions/ (not a finished tune of an inlining problem)")
    return replace(recipe, bench=()), problem


def kept_identity(tree: Path, out: Path) -> Identity:
    """TREE's objects and programs against the tune at OUT: every program, and an object
    named like a source with kept decisions, against OUT/programs/mlgo; every other object
    against OUT/programs/plain (clang's own: such a file must pay nothing for the tune)."""
    kept = {Path(name).stem for name in read(TuneDir(out).decisions).files}
    differing, compared = [], 0
    for path, (_, linked) in elf_texts(tree).items():
        decided = linked or Path(path).name.split(".")[0] in kept
        reference = TuneDir(out).programs / ("mlgo" if decided else "plain") / path
        if not reference.is_file():
            differing.append(f"{path} (not in {reference.parent})")
            continue
        compared += 1
        if text_digest(tree / path) != text_digest(reference):
            differing.append(path)
    return Identity(compared - len(differing), compared, differing)


@dataclass
class CostRow:
    """One way of building in `cpu_rounds`: its build CPU against plain clang's, round by
    round (`paired_change`), the median CPU seconds its policy service spent a build (0
    where none serves), and its ELF programs' `.text` in bytes."""

    change: dict
    service_cpu_s: float
    programs_text: int


def cpu_rounds(
    recipe: Recipe, out: Path, work: Path, tc: Toolchain, problem: Problem, rounds: int
) -> dict[str, CostRow]:
    """ROUNDS clean builds each, interleaved (`round_order`), tests not run, of: plain clang,
    plain again (A/A), the build from OUT/decisions, and the same policy as a build gets it
    today, OUT/policy served to mlgo-cc (guarded for a size tune, as it is by default):
    once with the guard's memory cold (a tree of its own each round: the memory is keyed by
    directory too) and once remembered (the same tree each round, a build before the first
    round). A build's CPU is user + system of every process it ran, and for the service's
    builds the service's own (plugins run inside clang, so they are counted there)."""
    flags = problem_flags(problem)
    plain, ours = from_decisions(tc, TuneDir(out).decisions, work / "decisions")
    with policy_service([TuneDir(out).policy], work / "service") as env:
        service_pid = request({"op": "status"}, path=Path(env["MLGO_SOCKET"]))["pid"]
        served = variants(tc, env, guard=problem.aim == "size")[1]
        ways = {  # name -> (how, its tree: None for a new one each round)
            "plain": (plain, "plain"),
            A_A: (plain, "plain"),
            DECIDED: (ours, "decisions"),
            SERVED_COLD: (served, None),
            SERVED_REMEMBERED: (served, "served"),
        }

        def build(name: str, tree: str) -> tuple[float, float, int]:
            how, before = ways[name][0], tree_cpu_seconds(service_pid)
            built = build_program(
                recipe,
                TuneDir(out).pristine,
                work / tree,
                tc,
                Variant(name, how.compilers, how.env),
                flags,
                Building(tests=False),
            )
            service = tree_cpu_seconds(service_pid) - before if how is served else 0.0
            text = sum(t for t, linked in elf_texts(work / tree).values() if linked)
            return built.build_cpu_seconds + service, service, text

        build(SERVED_REMEMBERED, "served")  # the guard's memory, for every round
        cpu: dict[str, list[float]] = {name: [] for name in ways}
        service_cpu: dict[str, list[float]] = {name: [] for name in ways}
        text: dict[str, int] = {}
        for r in range(rounds):
            for name in round_order(r, tuple(ways)):
                seconds, service, text[name] = build(name, ways[name][1] or f"served-{r}")
                cpu[name].append(seconds)
                service_cpu[name].append(service)
    base = cpu["plain"]
    return {
        name: CostRow(
            paired_change(cpu[name], base), statistics.median(service_cpu[name]), text[name]
        )
        for name in ways
    }


def counted_compiler(compiler: str, script: Path) -> str:
    """SCRIPT, a sh script that runs COMPILER, under callgrind (every process it runs, each
    count in a log of its own) while COUNT_ENV names a directory for the logs."""
    real = shlex.quote(compiler)
    callgrind = "valgrind --tool=callgrind --trace-children=yes --callgrind-out-file=/dev/null"
    script.parent.mkdir(parents=True, exist_ok=True)
    script.write_text(
        f'#!/bin/sh\n[ -z "${COUNT_ENV}" ] || exec {callgrind} "--log-file=${COUNT_ENV}/%p.log" '
        f'{real} "$@"\nexec {real} "$@"\n'
    )
    script.chmod(0o755)
    return str(script)


def build_instructions(
    recipe: Recipe, out: Path, work: Path, tc: Toolchain, problem: Problem
) -> dict[str, int]:
    """Instructions of every compile and link of a clean rebuild of the project, plain and
    from OUT/decisions (the grep and cksum its wrapper runs, and clang), counted by callgrind:
    what CPU seconds on a shared machine only estimate. Configure and the first build run
    uncounted; the count is of the rebuild after `cleaned`, as a user's `make clean`. The
    wrapper's own shell is left out: it execs clang, whose log (named by the same pid)
    replaces its count, about 0.9 M instructions a compile that replays a file."""
    flags = problem_flags(problem)
    counts: dict[str, int] = {}
    plain, ours = from_decisions(tc, TuneDir(out).decisions, work / "decisions")
    for how, tree in ((plain, "plain"), (ours, "decisions")):
        counting = work / f".{tree}-counted"
        cc, cxx = how.compilers
        compilers = (counted_compiler(cc, counting / "cc"), counted_compiler(cxx, counting / "c++"))
        build_program(
            recipe,
            TuneDir(out).pristine,
            work / tree,
            tc,
            Variant(how.name, compilers, how.env),
            flags,
            Building(tests=False),
        )
        logs = counting / "logs"
        logs.mkdir()
        env = dict(how.env, **{COUNT_ENV: str(logs)})
        rebuild_cpu_seconds(recipe, work / tree, tc, Variant(how.name, compilers, env), flags)
        counts[tree] = sum(collected(logs))
    return counts


def identity_build(
    recipe: Recipe, out: Path, work: Path, tc: Toolchain, problem: Problem
) -> Identity:
    """The project built and tested from OUT/decisions at WORK/decisions (a failing test
    raises BuildError naming its log), and its `kept_identity`."""
    _, ours = from_decisions(tc, TuneDir(out).decisions, work / "decisions")
    tree = work / "decisions"
    build_program(recipe, TuneDir(out).pristine, tree, tc, ours, problem_flags(problem))
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
