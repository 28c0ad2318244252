"""Evolution strategies over the policy's weights (antithetic sampling, as MLGO's `es/`).

Each step samples a batch of training modules and K random directions, compiles the
batch with the policy moved +sigma and -sigma along each direction, and moves the weights
along the directions that lowered the batch's total cost the most (the problem's reward
metric: .text bytes, or weighted spill/reload cost; rank-shaped fitness, Adam). Every
`eval_every` steps the current policy compiles the whole training
pool; the best one seen is the run's policy.
"""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass

import numpy as np
from rich.progress import Progress

from mlgo.corpus.compile import CompileError
from mlgo.corpus.format import Corpus, Module
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import Problem
from mlgo.problems.policy import MLPPolicy
from mlgo.runtime.workers import Failed, Workers
from mlgo.train import Adam, RunDir, RunState, bar_total, progress, stops_after
from mlgo.train.evaluate import EvalTask, baseline, eval_one


@dataclass(frozen=True)
class ESConfig:
    steps: int = 40
    directions: int = 8
    batch: int = 24
    sigma: float = 0.05
    lr: float = 0.02
    eval_every: int = 5
    max_module_seconds: float = 2.0  # modules slower than this stay out of ES batches
    seed: int = 0
    # 0: reward the total reduction; > 0: the mean over packages of each package's
    # reduction, a package made worse counting (1 + penalty) times its loss
    regression_penalty: float = 0.0
    init: str = ""  # the --init run or policy, as given: its model card's starting point
    max_seconds: float = 0.0  # training time budget over all resumes (0: none), see stops_after


def _ranks(values: np.ndarray) -> np.ndarray:
    """Centered ranks in [-0.5, 0.5]: robust to a few modules with outsized rewards."""
    ranks = np.empty(len(values))
    ranks[np.argsort(values)] = np.arange(len(values))
    return ranks / max(len(values) - 1, 1) - 0.5


class Scorer:
    """Compiles modules with policies and scores each policy by the reduction of the
    problem's metric against the default heuristic: summed over the modules, or, with a
    regression penalty, per package (a package stands for a program: a policy that wins
    big in one and loses in others should not look good)."""

    def __init__(
        self,
        corpus: Corpus,
        tc: Toolchain,
        workers: Workers,
        problem: Problem,
        regression_penalty: float = 0.0,
    ):
        self.tc, self.workers, self.problem = tc, workers, problem
        self.metric = problem.reward_metric
        # a module the default cannot be measured on stays out of the pool (training_pool)
        self.base, self.unmeasured = baseline(corpus, tc, workers, problem)
        self.penalty = regression_penalty
        self.compiles = 0

    def rewards(self, policies: list[MLPPolicy], modules: list[Module]) -> np.ndarray:
        """Per policy: (sum default - sum policy) / sum default over `modules`, or with a
        penalty the mean over their packages of that reduction, losses scaled up."""
        groups = sorted({m.package for m in modules}) if self.penalty else [""]
        group = [groups.index(m.package) if self.penalty else 0 for m in modules]
        costs = np.zeros(len(policies) * len(groups))  # [policy, group], flat as the tags
        tasks = [
            EvalTask(self.problem, m, self.tc.clang, p, tag=i * len(groups) + g)
            for i, p in enumerate(policies)
            for m, g in zip(modules, group, strict=True)
        ]
        for task, r in self.workers.imap(eval_one, tasks):
            if isinstance(r, Failed):
                raise CompileError(f"ES compile failed: {r.message}")
            costs[task.tag] += r[self.metric]
        self.compiles += len(tasks)
        base = np.zeros(len(groups))
        for m, g in zip(modules, group, strict=True):
            base[g] += self.base[m.name][self.metric]
        return penalized_reduction(base, costs.reshape(len(policies), len(groups)), self.penalty)


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
        raise ValueError(
            f"{corpus.root}: no module with call sites and a cost compiles within {max_seconds:g} s"
        )
    return pool


def train_es(
    corpus: Corpus,
    init: MLPPolicy,
    run: RunDir,
    tc: Toolchain,
    workers: Workers,
    cfg: ESConfig = ESConfig(),
) -> MLPPolicy:
    scorer = Scorer(corpus, tc, workers, init.problem, cfg.regression_penalty)
    metric = init.problem.reward_metric
    if cfg.regression_penalty:  # the reward counts a package's loss more than its gain
        metric += " (a loss counting more)"
    costs = {name: b[scorer.metric] for name, b in scorer.base.items()}
    pool = training_pool(corpus, tc, workers, cfg.max_module_seconds, costs)
    theta = init.flat().astype(np.float64)
    adam = Adam(theta.size, cfg.lr)
    state = RunState(
        "es",
        extra={
            "config": asdict(cfg),
            "best_reward": -np.inf,
            "pool": len(pool),
            "unmeasured": scorer.unmeasured,  # the default's compile fails: left out
        },
    )
    best = theta.copy()
    if (saved := run.load_state()) is not None:
        state, arrays = saved
        theta, best = arrays["theta"], arrays["best"]
        adam.restore(arrays)
    else:  # the starting point is the first candidate for best
        state.extra["best_reward"] = float(scorer.rewards([init], pool)[0])
        state.extra["init_reward"] = state.extra["best_reward"]
        init.save(run.policy_dir)
    start = time.monotonic()
    with Progress() as bar:
        job = bar.add_task(
            "evolution strategies",
            total=bar_total(cfg.steps, cfg.max_seconds),
            completed=state.step,
        )
        while not stops_after(state, cfg.steps, state.seconds, cfg.max_seconds):
            rng = np.random.default_rng(cfg.seed + state.step)  # a resumed step is the same step
            batch = list(rng.choice(pool, min(cfg.batch, len(pool)), replace=False))
            eps = rng.standard_normal((cfg.directions, theta.size))
            candidates = [
                init.with_flat(theta + sign * cfg.sigma * e) for e in eps for sign in (1.0, -1.0)
            ]
            r = scorer.rewards(candidates, batch)
            shaped = _ranks(r).reshape(cfg.directions, 2)
            grad = ((shaped[:, 0] - shaped[:, 1])[:, None] * eps).sum(0) / (
                2 * cfg.directions * cfg.sigma
            )
            theta = adam.step(theta, grad)
            state.step += 1
            metrics = {
                "es/batch_reward_mean": float(r.mean()),
                "es/batch_reward_max": float(r.max()),
            }
            elapsed = state.seconds + time.monotonic() - start
            last = stops_after(state, cfg.steps, elapsed, cfg.max_seconds)
            if state.step % cfg.eval_every == 0 or last:
                pool_reward = float(scorer.rewards([init.with_flat(theta)], pool)[0])
                metrics["es/pool_reward"] = pool_reward
                if pool_reward > state.extra["best_reward"]:
                    state.extra["best_reward"] = pool_reward
                    best = theta.copy()
                    init.with_flat(best).save(run.policy_dir)  # a stopped run keeps its best
            state.compiles += scorer.compiles
            scorer.compiles = 0
            state.seconds += time.monotonic() - start
            start = time.monotonic()
            state.history.append({"step": state.step, "compiles": state.compiles, **metrics})
            run.save_state(state, {"theta": theta, "best": best, **adam.state()})
            run.scalars(state.step, metrics)
            bar.update(
                job,
                completed=state.step,
                description=progress("evolution strategies", metric, state.extra["best_reward"]),
            )
            if last:  # the step count or the time budget is reached
                break
    policy = init.with_flat(best)
    policy.save(run.policy_dir)
    return policy
