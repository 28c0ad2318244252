"""Scoring policies by whole compiles of the training corpus, as every search does (ES, PPO,
BC-Max): the default heuristic's cost of each module, the pool of modules a trainer learns
on, and a policy's reward, the relative reduction of the problem's metric on a set of them.
A run may bring a reward of its own instead (`Reward`: a user's program on its workload).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import numpy as np

from mlgo.corpus.format import Corpus, Module
from mlgo.errors import UsageError
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import Problem
from mlgo.problems.policy import MLPPolicy
from mlgo.runtime.workers import Failed, Workers
from mlgo.train.evaluate import EvalTask, baseline, eval_one
from mlgo.train.loop import require_compiled

if TYPE_CHECKING:
    from mlgo.train.loop import Reward, Session


class Scorer:
    """Compiles modules with policies and scores each policy by the reduction of the
    problem's metric against the default heuristic: summed over the modules, or, with a
    regression penalty, per package (a package stands for a program: a policy that wins
    big in one and loses in others should not look good). It tells DROPPED every compile
    that failed."""

    def __init__(
        self,
        corpus: Corpus,
        tc: Toolchain,
        workers: Workers,
        problem: Problem,
        dropped: Callable[[list[str]], None],
        regression_penalty: float = 0.0,
    ):
        self.tc, self.workers, self.problem = tc, workers, problem
        self.metric = self.label = problem.reward_metric
        default = baseline(corpus, tc, workers, problem)
        # a module the default cannot be measured on stays out of the pool (training_pool)
        self.base, self.unmeasured = default.costs, default.unmeasured
        self.corpus = default.corpus  # its modules are the ones to compile
        self.penalty = regression_penalty
        self.dropped = dropped
        self.compiles = 0

    per_module = True  # a policy's reward on a batch is on those modules alone

    def default_costs(self) -> dict[str, float]:
        """Per module, the default heuristic's cost in the reward metric."""
        return {name: b[self.metric] for name, b in self.base.items()}

    def take_compiles(self) -> int:
        """The compiles since the last call, for the trainer to add to its run's count."""
        taken, self.compiles = self.compiles, 0
        return taken

    def reward(self, policy: MLPPolicy, modules: list[Module]) -> float:
        """One policy's reward on `modules` (see `rewards`)."""
        return float(self.rewards([policy], modules)[0])

    def rewards(self, policies: list[MLPPolicy], modules: list[Module]) -> np.ndarray:
        """Per policy: (sum default - sum policy) / sum default over `modules`, or with a
        penalty the mean over their packages of that reduction, losses scaled up. A module
        no policy compiled is left out for all (its fault, not theirs); a policy that failed
        on another is NaN. Raises TooFewCompiled where too few modules are left."""
        failed = np.zeros((len(policies), len(modules)), bool)
        costs = np.zeros((len(policies), len(modules)))
        tasks = [
            EvalTask(self.problem, m, self.tc.clang, p, tag=i * len(modules) + j)
            for i, p in enumerate(policies)
            for j, m in enumerate(modules)
        ]
        failures = []
        for task, r in self.workers.imap(eval_one, tasks):
            at = divmod(task.tag, len(modules))
            if isinstance(r, Failed):
                failed[at] = True
                failures.append(r.message)
            else:
                costs[at] = r[self.metric]
        self.compiles += len(tasks)
        self.dropped(failures)
        kept = ~failed.all(0)
        require_compiled(int(kept.sum()), len(modules), "modules")
        left = [m for m, k in zip(modules, kept, strict=True) if k]
        groups = sorted({m.package for m in left}) if self.penalty else [""]
        # [group, module]: each package's modules, or with no penalty one group of all
        in_group = np.array([[m.package == g or not self.penalty for m in left] for g in groups])
        base = in_group @ np.array([self.base[m.name][self.metric] for m in left])
        reward = penalized_reduction(base, costs[:, kept] @ in_group.T, self.penalty)
        return np.where(failed[:, kept].any(1), np.nan, reward)


def penalized_reduction(base: np.ndarray, costs: np.ndarray, penalty: float) -> np.ndarray:
    """base [groups], costs [policies, groups] -> [policies]: the mean over groups of
    the relative cost reduction, a loss counting (1 + penalty) times."""
    reduction = (base - costs) / base
    return np.where(reduction < 0, (1 + penalty) * reduction, reduction).mean(1)


def training_pool(
    corpus: Corpus,
    tc: Toolchain,
    workers: Workers,
    max_seconds: float,
    base: dict[str, float] | None = None,
) -> list[Module]:
    """The modules a trainer samples batches from: those with call sites that compile
    within `max_seconds` and, given the default's costs `base`, have a cost to lower
    (the others are still in every evaluation)."""
    from mlgo.corpus.stats import corpus_stats

    stats, _ = corpus_stats(corpus, tc.describe(), tc.clang, workers)
    pool = [
        m
        for m in corpus.modules
        if stats[m.name]["call_sites"] > 0
        and stats[m.name].get("seconds", 0.0) <= max_seconds
        and (base is None or base.get(m.name, 0.0) > 0)
    ]
    if not pool:
        raise UsageError(
            f"{corpus.root}: no module with call sites and a cost compiles within {max_seconds:g} s"
        )
    return pool


def scored_pool(
    run: Session, problem: Problem, max_module_seconds: float, regression_penalty: float = 0.0
) -> tuple[Reward, list[Module]]:
    """A scorer of RUN's corpus and its training pool (modules compiling within
    MAX_MODULE_SECONDS), noted in the run's state: the pool's size, and the modules the
    default cannot be measured on (left out). A run that brings its own reward scores by
    it, over every module (which it may not look at)."""
    if run.reward is not None:
        return run.reward, list(run.corpus.modules)
    scorer = Scorer(run.corpus, run.tc, run.workers, problem, run.dropped, regression_penalty)
    pool = training_pool(
        scorer.corpus, run.tc, run.workers, max_module_seconds, scorer.default_costs()
    )
    run.state.extra.update(pool=len(pool), unmeasured=scorer.unmeasured)
    return scorer, pool
