"""AOT: the exported SavedModel fits what the installed clang sends, and the native policy
server built from it decides exactly like the SavedModel and the numpy policy."""

from __future__ import annotations

import io
import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pytest

from mlgo.llvm.log_format import Header, LogWriter, TensorSpec, tensor_of
from mlgo.problems.policy import MLPPolicy
from mlgo.ship.aot import AotError, aot_compile, native_server, replay
from tests.conftest import random_policy

# (problem, gate): the embeddings' problem exported gated, its float vectors beside int64s.
# That one takes every path the others do (int64 features, the gate's default input), so
# the others, each a server build of its own, are the long tier.
CASES = [
    pytest.param(("inlining-size", "argmax"), marks=pytest.mark.slow, id="inlining-size-argmax"),
    pytest.param(("inlining-size", "gated"), marks=pytest.mark.slow, id="inlining-size-gated"),
    pytest.param(("inlining-size-ir2vec", "gated"), id="inlining-size-ir2vec-gated"),
]
TF_TYPES = {"int64_t": "int64", "float": "float32"}


@pytest.fixture(scope="module", params=CASES)
def exported(request, recordings, tmp_path_factory):
    """A random policy (tests.conftest.random_policy), argmax or gated, exported."""
    from mlgo.ship.export import export_saved_model

    problem, specs, features, x = recordings(request.param[0])
    default = features[problem.default_feature].reshape(-1)
    policy = random_policy(problem, x, default if request.param[1] == "gated" else None)
    out = tmp_path_factory.mktemp("policy")
    return Exported(specs, features, policy, export_saved_model(policy, out), x)


@dataclass
class Exported:
    specs: tuple[TensorSpec, ...]
    features: dict[str, np.ndarray]  # LLVM's tensors by name, [decisions, ...]
    policy: MLPPolicy
    saved: Path
    x: np.ndarray  # [decisions, policy features] raw


def test_signature_matches_what_clang_sends(exported):
    from mlgo.runtime.tfutil import import_tf

    problem = exported.policy.problem
    sent = {s.name: s for s in exported.specs}
    tf = import_tf()
    signature = tf.saved_model.load(str(exported.saved)).signatures["action"]
    inputs = signature.structured_input_signature[1]
    for name, spec in inputs.items():
        if name in ("discount", "reward", "step_type"):
            continue
        assert name in sent, f"the policy wants {name}, which clang does not send"
        assert spec.dtype == getattr(tf, TF_TYPES[sent[name].type])
        assert spec.shape.num_elements() == sent[name].num_elements
    assert {tensor_of(f) for f in problem.feature_names} <= set(inputs)
    out = json.loads((exported.saved / "output_spec.json").read_text())
    assert out[0]["logging_name"] == problem.advice_name == "inlining_decision"


def test_native_server_decides_like_saved_model_and_policy(exported, tmp_path):
    from mlgo.ship.export import saved_model_decisions

    policy, features, x = exported.policy, exported.features, exported.x
    problem = policy.problem
    log = tmp_path / "real.log"
    buf = io.BytesIO()
    advice = TensorSpec("inlining_decision", "int64_t", (1,))
    writer = LogWriter(buf, Header(exported.specs, advice=advice))
    n = len(x)
    for i in range(n):
        writer.observation({name: v[i] for name, v in features.items()})
    log.write_bytes(buf.getvalue())

    native = np.frombuffer(replay(native_server(policy), log), np.int64)
    argmax = np.argmax(policy.logits(x), 1)
    inputs = {t: features[t] for t in {tensor_of(f) for f in policy.normalizer.features}}
    default = features[problem.default_feature].reshape(-1)
    numpy_policy = argmax
    if policy.departure_threshold is not None:
        numpy_policy = policy.gate(policy.logits(x), default)
        inputs[problem.default_feature] = default
        departures = (numpy_policy != default).sum()
        assert 0 < departures < (argmax != default).sum(), "the gate keeps some departures"
    tf_model = saved_model_decisions(exported.saved, inputs)
    assert n >= 15 and len(native) == n
    assert 0 < native.sum() < n, "a random policy should answer both ways"
    assert np.array_equal(native, numpy_policy)
    assert np.array_equal(native, tf_model)


def test_aot_artifacts_are_what_llvm_embeds(exported):
    """Read from the native server's build of the same policy (cached, so no second
    AOT compile): it AOT-compiles the policy's SavedModel into its own aot/."""
    built = native_server(exported.policy).parent
    out = built / "aot"
    assert {p.name for p in out.iterdir()} >= {"model.h", "model.o", "tf_version"}
    header = (out / "model.h").read_text()
    assert "class Model" in header and '"feed_callee_users"' in header
    assert not list(built.glob(".aot.*")), "no staging dir left behind"


def test_an_export_takes_the_servers_aot_objects_rather_than_compiling_again(
    exported, tmp_path, monkeypatch
):
    """`mlgo export` (`release`) writes the AOT objects LLVM's release mode embeds: those its
    native server's build compiled from the same policy, copied, not a second compile."""
    from mlgo.ship import aot
    from mlgo.ship.release import release

    built = native_server(exported.policy).parent / "aot"

    def compiled(*_):
        raise AssertionError("compiled again")

    monkeypatch.setattr(aot, "_compile_action_signature", compiled)
    out = release(exported.policy, tmp_path / "released", "card").aot
    assert out == tmp_path / "released" / "aot"
    assert {p.name: p.read_bytes() for p in out.iterdir()} == {
        p.name: p.read_bytes() for p in built.iterdir()
    }


def test_not_a_saved_model_is_a_clear_error(tmp_path):
    with pytest.raises(AotError, match="not a SavedModel"):
        aot_compile(tmp_path, tmp_path / "aot")


def test_replay_of_a_corrupt_log_fails_cleanly(exported, tmp_path):
    log = tmp_path / "bad.log"
    log.write_bytes(b'{"features": [}\n')
    with pytest.raises(AotError, match="bad JSON"):
        replay(native_server(exported.policy), log)
    assert Path(exported.saved).is_dir()
