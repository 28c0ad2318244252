"""A speed problem's reward on the user's own program: what its build costs on their workload.

A tune of the register allocator's eviction policy with a workload (`--bench`) does not
train on the corpus's static cost: the frequency-weighted spill and reload count ranked
run time poorly (MLGO's team found the same, and moved to traces). Each policy a search
scores is built instead from the user's source by their own build, mlgo-cc serving it,
with the block address map (`block_costs.BLOCK_MAP_FLAGS`, which changes no instruction);
the workload runs once under callgrind; and the build's blocks are costed on their exact
runs (`block_costs.workload_cost`: llvm-mca's cycles plus the 64-byte lines fetched). That
sum ranked measured CPU time better than any other reward tried, on the programs it was
chosen on and less well on one held out (docs/regalloc-eviction.md): a better reward than
the static cost, not a perfect one, so the report times both builds as well.

A build per score is slow next to a module's compile, so the search takes few directions
(WORKLOAD_SEARCH), and every policy is built once (its cost is kept by its weights).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from mlgo.llvm.block_costs import BLOCK_MAP_FLAGS, Code, workload_cost
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import Recipe
from mlgo.problems import Problem
from mlgo.problems.policy_files import save_policy
from mlgo.programs.build import build_program, policy_service, problem_flags
from mlgo.programs.compare import Variant, variants
from mlgo.programs.measure import executed, prepare_workload, recipe_workload

if TYPE_CHECKING:
    from mlgo.corpus.format import Module
    from mlgo.problems.policy import MLPPolicy

LABEL = "the workload's block cost"
JUDGE = f"{LABEL} (llvm-mca cycles + lines fetched, callgrind's counts)"
# Evolution strategies on builds: 4 directions, 8 builds a step (a module's compile is
# cheap enough for 8 directions; a whole build and a callgrind run are not).
WORKLOAD_SEARCH = {"directions": 4}


def tree_cost(
    recipe: Recipe, tree: Path, tc: Toolchain, known: dict[Code, float], variant: str
) -> tuple[float, int]:
    """The build TREE of RECIPE (made with BLOCK_MAP_FLAGS) costed on its workload, run once
    under callgrind: the cost a speed tune trains on (`workload_cost`, reusing KNOWN's
    cycles), and the instructions callgrind counted."""
    prepare_workload(recipe, tree, f"{recipe.name} ({variant}): bench")
    ran = executed(recipe_workload(recipe), tree, by_address=True)
    return workload_cost(ran.by_object, tc, known).cycles_and_lines, ran.instructions


class WorkloadReward:
    """`train.loop.Reward` on RECIPE's workload: a policy's relative reduction of the
    workload cost against the plain build at the problem's level. Builds from PRISTINE in
    WORK, each tree removed once costed (its log kept)."""

    per_module = False  # every score is the whole program's
    label = LABEL

    def __init__(self, recipe: Recipe, pristine: Path, work: Path, tc: Toolchain, problem: Problem):
        self.recipe, self.pristine, self.work, self.tc = recipe, pristine, work, tc
        self.flags = [*problem_flags(problem), *BLOCK_MAP_FLAGS]
        self.known: dict[Code, float] = {}  # llvm-mca's cycles of code an earlier build had
        self.costs: dict[bytes, float] = {}  # by the policy's weights, gate and base
        self.base: float | None = None  # the plain build's, once built
        self.builds = 0

    def _cost(self, variant: Variant) -> float:
        tree = self.work / variant.name
        recipe, compilers = self.recipe, variant.compilers
        build_program(
            recipe, self.pristine, tree, self.tc, variant.name, compilers, variant.env, False,
            self.flags,
        )  # fmt: skip
        total, _ = tree_cost(recipe, tree, self.tc, self.known, variant.name)
        shutil.rmtree(tree)
        self.builds += 1
        return total

    def change(self, policy: MLPPolicy) -> float:
        """POLICY's workload cost against the plain build's, minus one (negative: cheaper)."""
        if self.base is None:
            self.base = self._cost(variants(self.tc, {}, ("plain", ""))[0])
        served = (policy.departure_threshold, policy.languages, policy.base)
        key = policy.flat().tobytes() + repr(served).encode()
        if key not in self.costs:
            saved = self.work / "policy"
            save_policy(policy, saved)
            # numpy serves a new policy at once; a native server would compile for it first
            with policy_service([saved], self.work / "service", backend="python") as env:
                self.costs[key] = self._cost(variants(self.tc, env, ("", "served"))[1])
        return self.costs[key] / self.base - 1

    def changes(self, policies: dict[str, MLPPolicy]) -> dict[str, float]:
        """Each of POLICIES' `change`: a tune's judge of its candidates."""
        return {name: self.change(policy) for name, policy in policies.items()}

    def rewards(self, policies: list[MLPPolicy], modules: list[Module]) -> np.ndarray:
        """The whole program's: MODULES, a search's batch, are all built anyway."""
        return np.array([-self.change(p) for p in policies])

    def reward(self, policy: MLPPolicy, modules: list[Module]) -> float:
        return -self.change(policy)

    def take_compiles(self) -> int:
        """The builds since the last call (a search's count of what it compiled)."""
        taken, self.builds = self.builds, 0
        return taken
