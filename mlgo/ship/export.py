"""Exporting a policy as a TensorFlow SavedModel in the shape LLVM's release mode expects.

The signature `action` takes each LLVM feature under its own name, as the compiler sends
it (an int64 scalar unless the problem declares the tensor otherwise),
plus tf-agents' `discount`, `reward` (float32) and `step_type` (int32), and returns the
advice under LLVM's name (`inlining_decision`), as in LLVM's
`llvm/lib/Analysis/models/gen-inline-oz-test-model.py`. `output_spec.json` names the
output as ml-compiler-opt writes it. Normalization is inside the graph, so the model
takes the raw features the compiler computes; that makes it usable both by mlgo and by
anyone building LLVM with `-DLLVM_INLINER_MODEL_PATH`.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from mlgo.llvm.log_format import column_of, tensor_of
from mlgo.problems import SELF
from mlgo.problems.policy import MLPPolicy
from mlgo.runtime.files import atomic_directory, atomic_write_text
from mlgo.runtime.tfutil import import_tf

SIGNATURE = "action"


def _output_spec(advice_name: str) -> list[dict]:
    return [
        {
            "logging_name": advice_name,
            "tensor_spec": {
                "name": "StatefulPartitionedCall",
                "port": 0,
                "type": "int64_t",
                "shape": [1],
            },
        }
    ]


def quantile_counts(values, quantiles: list[np.ndarray]):
    """[rows, columns] raw values -> [rows, columns] int32: for each column j,
    searchsorted(quantiles[j], value, side="right"), exactly as numpy counts it.

    A branch-free binary search over one table padded with +inf: XLA lowers
    tf.searchsorted to a comparison with every boundary, which for a per-candidate
    policy (33 slots x 26 columns x up to 257 boundaries) was most of the native
    server's time per decision; this takes log2(width) gathers instead."""
    tf = import_tf()
    width = 1 << max(len(q) for q in quantiles).bit_length()  # a power of two > every length
    table = np.full((len(quantiles), width), np.inf)
    for j, q in enumerate(quantiles):
        table[j, : len(q)] = np.nan_to_num(q, nan=np.inf, posinf=np.inf, neginf=-np.inf)
    flat = tf.constant(table.reshape(-1), tf.float64)
    row_start = tf.constant(np.arange(len(quantiles)) * width, tf.int32)[None, :]
    count = tf.zeros_like(values, tf.int32)  # boundaries <= value found so far
    step = width // 2
    while step:
        probe = count + step
        below = tf.gather(flat, row_start + probe - 1) <= values
        count = tf.where(below, probe, count)
        step //= 2
    # numpy sorts NaN after everything: a NaN value counts every boundary, +inf every
    # boundary but NaN ones (an old policy may hold NaN boundaries; the padding is +inf).
    shape = tf.shape(count)
    limit = tf.broadcast_to([[int(np.sum(~np.isnan(q))) for q in quantiles]], shape)
    every = tf.broadcast_to([[len(q) for q in quantiles]], shape)
    return tf.where(tf.math.is_nan(values), every, tf.minimum(count, limit))


def quantile_fractions(columns: list, constant: list[bool], quantiles: list[np.ndarray]):
    """[slots] raw value per column -> [slots, columns] float64 quantile fractions.

    Columns are searched in groups of one table width each, so a column of 3 boundaries
    takes 2 steps, not the widest column's 8; a column that is the same on every row (a
    scalar feature, the live range's own value) is searched once and broadcast. On the
    regalloc policy this cuts the lookups per decision from 33 x 26 x 8 to about a third."""
    tf = import_tf()
    slots = int(columns[0].shape[0])
    groups: dict[tuple[bool, int], list[int]] = {}
    for j, q in enumerate(quantiles):
        groups.setdefault((constant[j], len(q).bit_length()), []).append(j)
    parts, order = [], []
    for (same, _), members in sorted(groups.items()):
        values = tf.stack([columns[j][:1] if same else columns[j] for j in members], axis=1)
        counts = quantile_counts(values, [quantiles[j] for j in members])
        parts.append(tf.broadcast_to(counts, [slots, len(members)]) if same else counts)
        order += members
    counts = tf.gather(tf.concat(parts, axis=1), np.argsort(order), axis=1)
    lengths = tf.constant([max(len(q), 1) for q in quantiles], tf.float64)
    return tf.cast(counts, tf.float64) / lengths[None, :]  # as numpy: float64, then float32


