"""AOT: the exported SavedModel fits what the installed clang sends, and the native policy
server built from it decides exactly like the SavedModel and the numpy policy."""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest

from mlgo.corpus.compile import compile_module
from mlgo.llvm.log_format import Header, LogWriter, TensorSpec
from mlgo.problems import get_problem
from mlgo.problems.normalizer import Normalizer
from mlgo.problems.policy import MLPPolicy
from mlgo.ship.aot import AotError, aot_compile, native_server, replay

PROBLEM = get_problem("inlining-size")


@pytest.fixture(scope="module")
def recorded(mini_corpus, tc):
    """Real feature rows from real compilations of the small corpus."""
    runs = [compile_module(PROBLEM, m, tc.clang) for m in mini_corpus.modules]
    runs = [r for r in runs if r.num_decisions]
    specs = runs[0].specs
    features = {s.name: np.concatenate([r.features[s.name] for r in runs]) for s in specs}
    return specs, features


@pytest.fixture(scope="module", params=["argmax", "gated"])
def exported(request, recorded, tmp_path_factory):
    """A randomly initialised policy (its answers are mixed, unlike a trained one's); gated,
    it keeps about half of its departures from the default, those with the larger margin."""
    from mlgo.ship.export import export_saved_model

    _, features = recorded
    names = PROBLEM.feature_names
    x = np.stack([features[f].reshape(-1) for f in names], 1).astype(np.float64)
    policy = MLPPolicy.init(PROBLEM, Normalizer.fit(names, x), hidden=(16,), seed=3)
    margin = np.diff(policy.logits(x), axis=1)[:, 0]
    policy.weights[-1][1] -= np.median(margin) + 1e-3  # centred: about half inline
    if request.param == "gated":
        default = features[PROBLEM.default_feature].reshape(-1)
        logits = policy.logits(x)
        departs = np.abs(np.diff(logits, axis=1)[:, 0])[np.argmax(logits, 1) != default]
        policy.departure_threshold = float(1 / (1 + np.exp(-np.median(departs))))
    out = tmp_path_factory.mktemp("policy")
    return policy, export_saved_model(policy, out), x


def test_signature_matches_what_clang_sends(recorded, exported):
    from mlgo.runtime.tfutil import import_tf

    specs, _ = recorded
    _, saved, _ = exported
    sent = {s.name: s for s in specs}
    tf = import_tf()
    signature = tf.saved_model.load(str(saved)).signatures["action"]
    inputs = signature.structured_input_signature[1]
    for name, spec in inputs.items():
        if name in ("discount", "reward", "step_type"):
            continue
        assert name in sent, f"the policy wants {name}, which clang does not send"
        assert sent[name].type == "int64_t" and sent[name].shape == (1,)
        assert spec.dtype == tf.int64
    assert set(PROBLEM.feature_names) <= set(inputs)
    out = json.loads((saved / "output_spec.json").read_text())
    assert out[0]["logging_name"] == PROBLEM.advice_name == "inlining_decision"


def test_native_server_decides_like_saved_model_and_policy(recorded, exported, tmp_path):
    from mlgo.ship.export import saved_model_decisions

    specs, features = recorded
    policy, saved, x = exported
    log = tmp_path / "real.log"
    buf = io.BytesIO()
    writer = LogWriter(buf, Header(specs, advice=TensorSpec("inlining_decision", "int64_t", (1,))))
    n = len(x)
    for i in range(n):
        writer.observation({name: v[i] for name, v in features.items()})
    log.write_bytes(buf.getvalue())

    native = np.frombuffer(replay(native_server(policy), log), np.int64)
    argmax = np.argmax(policy.logits(x), 1)
    inputs = {f: x[:, j] for j, f in enumerate(policy.normalizer.features)}
    default = features[PROBLEM.default_feature].reshape(-1)
    numpy_policy = argmax
    if policy.departure_threshold is not None:
        numpy_policy = policy.gate(policy.logits(x), default)
        inputs[PROBLEM.default_feature] = default
        departures = (numpy_policy != default).sum()
        assert 0 < departures < (argmax != default).sum(), "the gate keeps some departures"
    tf_model = saved_model_decisions(saved, inputs)
    assert n >= 15 and len(native) == n
    assert 0 < native.sum() < n, "a random policy should answer both ways"
    assert np.array_equal(native, numpy_policy)
    assert np.array_equal(native, tf_model)


def test_aot_artifacts_are_what_llvm_embeds(exported, tmp_path):
    _, saved, _ = exported
    out = aot_compile(saved, tmp_path / "aot")
    assert {p.name for p in out.iterdir()} >= {"model.h", "model.o", "tf_version"}
    header = (out / "model.h").read_text()
    assert "class Model" in header and '"feed_callee_users"' in header
    assert not list(tmp_path.glob(".aot.*")), "no staging dir left behind"


def test_not_a_saved_model_is_a_clear_error(tmp_path):
    with pytest.raises(AotError, match="not a SavedModel"):
        aot_compile(tmp_path, tmp_path / "aot")


def test_replay_of_a_corrupt_log_fails_cleanly(exported, tmp_path):
    policy, saved, _ = exported
    log = tmp_path / "bad.log"
    log.write_bytes(b'{"features": [}\n')
    with pytest.raises(AotError, match="bad JSON"):
        replay(native_server(policy), log)
    assert Path(saved).is_dir()
