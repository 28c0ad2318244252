"""The builds a tune reports, and their timing: plain clang at the problem's level, ours
(from the tune's decisions by plain clang; for eviction, which clang cannot replay, mlgo-cc
serving the policy), the PGO build a performance engineer would make anyway (`pgo`), and
the workload's clock on them, as built and over shuffled layouts (`layouts`): each layout
of ours is built the same way as ours, so that every figure is of the build that ships.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING

from mlgo.llvm.toolchain import Toolchain
from mlgo.programs.build import Variant, policy_service, problem_flags
from mlgo.programs.compare import build_pair, variants
from mlgo.programs.decide import from_decisions
from mlgo.programs.layouts import sections_tree
from mlgo.programs.pgo import PGORow, pgo_row, timed_beside_row, unprofiled_row
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.inputs import read_json

if TYPE_CHECKING:
    from mlgo.programs.tune_run import TuneRun


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


def build_stage(run: TuneRun) -> None:
    """A tune's two builds (`build_pair`), configured, built and tested from its snapshot
    in OUT/programs/plain (clang at the problem's level, with the profile if any) and
    OUT/programs/mlgo (`plain_and_ours`), recorded in OUT/programs/builds.json. A failing
    build or test raises BuildError naming its log."""
    recipe, work, decisions = run.recipe, run.out.programs, run.decisions
    tests = ", with tests" if recipe.test else " (no --test: tests not run)"
    ours = f"plain clang from {decisions}" if decisions else "mlgo-cc"
    run.say(f"building {recipe.name} twice (clang {run.baseline}, and {ours}){tests}")
    flags = problem_flags(run.problem, run.profile)
    served = (run.out.policy, decisions, work / "mlgo", work / "service", run.opts.guard)
    with plain_and_ours(run.tc, *served) as pair:
        built = build_pair(recipe, work, run.tc, pair, True, flags, run.pristine)
    atomic_write_text(run.out.builds, json.dumps([b.to_json() for b in built]))


def pgo_stage(run: TuneRun) -> None:
    """With a workload, the PGO row's build beside OUT/programs/plain (`pgo.pgo_row`), or
    where that was built with the tune's profile, the build without it
    (`pgo.unprofiled_row`); its line said when it is left out. Recorded (an empty row
    too) in OUT/programs/pgo.json."""
    recipe, profile, row = run.recipe, run.profile, PGORow()
    if recipe.bench and run.opts.pgo_row:
        how = "without the profile, beside" if profile else "with the workload's profile, for"
        run.say(f"building {recipe.name} {how} the PGO row")
        plain, flags = run.out.programs / "plain", problem_flags(run.problem)
        if profile is None:
            row = pgo_row(recipe, run.pristine, plain, run.tc, flags, True)
        else:
            row = unprofiled_row(recipe, run.pristine, plain, run.tc, flags, profile, True)
        if row.left_out:
            run.say(row.left_out)
    atomic_write_text(run.out.pgo_row, json.dumps(asdict(row)))


def bench_stage(run: TuneRun) -> None:
    """With a workload, its clock on the tune's builds (plain, mlgo and the PGO row's) in
    paired rounds, and over shuffled layouts of plain, ours and the row's in
    OUT/programs/layouts; plain and ours with the profile if any: OUT/throughput.json."""
    if not run.recipe.bench:
        return
    work, timing, row = run.out.programs, run.opts.timing, PGORow(**read_json(run.out.pgo_row))
    trees = {name: work / name for name in ("plain", "mlgo")}
    over = f", and over {timing.layouts} shuffled layouts of each" if timing.layouts else ""
    count = len(trees | row.timed())
    run.say(f"measuring the workload on {count} builds ({timing.rounds} rounds){over}")
    at = work / "layouts"
    served = (run.out.policy, run.decisions, sections_tree(at, "mlgo"), work / "service")
    ours_for_layouts = plain_and_ours(run.tc, *served, run.opts.guard)
    with ours_for_layouts if timing.layouts else nullcontext(()) as pair:
        flags = problem_flags(run.problem, run.profile)
        builds = [(v, flags) for v in pair]
        speed = timed_beside_row(run.recipe, run.pristine, trees, row, builds, run.tc, timing)
    atomic_write_text(run.out.throughput, json.dumps(speed, indent=1))
