"""Evolution strategies over the policy's weights (antithetic sampling, as MLGO's `es/`).

Each step samples a batch of training modules and K random directions, compiles the
batch with the policy moved +sigma and -sigma along each direction, and moves the weights
along the directions that lowered the batch's total cost the most (the problem's reward
metric, or a reward the run brings; rank-shaped fitness, Adam). A direction whose +sigma or
-sigma compile failed is left out of the step (a module that fails for every direction is
left out of their scores instead). Every `eval_every` steps
the current policy compiles the whole training pool; where a batch is the whole pool (a
small corpus, or a reward that scores the whole program, a workload's), each moved policy
is scored on it as well. The best one seen is the run's policy.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mlgo.options import MOST_PER_STEP, non_negative, positive
from mlgo.problems import Problem
from mlgo.problems.policy import MLPPolicy
from mlgo.train import Adam
from mlgo.train.loop import Candidate, Session, Step, Trainer, require_compiled
from mlgo.train.options import option
from mlgo.train.rollouts import scored_pool


@dataclass(frozen=True)
class ESConfig:
    steps: int = 40
    directions: int = field(
        default=8, metadata=option("perturbations per step", min=1, max=MOST_PER_STEP)
    )
    batch: int = field(
        default=24, metadata=option("modules compiled per step", min=1, max=MOST_PER_STEP)
    )
    sigma: float = field(
        default=0.05, metadata=option("perturbation scale of the weights", check=positive)
    )
    lr: float = field(default=0.02, metadata=option("Adam step size", check=positive))
    eval_every: int = 5
    max_module_seconds: float = field(
        default=2.0,
        metadata=option("modules that compile slower stay out of training", check=positive),
    )
    seed: int = 0
    # 0: reward the total reduction; > 0: the mean over packages of each package's
    # reduction, a package made worse counting (1 + penalty) times its loss
    regression_penalty: float = field(
        default=0.0,
        metadata=option("reward per package, a package's loss x (1 + this)", check=non_negative),
    )
    init: str = ""  # the --init run or policy, as given: its model card's starting point
    max_seconds: float = 0.0  # training time budget over all resumes (0: none)


def _ranks(values: np.ndarray) -> np.ndarray:
    """Centered ranks in [-0.5, 0.5]: robust to a few modules with outsized rewards."""
    ranks = np.empty(len(values))
    ranks[np.argsort(values)] = np.arange(len(values))
    return ranks / max(len(values) - 1, 1) - 0.5


class ES(Trainer[ESConfig]):
    """Evolution strategies as the module doc says; its checkpoint: the weights and Adam's."""

    name = "es"
    title = "evolution strategies"
    Config = ESConfig

    def reward_label(self, problem: Problem) -> str:
        if self.config.regression_penalty:  # the reward counts a package's loss more
            return f"{problem.reward_metric} (a loss counting more)"
        return problem.reward_metric

    def start(
        self, run: Session, init: MLPPolicy, arrays: dict[str, np.ndarray] | None
    ) -> float | None:
        cfg = self.config
        self.init = init
        self.scorer, self.pool = scored_pool(
            run, init.problem, cfg.max_module_seconds, cfg.regression_penalty
        )
        self.theta = init.flat().astype(np.float64)
        self.adam = Adam(self.theta.size, cfg.lr)
        if arrays is not None:
            self.theta = arrays["theta"]
            self.adam.restore(arrays)
            return None
        return self.scorer.reward(init, self.pool)

    def step(self, run: Session) -> Step:
        cfg = self.config
        rng = np.random.default_rng(cfg.seed + run.state.step)  # a resumed step is the same step
        batch = list(rng.choice(self.pool, min(cfg.batch, len(self.pool)), replace=False))
        eps = rng.standard_normal((cfg.directions, self.theta.size))
        candidates = [
            self.init.with_flat(self.theta + sign * cfg.sigma * e)
            for e in eps
            for sign in (1.0, -1.0)
        ]
        r = self.scorer.rewards(candidates, batch)  # NaN: a compile of that one failed
        # a pair is the estimate of one direction: it counts whole or not at all
        whole = ~np.isnan(r.reshape(cfg.directions, 2)).any(1)
        require_compiled(int(whole.sum()), cfg.directions, "perturbation pairs")
        kept = r.reshape(cfg.directions, 2)[whole]
        shaped = _ranks(kept.ravel()).reshape(-1, 2)
        grad = ((shaped[:, 0] - shaped[:, 1])[:, None] * eps[whole]).sum(0) / (
            2 * len(kept) * cfg.sigma
        )
        self.theta = self.adam.step(self.theta, grad)
        metrics = {
            "es/batch_reward_mean": float(kept.mean()),
            "es/batch_reward_max": float(kept.max()),
        }
        scored = None
        if len(batch) == len(self.pool) or not self.scorer.per_module:
            # the batch's rewards are the pool's: its best policy is a candidate as it is
            best = int(np.nanargmax(r))
            scored = Candidate(candidates[best], float(r[best]))
        if run.due(cfg.eval_every):
            current = self.init.with_flat(self.theta)
            reward = self.scorer.reward(current, self.pool)
            metrics["es/pool_reward"] = reward
            if scored is None or reward > scored.reward:
                scored = Candidate(current, reward)
        run.state.compiles += self.scorer.take_compiles()
        return Step(metrics, scored)

    def next_step_seconds(self, run: Session, steps_done: int) -> float:
        """A step as long as the steps so far on average: each compiles as many candidates
        (on a workload's reward, a build each), so a budget does not begin one it cannot
        finish."""
        return run.state.seconds / steps_done

    def arrays(self) -> dict[str, np.ndarray]:
        return {"theta": self.theta, **self.adam.state()}


TRAINER = ES
