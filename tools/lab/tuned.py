"""A finished speed tune read back for the lab's tools: its workload reward, so that its
policies are costed or timed again after it, against the same baseline."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

from mlgo.llvm.toolchain import find_toolchain
from mlgo.programs.measure import Timing
from mlgo.programs.speed import WorkloadReward
from mlgo.programs.tune_run import TuneDir
from mlgo.runtime.commands import BuildError


def tuned_reward(
    out: TuneDir, work: Path, rounds: int, seconds: float, layouts: int
) -> WorkloadReward:
    """The workload reward of the finished speed tune at OUT, working in WORK: its project
    and workload (`TuneDir.tuned_recipe`, named as its report names it), its snapshot, and
    with --pgo its profile."""
    package = out.finished_report()["package"]
    recipe, problem, args = out.tuned_recipe()
    try:
        profile = out.profile if args["pgo"] else None
    except KeyError as e:
        raise BuildError(f"{out.arguments}: not a tune's arguments (no {e})") from e
    recipe = replace(recipe, name=package)
    if not recipe.bench or problem.aim != "speed":
        raise BuildError(f"{out.root}: not a speed tune with a workload")
    timing = Timing(rounds, seconds, layouts)
    return WorkloadReward(recipe, out.pristine, work, find_toolchain(), problem, timing, profile)
