"""A finished speed tune's trained policy timed again against the tune's baseline, in more
rounds than the tune's own: the clock's word on a policy the workload's cost preferred.

  .venv/bin/python -m tools.retime_tune OUT --rounds 20 --seconds 3

OUT is a finished `mlgo tune --problem inlining-speed|regalloc-eviction --bench CMD`, with
or without --pgo. The project's commands come from OUT/tune.json and its source from the
tune's snapshot (OUT/pristine); the baseline is the tune's (with --pgo, the PGO build from
OUT/profile); the policy is OUT/train/policy, served as the tune's clock serves its
finalists (`WorkloadReward.clock`): both built, relinked at --layouts shuffled function
orders each, and timed in paired rounds with the A/A control. Written to OUT/retimed.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from mlgo.errors import USER_ERRORS
from mlgo.problems.policy_files import load_policy
from mlgo.programs.layouts import LAYOUTS
from mlgo.programs.report import throughput_change
from mlgo.programs.tune_run import TuneDir
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.messages import error_line
from tools.lab.tuned import tuned_reward

console = Console()


def retime(out: Path, rounds: int, seconds: float, layouts: int) -> None:
    tuned = TuneDir(out)
    reward = tuned_reward(tuned, tuned.kept_by_tool("retimed"), rounds, seconds, layouts)
    timed, control = reward.clock({"trained": load_policy(tuned.train / "policy")})
    baseline = "the PGO build" if reward.profile else "the plain build"
    name = reward.recipe.name
    for policy, change in timed.items():
        console.print(f"{name}: {policy} against {baseline}: {throughput_change(change)}")
    console.print(f"{name}: A/A: {throughput_change(control)}")
    result = {"rounds": rounds, "seconds": seconds, "timed": timed, "control": control}
    atomic_write_text(tuned.kept_by_tool("retimed.json"), json.dumps(result, indent=1))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a finished speed tune's directory")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--seconds", type=float, default=3.0, help="CPU a build and layout")
    parser.add_argument("--layouts", type=int, default=LAYOUTS)
    args = parser.parse_args()
    out = args.out.resolve()
    try:
        retime(out, args.rounds, args.seconds, args.layouts)
    except USER_ERRORS as e:
        sys.exit(f"retime_tune: {error_line(e)}")


if __name__ == "__main__":
    main()