def build_module(policy: MLPPolicy):
    """A tf.Module whose `action` function reproduces `policy` (greedy) in TF ops."""
    tf = import_tf()
    problem = policy.problem
    features = policy.normalizer.features
    weights = [tf.constant(w, tf.float32) for w in policy.weights]
    declared = {n: (t, shape) for n, t, shape in problem.input_specs}
    llvm = [f for f in features if not f.startswith(SELF)]  # columns of the model's inputs
    gated = policy.departure_threshold is not None  # then the compiler's answer is one too
    if gated and problem.default_feature:
        llvm.append(problem.default_feature)
    tensors = list(dict.fromkeys(tensor_of(f) for f in llvm))  # the inputs, as LLVM sends
    specs = [
        tf.TensorSpec(declared[t][1], declared[t][0], name=t)
        if t in declared
        else tf.TensorSpec((), tf.int64, name=t)
        for t in tensors
    ]
    specs += [tf.TensorSpec((), tf.float32, name=n) for n in ("discount", "reward")]
    specs.append(tf.TensorSpec((), tf.int32, name="step_type"))
    slots = problem.slots
    scalars = {f for f in llvm if f not in declared or np.prod(declared[f][1]) == 1}

    def column(sent: dict, f: str):
        """Column F as [slots] float64: a scalar (or one element of a vector) repeats on
        every row, a per-candidate tensor gives one value per row."""
        tensor, index = column_of(f)
        x = tf.reshape(sent[tensor], [-1])
        x = x if index is None else x[index : index + 1]
        return tf.broadcast_to(tf.cast(x, tf.float64), [slots])

    def action(*inputs):
        # One row per slot (1 for a scalar decision).
        sent = dict(zip(tensors, inputs[: len(tensors)], strict=True))
        by_name = {f: column(sent, f) for f in llvm}
        for f in features:  # SELF columns: the live range's own (last) slot, on every row
            if f.startswith(SELF):
                by_name[f] = tf.broadcast_to(by_name[f.removeprefix(SELF)][-1:], [slots])
        raw = [by_name[f] for f in features]
        constant = [f.startswith(SELF) or f in scalars for f in features]
        for d in policy.normalizer.derived:  # the same columns Normalizer.expand computes
            left, right = by_name[d.left], by_name[d.right]
            raw.append(left - right if d.op == "-" else tf.cast(left < right, tf.float64))
            constant.append(constant[features.index(d.left)] and constant[features.index(d.right)])
        frac = quantile_fractions(raw, constant, policy.normalizer.quantiles)
        h = tf.cast(tf.concat([frac, tf.sqrt(frac), frac * frac], axis=1), tf.float32)
        for i in range(0, len(weights), 2):
            h = tf.matmul(h, weights[i]) + weights[i + 1]
            if i + 2 < len(weights):
                h = tf.nn.relu(h)
        if policy.mask_feature:  # one score per slot, illegal ones out
            legal = by_name[policy.mask_feature] > 0
            h = tf.reshape(tf.where(legal, tf.reshape(h, [-1]), -np.inf), [1, slots])
        advice = tf.reshape(tf.argmax(h, axis=1, output_type=tf.int64), [1])
        if gated:  # MLPPolicy.gate: the default unless the other answer's margin is enough
            default = tf.cast(by_name[problem.default_feature][:1], tf.int64)
            other = 1 - default
            margin = tf.gather(h[0], other) - tf.gather(h[0], default)
            advice = tf.where(margin >= policy.departure_margin, other, default)
        return {problem.advice_name: advice}

    module = tf.Module()
    module.action = tf.function(action, input_signature=specs)
    return module


def export_saved_model(policy: MLPPolicy, out: Path) -> Path:
    """Writes OUT/saved_model (SavedModel + output_spec.json) atomically; returns its path."""
    tf = import_tf()
    target = out / "saved_model"
    module = build_module(policy)
    with atomic_directory(target) as staging:
        tf.saved_model.save(module, str(staging), signatures={SIGNATURE: module.action})
        advice = policy.problem.advice_name
        atomic_write_text(staging / "output_spec.json", json.dumps(_output_spec(advice), indent=2))
    return target


def _input(value: np.ndarray, spec):
    """A decision's raw value(s) of one feature as the model's input tensor (a per-slot
    copy of a scalar feature shrinks back to the scalar)."""
    tf = import_tf()
    size = int(np.prod(spec.shape))
    flat = np.asarray(value).reshape(-1)[:size].astype(spec.dtype.as_numpy_dtype)
    return tf.constant(flat.reshape(spec.shape), spec.dtype)


def saved_model_decisions(saved_model: Path, features: dict[str, np.ndarray]) -> np.ndarray:
    """Runs the SavedModel's `action` signature over rows of raw features (for checks)."""
    tf = import_tf()
    fn = tf.saved_model.load(str(saved_model)).signatures[SIGNATURE]
    inputs = {s.name: s for s in fn.structured_input_signature[1].values()}
    n = len(next(iter(features.values())))
    out = []
    for i in range(n):
        kwargs = {k: _input(v[i], inputs[k]) for k, v in features.items()}
        kwargs.update(
            discount=tf.constant(0.0), reward=tf.constant(0.0), step_type=tf.constant(0, tf.int32)
        )
        out.append(int(next(iter(fn(**kwargs).values())).numpy()[0]))
    return np.array(out, np.int64)
