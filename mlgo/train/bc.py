"""Behavioral cloning: fit the policy network to the compiler's own decisions.

This is the warm start for the other trainers: a policy that already decides like the
default heuristic from LLVM's features alone (not from `inlining_default`, which a
release-mode LLVM does not compute), so that search starts from -Oz's size, not from a
random policy's.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cache
from typing import TYPE_CHECKING

import numpy as np
from rich.progress import Progress

from mlgo.corpus.format import Corpus
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import Problem
from mlgo.problems.policy import MLPPolicy, policy_class
from mlgo.problems.policy_files import save_policy
from mlgo.records import Decisions
from mlgo.runtime.workers import Workers
from mlgo.train import CHECKPOINT_COPIES, Adam, Outcome, RunDir, RunState
from mlgo.train.options import option

if TYPE_CHECKING:
    from mlgo.train.loop import Reward


@cache
def _jitted_loss_and_grad() -> Callable:
    """The weighted cross-entropy and its gradient, compiled once by JAX."""
    import jax
    import optax

    def loss(ws: list, x: np.ndarray, y: np.ndarray, weight: np.ndarray, offset: np.ndarray):
        h = x
        for i in range(0, len(ws), 2):
            h = h @ ws[i] + ws[i + 1]
            if i + 2 < len(ws):
                h = jax.nn.relu(h)
        h = h.reshape(offset.shape) + offset
        per = optax.softmax_cross_entropy_with_integer_labels(h, y)
        return (per * weight).sum() / weight.sum()

    return jax.jit(jax.value_and_grad(loss))


def _loss_and_grad(
    policy: MLPPolicy, x: np.ndarray, y: np.ndarray, weight: np.ndarray, offset: np.ndarray
) -> tuple[float, np.ndarray]:
    """x: normalized rows (one per decision, or one per candidate slot); the network's
    outputs are regrouped per decision and `offset` (MASKED on illegal slots) added."""
    loss, grads = _jitted_loss_and_grad()(policy.weights, x, y, weight, offset)
    return float(loss), np.concatenate([np.asarray(g).reshape(-1) for g in grads])


def accuracy(policy: MLPPolicy, raw: np.ndarray, y: np.ndarray) -> dict[str, float]:
    pred = policy.predict(raw)
    out = {"accuracy": float((pred == y).mean())}
    for c in policy.classes:
        if (y == c).any():
            out[f"recall_{c}"] = float((pred[y == c] == c).mean())
    return out


def train_bc(
    data: Decisions,
    problem: Problem,
    run: RunDir,
    epochs: int = 30,
    lr: float = 3e-3,
    batch: int = 1024,
    seed: int = 0,
    derived: bool = False,
    init: MLPPolicy | None = None,
) -> tuple[MLPPolicy, dict[str, float]]:
    """Trains (or resumes training) a BC policy on the answers in `data.default`; saves
    it to run.policy_dir.

    With `derived`, the network also sees the problem's derived inputs (for inlining, the
    default's own cost-vs-threshold rule): it then matches the default almost exactly,
    also on unseen code, but sits in a flat spot that weight-space search leaves slowly.
    With `init`, training starts from that policy (its shape and normalization) instead
    of a fresh one: BC-Max clones better trajectories into its current policy.
    """
    rng = np.random.default_rng(seed)
    if init is None:
        policy, x, weight, offset = policy_class(problem).for_cloning(problem, data, seed, derived)
    else:
        policy, (x, weight, offset) = init, init.cloning_inputs(data)
    adam = Adam(policy.flat().size, lr)
    state = RunState("bc")
    if (saved := run.load_state(CHECKPOINT_COPIES * policy.flat().size)) is not None:
        state, arrays = saved
        policy = policy.with_flat(arrays["theta"])
        adam.restore(arrays)
        rng = np.random.default_rng(seed + state.step)
    rows = x.shape[0] // len(data.default)  # network rows per decision
    start = time.monotonic()
    with Progress() as bar:
        job = bar.add_task("behavioral cloning", total=epochs, completed=state.step)
        while state.step < epochs:
            order = rng.permutation(len(data.default))
            losses = []
            for i in range(0, len(order), batch):
                idx = order[i : i + batch]
                xi = x.reshape(len(order), rows, -1)[idx].reshape(len(idx) * rows, -1)
                loss, grad = _loss_and_grad(policy, xi, data.default[idx], weight[idx], offset[idx])
                policy = policy.with_flat(adam.step(policy.flat(), -grad).astype(np.float32))
                losses.append(loss)
            state.step += 1
            metrics = {"loss": float(np.mean(losses)), **accuracy(policy, data.x, data.default)}
            state.history.append({"epoch": state.step, **metrics})
            state.seconds += time.monotonic() - start
            start = time.monotonic()
            run.save_state(state, {"theta": policy.flat(), **adam.state()})
            run.scalars(state.step, {f"bc/{k}": v for k, v in metrics.items()})
            bar.update(
                job,
                completed=state.step,
                description=f"behavioral cloning (acc {metrics['accuracy']:.4f})",
            )
    save_policy(policy, run.policy_dir)
    return policy, accuracy(policy, data.x, data.default)


@dataclass(frozen=True)
class BCConfig:
    steps: int = 30  # epochs
    derived: bool = field(default=False, metadata=option("also feed the default's cost rule"))


class BC:
    """`mlgo train --algo bc`: the default traces of the corpus, collected into the run
    once, then imitated. No search, so no start policy and no loop (mlgo.train.loop)."""

    name = "bc"
    Config = BCConfig
    uses_start = False

    def __init__(self, config: BCConfig):
        self.config = config

    @classmethod
    def refuses(cls, problem: Problem) -> str | None:
        return None  # every problem's default answers can be imitated

    def train(
        self,
        corpus: Corpus,
        problem: Problem,
        start: MLPPolicy | None,
        run_dir: RunDir,
        tc: Toolchain,
        workers: Workers,
        reward: Reward | None = None,
    ) -> Outcome:
        """The default's answers imitated: no reward is scored (`run` refuses one)."""
        from mlgo.traces.collect import collect
        from mlgo.traces.dataset import load_decisions

        manifest = collect(problem, corpus, run_dir.traces_dir, tc, workers)
        data = load_decisions(run_dir.traces_dir, problem)
        policy, accuracy = train_bc(
            data, problem, run_dir, epochs=self.config.steps, derived=self.config.derived
        )
        return Outcome(
            policy, accuracy=accuracy, decisions=len(data.default), left_out=len(manifest.failed)
        )


TRAINER = BC
