"""A speed problem's reward on the user's own program: what its build costs on their workload.

A tune of the register allocator's eviction policy with a workload (`--bench`) does not
train on the corpus's static cost: the frequency-weighted spill and reload count ranked
run time poorly (MLGO's team found the same, and moved to traces). Each policy a search
scores is built instead from the user's source by their own build, mlgo-cc serving it,
with the block address map (`block_costs.BLOCK_MAP_FLAGS`, which changes no instruction);
the workload runs once under callgrind; and the build's blocks are costed on their exact
runs (`block_costs.workload_cost`: llvm-mca's cycles plus the 64-byte lines fetched). That
sum ranked measured CPU time better than any other reward tried, on the programs it was
chosen on and less well on one held out (docs/records/regalloc-eviction.md): a better reward than
the static cost, not a perfect one, so the report times both builds as well.

A build per score is slow next to a module's compile, so the search takes few directions
(WORKLOAD_SEARCH), and every policy is built once (its cost is kept by its weights).
"""

from __future__ import annotations

import hashlib
import json
import math
import shutil
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import replace
from pathlib import Path
from queue import SimpleQueue
from typing import TYPE_CHECKING

import numpy as np

from mlgo.llvm.block_costs import BLOCK_MAP_FLAGS, Code, workload_cost
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import Recipe
from mlgo.problems import Problem
from mlgo.problems.policy_files import save_policy
from mlgo.programs.build import Building, Variant, build_program, policy_service, problem_flags
from mlgo.programs.compare import variants
from mlgo.programs.layouts import LAYOUTS, layout_trees, layouts_throughput
from mlgo.programs.measure import (
    AGAIN,
    Timing,
    executed,
    in_percent,
    paired_change,
    prepare_workload,
    recipe_workload,
    rounds_against_control,
    workload_output,
)
from mlgo.runtime.commands import BuildError
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.inputs import read_json

if TYPE_CHECKING:
    from mlgo.corpus.format import Module
    from mlgo.problems.policy import MLPPolicy
    from mlgo.programs.tune_run import TuneRun

LABEL = "the workload's block cost"
JUDGE = f"{LABEL} (llvm-mca cycles + lines fetched, callgrind's counts)"
# Evolution strategies on builds: 4 directions, 8 builds a step (a module's compile is
# cheap enough for 8 directions; a whole build and a callgrind run are not).
WORKLOAD_SEARCH = {"directions": 4}
# Policies built and costed at once: one build's serial stretches (its configure, its links,
# the workload's run under callgrind) leave a core idle that the other one's compiles take
SIDE_BY_SIDE = 2
TIMING = Timing(10, 1.0, LAYOUTS)  # a reward's clock by default: 10 rounds of 1 s, 4 layouts


def tree_cost(
    recipe: Recipe, tree: Path, tc: Toolchain, known: dict[Code, float], variant: str
) -> tuple[float, int]:
    """The build TREE of RECIPE (made with BLOCK_MAP_FLAGS) costed on its workload, run once
    under callgrind: the cost a speed tune trains on (`workload_cost`, reusing KNOWN's
    cycles), and the instructions callgrind counted."""
    prepare_workload(recipe, tree, f"{recipe.name} ({variant}): bench")
    ran = executed(recipe_workload(recipe), tree, by_address=True)
    return workload_cost(ran.by_object, tc, known).cycles_and_lines, ran.instructions


def workload_reward(run: TuneRun) -> WorkloadReward | None:
    """What a tune of a speed problem given a workload trains on and judges by: the
    workload's cost on each policy's build (in OUT/judged), and its clock in the bench's
    rounds (each build with the profile, if any). None for the others: they train on the
    corpus's cost."""
    if run.problem.aim == "speed" and run.recipe.bench:
        return WorkloadReward(
            run.recipe, run.pristine, run.out.judged, run.tc, run.problem, run.opts.timing,
            run.profile,
        )  # fmt: skip
    return None


