"""Behavioral cloning: fit the policy network to the compiler's own decisions.

This is the warm start for the other trainers: a policy that already decides like the
default heuristic from LLVM's features alone (not from `inlining_default`, which a
release-mode LLVM does not compute), so that search starts from -Oz's size, not from a
random policy's.
"""

from __future__ import annotations

import time

import numpy as np
from rich.progress import Progress

from mlgo.problems import get_problem
from mlgo.problems.policy import SELF, CandidatePolicy, MLPPolicy, Normalizer, with_own_columns
from mlgo.runtime.tfutil import import_tf
from mlgo.traces.dataset import Decisions
from mlgo.train import Adam, RunDir, RunState


def _loss_and_grad(
    policy: MLPPolicy, x: np.ndarray, y: np.ndarray, weight: np.ndarray, offset: np.ndarray
) -> tuple[float, np.ndarray]:
    """x: normalized rows (one per decision, or one per candidate slot); the network's
    outputs are regrouped per decision and `offset` (-1e9 on illegal slots) added."""
    tf = import_tf()
    ws = [tf.Variable(w) for w in policy.weights]
    with tf.GradientTape() as tape:
        h = tf.constant(x)
        for i in range(0, len(ws), 2):
            h = tf.matmul(h, ws[i]) + ws[i + 1]
            if i + 2 < len(ws):
                h = tf.nn.relu(h)
        h = tf.reshape(h, offset.shape) + offset
        per = tf.nn.sparse_softmax_cross_entropy_with_logits(labels=y, logits=h)
        loss = tf.reduce_sum(per * weight) / tf.reduce_sum(weight)
    grads = tape.gradient(loss, ws)
    return float(loss), np.concatenate([g.numpy().reshape(-1) for g in grads])


def predict(policy: MLPPolicy, raw: np.ndarray) -> np.ndarray:
    """Greedy answers for rows of raw features (per-candidate: [decisions, slots, features])."""
    if isinstance(policy, CandidatePolicy):  # raw: LLVM's features, SELF columns added here
        llvm = [f for f in policy.normalizer.features if not f.startswith(SELF)]
        full = with_own_columns(raw, llvm, policy.normalizer.features)
        mask = raw[:, :, llvm.index(policy.mask_feature)]
        return np.argmax(policy.scores(full, mask), 1)
    return np.argmax(policy.logits(raw), 1)


def accuracy(policy: MLPPolicy, raw: np.ndarray, y: np.ndarray) -> dict[str, float]:
    pred = predict(policy, raw)
    out = {"accuracy": float((pred == y).mean())}
    if isinstance(policy, CandidatePolicy):
        return out
    for c in (0, 1):
        if (y == c).any():
            out[f"recall_{c}"] = float((pred[y == c] == c).mean())
    return out


def _candidate_inputs(
    data: Decisions, problem: str, seed: int
) -> tuple[CandidatePolicy, np.ndarray, np.ndarray]:
    """A fresh per-candidate policy normalized on the legal slots (illegal ones are all
    zeros), its input rows (one per slot) and the illegal-slot logit offsets. The
    problem's derived inputs (comparisons with the live range's own slot) are always on:
    the default rule is such a comparison, and one scorer per slot cannot see other slots."""
    derived = get_problem(problem).derived
    own = sorted({c for d in derived for c in (d.left, d.right) if c.startswith(SELF)})
    names = (*data.features, *own)
    full = with_own_columns(data.x, data.features, names)
    n, slots, width = full.shape
    mask = data.x[:, :, data.features.index(CandidatePolicy.mask_feature)] > 0
    normalizer = Normalizer.fit(names, full[mask], derived)
    policy = CandidatePolicy.init(problem, normalizer, seed=seed)
    x = normalizer.transform(full.reshape(n * slots, width))
    return policy, x, np.where(mask, 0.0, -1e9).astype(np.float32)


def train_bc(
    data: Decisions,
    problem: str,
    run: RunDir,
    epochs: int = 30,
    hidden: tuple[int, ...] = (64, 32),
    lr: float = 3e-3,
    batch: int = 1024,
    seed: int = 0,
    derived: bool = False,
) -> tuple[MLPPolicy, dict[str, float]]:
    """Trains (or resumes training) a BC policy; saves it to run.policy_dir.

    With `derived`, the network also sees the problem's derived inputs (for inlining, the
    default's own cost-vs-threshold rule): it then matches the default almost exactly,
    also on unseen code, but sits in a flat spot that weight-space search leaves slowly.
    """
    rng = np.random.default_rng(seed)
    spec = get_problem(problem)
    if spec.policy_kind == "candidate":
        policy, x, offset = _candidate_inputs(data, problem, seed)
        weight = np.ones(len(data.default), np.float32)
    else:
        normalizer = Normalizer.fit(data.features, data.x, spec.derived if derived else ())
        policy = MLPPolicy.init(problem, normalizer, hidden, seed=seed)
        x = normalizer.transform(data.x)
        offset = np.zeros((len(x), 2), np.float32)
        # Rare "inline" decisions weigh as much in total as the common "don't".
        freq = np.bincount(data.default, minlength=2) / len(data.default)
        weight = (0.5 / np.maximum(freq, 1e-6))[data.default].astype(np.float32)
    adam = Adam(policy.flat().size, lr)
    state = RunState("bc")
    if (saved := run.load_state()) is not None:
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
    policy.save(run.policy_dir)
    return policy, accuracy(policy, data.x, data.default)
