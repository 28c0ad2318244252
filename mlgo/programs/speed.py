"""Candidate policies of a speed problem judged as the user's program runs them.

A tune of the register allocator's eviction policy with a workload (`--bench`) does not
choose by the corpus's static cost: the frequency-weighted spill and reload count ranked
run time poorly (MLGO's team found the same, and left it for traces). Each candidate is
built instead from the user's source by their own build, mlgo-cc serving it, with the
block address map (`block_costs.BLOCK_MAP_FLAGS`, which changes no instruction); the
workload runs once under callgrind; and the build's blocks are costed on their exact runs
(`block_costs.workload_cost`: llvm-mca's cycles plus the 64-byte lines fetched). That sum
ranked measured CPU time better than any other reward tried, on the programs it was
chosen on and less well on one held out (docs/regalloc-eviction.md): a better judge than
the static cost, not a perfect one, so the report times both builds as well.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from mlgo.llvm.block_costs import BLOCK_MAP_FLAGS, Code, workload_cost
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import Recipe
from mlgo.problems import Problem
from mlgo.problems.policy_files import save_policy
from mlgo.programs.build import build_program, policy_service, problem_flags
from mlgo.programs.compare import Variant, variants
from mlgo.programs.measure import executed, prepare_workload, recipe_workload

if TYPE_CHECKING:
    from mlgo.problems.policy import MLPPolicy

JUDGE = "the workload's block cost (llvm-mca cycles + lines fetched, callgrind's counts)"


def workload_changes(
    policies: dict[str, MLPPolicy],
    recipe: Recipe,
    pristine: Path,
    work: Path,
    tc: Toolchain,
    problem: Problem,
) -> dict[str, float]:
    """Each of POLICIES' change of RECIPE's workload cost against the plain build at the
    problem's level: every build from PRISTINE in WORK (each tree removed once costed,
    its log kept)."""
    flags = [*problem_flags(problem), *BLOCK_MAP_FLAGS]
    known: dict[Code, float] = {}  # llvm-mca's cycles of code seen in an earlier build

    def cost(variant: Variant) -> float:
        tree = work / variant.name
        build_program(
            recipe, pristine, tree, tc, variant.name, variant.compilers, variant.env, False, flags
        )
        prepare_workload(recipe, tree, f"{recipe.name} ({variant.name}): bench")
        ran = executed(recipe_workload(recipe), tree, by_address=True)
        total = workload_cost(ran.by_object, tc, known).cycles_and_lines
        shutil.rmtree(tree)
        return total

    base = cost(variants(tc, {}, ("plain", ""))[0])
    changes = {}
    for i, (name, policy) in enumerate(policies.items()):
        saved = work / "policies" / f"candidate-{i}"
        save_policy(policy, saved)
        with policy_service([saved], work / "service") as env:
            changes[name] = cost(variants(tc, env, ("", f"candidate-{i}"))[1]) / base - 1
    return changes