class WorkloadReward:
    """`train.loop.Reward` on RECIPE's workload: a policy's relative reduction of the
    workload cost against the plain build at the problem's level. Builds from PRISTINE in
    WORK, `side_by_side` at once, each tree configured once (`configure_once`:
    WORK/configured) and removed once costed (its log kept); the costs are kept in
    WORK/costs.json, so that a tune killed while judging does not build them again.
    `clock` times the best of them in TIMING's rounds, as built and over its layouts. With
    a PROFILE, every build uses its counts (the plain build is then the PGO build)."""

    per_module = False  # every score is the whole program's
    label = LABEL
    # how candidates are built: a benchmark's knobs (tools/bench_costing.py), set on an
    # instance to cost them one at a time or configured each build
    side_by_side = SIDE_BY_SIDE
    configure_once = True

    def __init__(
        self,
        recipe: Recipe,
        pristine: Path,
        work: Path,
        tc: Toolchain,
        problem: Problem,
        timing: Timing = TIMING,
        profile: Path | None = None,
    ):
        self.recipe, self.pristine, self.work, self.tc = recipe, pristine, work, tc
        self.profile, self.flags = profile, problem_flags(problem, profile)
        self.rounds, self.seconds, self.layouts = timing
        self.known: dict[Code, float] = {}  # llvm-mca's cycles of code an earlier build had
        self.costs: dict[str, float] = {}  # by `_key`; "plain": the plain build's
        self.build_seconds: dict[str, float] = {}  # the wall time of each one's build and cost
        for kept, name in ((self.costs, COSTS), (self.build_seconds, SECONDS)):
            if (work / name).is_file():
                kept.update(read_costs(work / name))
        self.builds = 0
        self._lock = threading.Lock()  # over the costs, their files and the count of builds

    def _build(
        self, variant: Variant, tree: Path, flags: list[str], configured: Path | None = None
    ) -> Path:
        how = Building(tests=False, configured=configured)
        build_program(self.recipe, self.pristine, tree, self.tc, variant, flags, how)
        with self._lock:
            self.builds += 1
        return tree

    def _cost(self, key: str, variant: Variant) -> float:
        if key not in self.costs:
            began = time.monotonic()
            flags = [*self.flags, *BLOCK_MAP_FLAGS]
            # every candidate's configure is the same
            kept = self.work / "configured" / variant.name if self.configure_once else None
            tree = self._build(variant, self.work / variant.name, flags, kept)
            cost, _ = tree_cost(self.recipe, tree, self.tc, self.known, variant.name)
            shutil.rmtree(tree)
            with self._lock:
                self.costs[key], self.build_seconds[key] = cost, time.monotonic() - began
                atomic_write_text(self.work / COSTS, json.dumps(self.costs, indent=1))
                atomic_write_text(self.work / SECONDS, json.dumps(self.build_seconds, indent=1))
        return self.costs[key]

    def seconds_for(self, builds: int, finalists: int = 0) -> float:
        """How long BUILDS policies not costed yet take to build and cost, and then timing
        FINALISTS of them by `clock`, as this machine built and costed the builds so far (0:
        none yet), side by side: the clock builds each finalist and the plain build
        again (relinked at each layout), one at a time, and runs its rounds (each build at
        each layout, the plain one twice)."""
        if not self.build_seconds:
            return 0.0
        build = statistics.median(self.build_seconds.values())
        costed = build * math.ceil(builds / self.side_by_side)
        if not finalists:
            return costed
        rounds = self.rounds * (finalists + 2) * max(self.layouts, 1) * self.seconds
        return costed + build * (finalists + 1) + rounds

    @contextmanager
    def _served(self, policy: MLPPolicy, slot: int = 0) -> Iterator[Variant]:
        """mlgo-cc serving POLICY, in SLOT's own directories (of those side by side): the
        clang plugin where the problem has one (linked for a new policy in about a second;
        the only backend that computes the profile's inputs), else numpy, which serves a
        new policy at once (a native server would compile for it first)."""
        saved = self.work / f"policy-{slot}"
        save_policy(policy, saved)
        service = self.work / f"service-{slot}"
        backend = "plugin" if policy.problem.plugin else "python"
        with policy_service([saved], service, backend=backend) as env:
            yield variants(self.tc, env, ("", f"served-{slot}"))[1]

    def change(self, policy: MLPPolicy, slot: int = 0) -> float:
        """POLICY's workload cost against the plain build's, minus one (negative: cheaper),
        built in SLOT's directories."""
        base = self._cost("plain", variants(self.tc, {}, ("plain", ""))[0])
        key = _key(policy)
        if key not in self.costs:
            with self._served(policy, slot) as served:
                self._cost(key, served)
        return self.costs[key] / base - 1

    def changes(self, policies: dict[str, MLPPolicy]) -> dict[str, float]:
        """Each of POLICIES' `change`, built and costed side by side, each in its
        own tree (every score is counted, not timed, so two builds sharing the machine
        change none; a workload that writes outside its tree should not be run twice at
        once): a tune's judge of its candidates, and a search's batch."""
        self._cost("plain", variants(self.tc, {}, ("plain", ""))[0])  # first, and once
        unique = {_key(p): p for p in policies.values()}  # twins built once
        slots: SimpleQueue[int] = SimpleQueue()
        for slot in range(self.side_by_side):
            slots.put(slot)

        def in_a_slot(policy: MLPPolicy) -> float:
            slot = slots.get()
            try:
                return self.change(policy, slot)
            finally:
                slots.put(slot)

        with ThreadPoolExecutor(self.side_by_side) as pool:
            list(pool.map(in_a_slot, unique.values()))
        return {name: self.change(policy) for name, policy in policies.items()}

    def _timed_trees(self, variant: Variant, name: str) -> dict[int, Path]:
        """VARIANT built for the clock as a user's build serves it (no block map) under
        NAME, its workload prepared: at each of its layouts (`layout_trees`), by seed, or
        with no layouts as built (seed 0)."""
        where, named = self.work / "clock", replace(variant, name=name)
        if self.layouts:
            return layout_trees(
                self.recipe, self.pristine, where, self.tc, named, self.flags, self.layouts
            )
        tree = self._build(named, where / name, self.flags)
        prepare_workload(self.recipe, tree, f"{self.recipe.name} ({name}): bench")
        return {0: tree}

    def clock(self, policies: dict[str, MLPPolicy]) -> tuple[dict[str, dict], dict]:
        """POLICIES and the plain build timed on the workload over the reward's layouts
        (`layouts_throughput`; with none, as built: `rounds_against_control`), in paired
        rounds with the A/A control: each one's CPU time change in percent (median and
        IQR), and the control's. A build whose workload prints another result than the
        plain build's is left out (a policy that changes what the program does is never
        kept). The trees are removed once timed."""
        workload = recipe_workload(self.recipe)
        trees = {"plain": self._timed_trees(variants(self.tc, {}, ("", ""))[0], "plain")}
        expected = workload_output(workload, next(iter(trees["plain"].values())))
        for i, (name, policy) in enumerate(policies.items()):
            with self._served(policy) as served:
                placed = self._timed_trees(served, f"candidate-{i}")
            if workload_output(workload, next(iter(placed.values()))) == expected:
                trees[name] = placed
        if self.layouts:
            changes = layouts_throughput(self.recipe, trees, self.rounds, self.seconds)
        else:
            as_built = {n: placed[0] for n, placed in trees.items()}
            _, times = rounds_against_control(workload, as_built, self.rounds, self.seconds)
            cpu = times["cpu"]
            changes = {n: in_percent(paired_change(cpu[n], cpu["plain"])) for n in cpu}
        shutil.rmtree(self.work / "clock")
        return {n: changes[n] for n in trees if n != "plain"}, changes["plain" + AGAIN]

    def rewards(self, policies: list[MLPPolicy], modules: list[Module]) -> np.ndarray:
        """The whole program's: MODULES, a search's batch, are all built anyway."""
        changes = self.changes({str(i): p for i, p in enumerate(policies)})
        return -np.array(list(changes.values()))

    def reward(self, policy: MLPPolicy, modules: list[Module]) -> float:
        return -self.change(policy)

    def take_compiles(self) -> int:
        """The builds since the last call (a search's count of what it compiled)."""
        taken, self.builds = self.builds, 0
        return taken


COSTS = "costs.json"
SECONDS = "build-seconds.json"  # each costed build's wall time, for `seconds_for`


def _key(policy: MLPPolicy) -> str:
    """What a policy's build depends on: its weights, and where and how it is served."""
    served = (policy.departure_threshold, policy.languages, policy.base)
    return hashlib.sha256(policy.flat().tobytes() + repr(served).encode()).hexdigest()


def read_costs(path: Path) -> dict[str, float]:
    """A WorkloadReward's kept costs (or its builds' seconds); what is not a table of
    numbers is refused, naming it."""
    try:
        costs = read_json(path, BuildError)
    except OSError as e:
        raise BuildError(f"{path}: unreadable ({e}); remove it to cost every build again") from e
    except BuildError as e:
        raise BuildError(f"{e}; remove it to cost every build again") from e
    if not isinstance(costs, dict) or not all(
        isinstance(c, int | float) and not isinstance(c, bool) and math.isfinite(c) and c > 0
        for c in costs.values()
    ):
        raise BuildError(f"{path}: not a table of positive costs; remove it to cost them again")
    return costs
