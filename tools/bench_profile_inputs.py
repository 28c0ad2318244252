"""What the profile's counts carry in a tune that gave its policy them (`mlgo tune --pgo
--profile-inputs`): the trained policy against itself with those inputs taken away.

  .venv/bin/python -m tools.bench_profile_inputs OUT [--clock]

OUT is a finished tune with --profile-inputs. Both policies (OUT/train/policy, and the same
with the profile's inputs at zero weight, `MLPPolicy.deaf_to`) are built as the tune built
its candidates, side by side, and costed on the workload against the tune's baseline (the
PGO build): where the two costs are the same, the search gained nothing from the counts.
With --clock, both are also timed against it over shuffled layouts, with the A/A control.
Written to OUT/profile_inputs.json.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from rich.console import Console

from mlgo.errors import USER_ERRORS
from mlgo.problems.policy_files import load_policy
from mlgo.problems.profile_inputs import PROFILE_INPUTS, reads_profile
from mlgo.programs.layouts import LAYOUTS
from mlgo.programs.report import throughput_change
from mlgo.programs.tune_run import TuneDir
from mlgo.runtime.commands import BuildError
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.messages import error_line
from tools.lab.tuned import tuned_reward

console = Console()


def measure(out: Path, clock: bool, rounds: int, seconds: float, layouts: int) -> dict:
    tuned = TuneDir(out)
    reward = tuned_reward(tuned, tuned.kept_by_tool("profile-inputs"), rounds, seconds, layouts)
    trained = load_policy(tuned.train / "policy")
    if not reads_profile(trained.normalizer.features):
        raise BuildError(f"{out}: its trained policy reads no profile input (tuned without them)")
    policies = {"trained": trained, "without the counts": trained.deaf_to(tuple(PROFILE_INPUTS))}
    result: dict = {"cost_change_pct": {n: 100 * c for n, c in reward.changes(policies).items()}}
    for name, change in result["cost_change_pct"].items():
        console.print(f"{reward.recipe.name}: {name}, by the workload's cost: {change:+.2f}%")
    if clock:
        result["clock"], result["control"] = reward.clock(policies)
        for name, change in result["clock"].items():
            console.print(f"{reward.recipe.name}: {name}, CPU time: {throughput_change(change)}")
        console.print(f"{reward.recipe.name}: A/A: {throughput_change(result['control'])}")
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("out", type=Path, help="a finished tune with --profile-inputs")
    parser.add_argument("--clock", action="store_true", help="time both over layouts too")
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--seconds", type=float, default=1.0, help="CPU a build and layout")
    parser.add_argument("--layouts", type=int, default=LAYOUTS)
    args = parser.parse_args()
    out = args.out.resolve()
    try:
        result = measure(out, args.clock, args.rounds, args.seconds, args.layouts)
    except USER_ERRORS as e:
        sys.exit(f"bench_profile_inputs: {error_line(e)}")
    atomic_write_text(
        TuneDir(out).kept_by_tool("profile_inputs.json"), json.dumps(result, indent=1)
    )


if __name__ == "__main__":
    main()
