"""The builds a tune reports, and their timing: plain clang at the problem's level, ours
(from the tune's decisions by plain clang; for eviction, which clang cannot replay, mlgo-cc
serving the policy), the PGO build a performance engineer would make anyway (`pgo`), and
the workload's clock on them, as built and over shuffled layouts (`layouts`): each layout
of ours is built the same way as ours, so that every figure is of the build that ships.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path

from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import Recipe
from mlgo.problems import Problem
from mlgo.programs.build import ProgramBuild, Variant, policy_service, problem_flags
from mlgo.programs.compare import build_pair, variants
from mlgo.programs.decide import from_decisions
from mlgo.programs.layouts import sections_tree
from mlgo.programs.pgo import PGORow, pgo_row, timed_beside_row, unprofiled_row


@contextmanager
def plain_and_ours(
    tc: Toolchain, policy: Path, decisions: Path | None, root: Path, service: Path, guard: bool
) -> Iterator[tuple[Variant, Variant]]:
    """Plain clang, and ours: from DECISIONS for a copy of the project at ROOT, or (None)
    mlgo-cc serving POLICY from a service in SERVICE (GUARD: MLGO_GUARD=size)."""
    if decisions is not None:
        yield from_decisions(tc, decisions, root)
        return
    with policy_service([policy], service) as env:
        plain, ours = variants(tc, env, guard=guard)
        yield plain, ours


def build_twice(
    recipe: Recipe,
    pristine: Path,
    policy: Path,
    work: Path,
    tc: Toolchain,
    problem: Problem,
    guard: bool = False,
    decisions: Path | None = None,
    profile: Path | None = None,
) -> tuple[ProgramBuild, ProgramBuild]:
    """RECIPE configured, built and tested from PRISTINE twice, in WORK/plain (clang at
    the problem's level, with the PROFILE if any) and WORK/mlgo (`plain_and_ours`). A
    failing build or test raises BuildError naming its log."""
    flags = problem_flags(problem, profile)
    with plain_and_ours(tc, policy, decisions, work / "mlgo", work / "service", guard) as pair:
        return build_pair(recipe, work, tc, pair, True, flags, pristine)


def pgo_build(
    recipe: Recipe,
    pristine: Path,
    work: Path,
    tc: Toolchain,
    problem: Problem,
    say: Callable,
    profile: Path | None = None,
) -> PGORow:
    """The PGO row's build beside WORK/plain (`pgo.pgo_row`), or where WORK/plain was
    built with the PROFILE, the build without it (`pgo.unprofiled_row`); its line said
    when it is left out."""
    plain, flags = work / "plain", problem_flags(problem)
    if profile is None:
        row = pgo_row(recipe, pristine, plain, tc, flags, True)
    else:
        row = unprofiled_row(recipe, pristine, plain, tc, flags, profile, True)
    if row.left_out:
        say(row.left_out)
    return row


def timed_builds(
    recipe: Recipe,
    pristine: Path,
    work: Path,
    tc: Toolchain,
    problem: Problem,
    ours: tuple[Path, Path | None, bool],
    row: PGORow,
    timing: tuple[int, float, int],
    say: Callable[[str], None],
    profile: Path | None = None,
) -> dict:
    """The workload's clock on WORK's builds (plain, mlgo and the PGO ROW's) in ROUNDS
    paired rounds of SECONDS each (TIMING: rounds, seconds, layouts), and over LAYOUTS
    shuffled layouts of plain, OURS (policy, decisions, guard) and the ROW's in
    WORK/layouts; plain and ours with the PROFILE if any."""
    layouts = timing[2]
    trees = {name: work / name for name in ("plain", "mlgo")}
    over = f", and over {layouts} shuffled layouts of each" if layouts else ""
    say(f"measuring the workload on {len(trees | row.timed())} builds ({timing[0]} rounds){over}")
    at, (policy, decisions, guard) = work / "layouts", ours
    root = sections_tree(at, "mlgo")
    ours_for_layouts = plain_and_ours(tc, policy, decisions, root, work / "service", guard)
    with ours_for_layouts if layouts else nullcontext(()) as pair:
        flags = problem_flags(problem, profile)
        return timed_beside_row(recipe, pristine, trees, row, pair, flags, at, tc, timing)
