"""Exporting a policy as a TensorFlow SavedModel in the shape LLVM's release mode expects.

The signature `action` takes each LLVM feature under its own name as an int64 scalar,
plus tf-agents' `discount`, `reward` (float32) and `step_type` (int32), and returns the
advice under LLVM's name (`inlining_decision`), as in LLVM's
`llvm/lib/Analysis/models/gen-inline-oz-test-model.py`. `output_spec.json` names the
output as ml-compiler-opt writes it. Normalization is inside the graph, so the model
takes the raw features the compiler computes; that makes it usable both by mlgo and by
anyone building LLVM with `-DLLVM_INLINER_MODEL_PATH`.
"""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np

from mlgo.fsutil import atomic_write_text
from mlgo.policy import MLPPolicy
from mlgo.problems import get_problem
from mlgo.tfutil import import_tf

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


def build_module(policy: MLPPolicy):
    """A tf.Module whose `action` function reproduces `policy` (greedy) in TF ops."""
    tf = import_tf()
    problem = get_problem(policy.problem)
    features = policy.normalizer.features
    quantiles = [tf.constant(q, tf.float64) for q in policy.normalizer.quantiles]
    weights = [tf.constant(w, tf.float32) for w in policy.weights]
    specs = [tf.TensorSpec((), tf.int64, name=f) for f in features]
    specs += [tf.TensorSpec((), tf.float32, name=n) for n in ("discount", "reward")]
    specs.append(tf.TensorSpec((), tf.int32, name="step_type"))

    def action(*inputs):
        raw = [tf.cast(tf.reshape(x, [1]), tf.float64) for x in inputs[: len(features)]]
        by_name = dict(zip(features, raw, strict=True))
        for d in policy.normalizer.derived:  # the same columns Normalizer.expand computes
            left, right = by_name[d.left], by_name[d.right]
            raw.append(left - right if d.op == "-" else tf.cast(left < right, tf.float64))
        fracs = [
            tf.cast(tf.searchsorted(q, v, side="right"), tf.float32)
            / float(max(int(q.shape[0]), 1))
            for q, v in zip(quantiles, raw, strict=True)
        ]
        frac = tf.reshape(tf.stack(fracs, axis=1), [1, len(raw)])
        h = tf.concat([frac, tf.sqrt(frac), frac * frac], axis=1)
        for i in range(0, len(weights), 2):
            h = tf.matmul(h, weights[i]) + weights[i + 1]
            if i + 2 < len(weights):
                h = tf.nn.relu(h)
        return {problem.advice_name: tf.reshape(tf.argmax(h, axis=1, output_type=tf.int64), [1])}

    module = tf.Module()
    module.action = tf.function(action, input_signature=specs)
    return module


def export_saved_model(policy: MLPPolicy, out: Path) -> Path:
    """Writes OUT/saved_model (SavedModel + output_spec.json) atomically; returns its path."""
    tf = import_tf()
    target = out / "saved_model"
    staging = out / ".saved_model.partial"
    shutil.rmtree(staging, ignore_errors=True)
    module = build_module(policy)
    tf.saved_model.save(module, str(staging), signatures={SIGNATURE: module.action})
    advice = get_problem(policy.problem).advice_name
    atomic_write_text(staging / "output_spec.json", json.dumps(_output_spec(advice), indent=2))
    if target.exists():
        shutil.rmtree(target)
    staging.rename(target)
    return target


def saved_model_decisions(saved_model: Path, features: dict[str, np.ndarray]) -> np.ndarray:
    """Runs the SavedModel's `action` signature over rows of raw features (for checks)."""
    tf = import_tf()
    fn = tf.saved_model.load(str(saved_model)).signatures[SIGNATURE]
    n = len(next(iter(features.values())))
    out = []
    for i in range(n):
        kwargs = {k: tf.constant(int(v[i]), tf.int64) for k, v in features.items()}
        kwargs.update(
            discount=tf.constant(0.0), reward=tf.constant(0.0), step_type=tf.constant(0, tf.int32)
        )
        out.append(int(next(iter(fn(**kwargs).values())).numpy()[0]))
    return np.array(out, np.int64)
