"""How long a speed tune takes to cost its candidates, one at a time or side by side.

  .venv/bin/python -m tools.bench_costing cmark jq --policies 6 --repeats 2 \\
      --work data/bench-tune

A speed tune scores every policy by building the project with mlgo-cc serving it and
running the workload under callgrind (`programs.speed.WorkloadReward`): its minutes go to
those builds. Each project's candidates here are clang's own decisions, served through
the ML advisor, at the first POLICIES inline thresholds of inlining-speed's grid (distinct
builds that need no training). They are costed in a fresh directory each pass, passes
alternating: as a tune did before (one at a time, each build configured afresh) and as it
does now (SIDE_BY_SIDE at once, each slot configured once, `build.configured_copy`).
Reported: each way's wall time a policy (median over the passes, the plain build apart),
the ratio, and whether every cost came out the same both ways (they are counted, not
timed, so they must).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.data import shipped_policy
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems import get_problem
from mlgo.problems.inlining_speed import THRESHOLDS
from mlgo.problems.policy_files import load_policy
from mlgo.programs.build import pristine_source
from mlgo.programs.speed import SIDE_BY_SIDE, WorkloadReward
from mlgo.train.calibrate import NEVER
from tools.lab.projects import PROJECTS, project_recipe

console = Console()
WAYS = {"before": (1, False), "now": (SIDE_BY_SIDE, True)}  # side by side, configure once


def passes(name: str, work: Path, policies: int, repeats: int) -> dict[str, list]:
    """NAME's candidates costed REPEATS times each way, alternating: each pass's seconds a
    policy and its costs."""
    recipe, tc = project_recipe(name), find_toolchain()
    source = pristine_source(recipe, work / name)
    speed = get_problem("inlining-speed")
    size = load_policy(shipped_policy("inlining-size"))
    shipped = replace(size, problem=speed, languages=None, guard=None)
    clangs = {
        f"-inline-threshold={b}": replace(shipped, departure_threshold=NEVER, base=b)
        for b in THRESHOLDS[:policies]
    }
    found: dict[str, list] = {way: [] for way in WAYS}
    for repeat in range(repeats):
        for way, (side_by_side, once) in WAYS.items():
            where = work / name / "costing" / f"{way}-{repeat}"
            shutil.rmtree(where, ignore_errors=True)
            reward = WorkloadReward(recipe, source, where, tc, speed)
            reward.side_by_side, reward.configure_once = side_by_side, once
            reward.changes({})  # the plain build, apart
            began = time.monotonic()
            costs = reward.changes(clangs)
            found[way].append(((time.monotonic() - began) / len(clangs), costs))
            console.print(f"{name} {way} pass {repeat + 1}: {found[way][-1][0]:.1f} s a policy")
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("projects", nargs="+", choices=sorted(PROJECTS))
    parser.add_argument("--policies", type=int, default=len(THRESHOLDS))
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--work", type=Path, default=Path("data/bench-tune"))
    args = parser.parse_args()
    table = Table(
        "project", "before: one at a time, configured each build (s a policy)",
        f"now: {SIDE_BY_SIDE} side by side, configured once (s a policy)", "speedup",
        "costs the same both ways", title="a speed tune's candidates costed on the workload",
    )  # fmt: skip
    for name in args.projects:
        found = passes(name, args.work.resolve(), args.policies, args.repeats)
        before, now = (statistics.median(s for s, _ in found[w]) for w in WAYS)
        same = all(costs == found["before"][0][1] for _, costs in found["before"] + found["now"])
        table.add_row(name, f"{before:.1f}", f"{now:.1f}", f"{before / now:.2f}x", str(same))
    console.print(table)


if __name__ == "__main__":
    main()
