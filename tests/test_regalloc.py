"""Register-allocation eviction against real clang-22: illegal advice never reaches the
compiler, the per-candidate policy, and BC + ES on the small real corpus."""

import json
from dataclasses import replace

import numpy as np
import pytest

from mlgo.corpus.compile import CompileError, compile_module, compile_plain
from mlgo.corpus.format import Corpus
from mlgo.llvm.log_format import Observation
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems import get_problem
from mlgo.problems.normalizer import Normalizer
from mlgo.problems.policy_files import load_policy, save_policy
from mlgo.problems.regalloc_eviction import CandidatePolicy
from mlgo.runtime.workers import LocalPool
from mlgo.traces.collect import collect
from mlgo.traces.dataset import load_decisions
from mlgo.train import RunDir
from mlgo.train.bc import train_bc
from mlgo.train.es import ES, ESConfig
from mlgo.train.evaluate import evaluate
from tests.conftest import assert_saved_best_is_best_evaluated, run_mlgo

PROBLEM = get_problem("regalloc-eviction")
SLOTS = 33


def _observation(mask: np.ndarray, rng: np.random.Generator) -> Observation:
    feats = {f: (rng.random((1, SLOTS)) * mask).astype(np.float32) for f in PROBLEM.feature_names}
    feats["mask"] = mask.reshape(1, SLOTS).astype(np.int64)
    feats["progress"] = np.array([0.5], np.float32)
    return Observation(context="f", index=0, features=feats)


@pytest.mark.unit
def test_validate_rejects_out_of_range_and_masked_out_indices():
    mask = np.zeros(SLOTS, np.int64)
    mask[[3, 32]] = 1
    obs = _observation(mask, np.random.default_rng(0))
    PROBLEM.validate(obs, np.array([3]))
    with pytest.raises(ValueError, match="masked out"):
        PROBLEM.validate(obs, np.array([4]))
    with pytest.raises(ValueError, match="outside"):
        PROBLEM.validate(obs, np.array([33]))


def test_illegal_advice_is_caught_before_the_compiler_sees_it(mini_corpus_o2, tc):
    def first_illegal(obs: Observation) -> int:
        return int(np.flatnonzero(obs.features["mask"].reshape(-1) == 0)[0])

    module = next(m for m in mini_corpus_o2.modules if m.name.endswith("hash.o"))
    with pytest.raises(CompileError, match="illegal advice on decision 0: index_to_evict"):
        compile_module(PROBLEM, module, tc.clang, first_illegal)


def test_default_rule_replays_the_compilers_own_allocation(mini_corpus_o2, tc, tmp_path):
    for m in mini_corpus_o2.modules:
        replayed, plain = tmp_path / "r.o", tmp_path / "p.o"
        run = compile_module(PROBLEM, m, tc.clang, keep_object=replayed)
        metrics = compile_plain(PROBLEM, m, tc.clang, plain)
        assert replayed.read_bytes() == plain.read_bytes(), m.name
        assert run.metrics["spill_reload_cost"] == metrics["spill_reload_cost"]


@pytest.mark.unit
def test_candidate_policy_scores_every_slot_and_answers_only_legal_ones(tmp_path):
    rng = np.random.default_rng(1)
    rows = rng.random((500, len(PROBLEM.feature_names)))
    policy = CandidatePolicy.init(PROBLEM, Normalizer.fit(PROBLEM.feature_names, rows))
    assert policy.weights[-1].shape == (1,)  # one shared scorer, one score per slot
    for _ in range(50):
        mask = (rng.random(SLOTS) < 0.2).astype(np.int64)
        mask[32] = 1
        obs = _observation(mask, rng)
        raw = policy.raw_features(obs)
        assert raw.shape == (SLOTS, len(PROBLEM.feature_names))
        assert np.all(raw[:, PROBLEM.feature_names.index("progress")] == 0.5)
        scores = policy.scores(raw[None], mask[None])[0]
        assert np.all(np.isneginf(scores[mask == 0])) and np.all(np.isfinite(scores[mask == 1]))
        assert mask[policy(obs)] == 1
        PROBLEM.validate(obs, np.array([policy(obs)]))
    save_policy(policy, tmp_path)
    loaded = load_policy(tmp_path)
    assert isinstance(loaded, CandidatePolicy) and loaded(obs) == policy(obs)


@pytest.fixture(scope="module")
def ra_bc(mini_corpus_o2, tc, tmp_path_factory):
    run = RunDir(tmp_path_factory.mktemp("ra-bc"), "bc")
    collect(PROBLEM, mini_corpus_o2, run.traces_dir, tc, LocalPool(2))
    data = load_decisions(run.traces_dir, PROBLEM)
    policy, acc = train_bc(data, PROBLEM, run, epochs=30)
    return run, data, policy, acc


def test_bc_learns_the_default_rule_per_candidate(ra_bc, mini_corpus_o2, tc):
    run, data, policy, acc = ra_bc
    assert data.x.shape[1:] == (SLOTS, len(PROBLEM.feature_names))
    assert acc["accuracy"] >= 0.8
    loaded = load_policy(run.policy_dir)
    assert isinstance(loaded, CandidatePolicy)
    assert np.array_equal(loaded.predict(data.x), policy.predict(data.x))
    ev = evaluate(loaded, mini_corpus_o2, tc, LocalPool(2), PROBLEM)
    assert not ev.failed and ev.metric == "spill_reload_cost"
    assert set(ev.modules) == {m.name for m in mini_corpus_o2.modules}


def test_report_on_a_regalloc_evaluation_uses_its_reward_metric(ra_bc, mini_corpus_o2, tmp_path):
    """`mlgo eval` then `mlgo report` on a regalloc policy: the report is in spill+reload
    cost, the problem's reward metric, not in .text."""
    run = ra_bc[0]
    r = run_mlgo(
        *("eval", "--policy", str(run.root), "--corpus", str(mini_corpus_o2.root)),
        *("--out", str(tmp_path / "ev")),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    r = run_mlgo(
        *("report", str(tmp_path / "ev"), "--html", str(tmp_path / "r.html")),
        *("--json", str(tmp_path / "r.json")),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    totals = json.loads((tmp_path / "r.json").read_text())["totals"]
    saved = json.loads((tmp_path / "ev" / "eval.json").read_text())["modules"].values()
    assert totals["modules"] == 3
    assert totals["default_spill_reload_cost"] == sum(m["default_spill_reload_cost"] for m in saved)
    assert totals["default_spill_reload_cost"] > 0 and "default_text_size" not in totals
    page = (tmp_path / "r.html").read_text()
    assert "regalloc-eviction with" in page and "<th>default spill_reload_cost</th>" in page
    assert page.count("data:image/png;base64,") == 2


def test_a_module_the_default_cannot_compile_is_left_out_and_named(
    ra_bc, mini_corpus_o2, tc, tmp_path
):
    # clang-22 itself crashes on some real modules (optimization records on, at -O2)
    crashing = tmp_path / "clang"
    crashing.write_text(
        f'#!/bin/sh\ncase "$*" in *hash.o.bc*) kill -SEGV $$;; esac\nexec {tc.clang} "$@"\n'
    )
    crashing.chmod(0o755)
    policy, crashing_tc = load_policy(ra_bc[0].policy_dir), find_toolchain(str(crashing))
    ev = evaluate(policy, mini_corpus_o2, crashing_tc, LocalPool(2), PROBLEM)
    assert set(ev.modules) == {"minipkg/main.o", "minipkg/strbuf.o"}
    assert list(ev.failed) == ["minipkg/hash.o"]
    assert ev.failed["minipkg/hash.o"].startswith(
        "default: minipkg/hash.o: compiler exited with -11"
    )
    only_hash = Corpus(mini_corpus_o2.root, mini_corpus_o2.modules[:1])
    assert only_hash.modules[0].name == "minipkg/hash.o"
    with pytest.raises(CompileError, match="baseline compile failed for all 1 modules"):
        evaluate(policy, only_hash, crashing_tc, LocalPool(1), PROBLEM)


def test_es_on_regalloc_trains_checkpoints_and_resumes(ra_bc, mini_corpus_o2, tc, tmp_path):
    _, _, policy, _ = ra_bc
    run = RunDir(tmp_path / "es", "es")
    cfg = ESConfig(
        steps=2, directions=2, batch=2, eval_every=1, max_module_seconds=60, regression_penalty=1.0
    )
    ES(cfg).train(mini_corpus_o2, PROBLEM, policy, run, tc, LocalPool(2))
    state, _ = run.load_state()
    assert state.step == 2
    arrays = assert_saved_best_is_best_evaluated(run, policy)
    assert arrays["theta"].size == policy.flat().size
    assert not np.allclose(arrays["theta"], policy.flat())
    ES(replace(cfg, steps=3)).train(mini_corpus_o2, PROBLEM, policy, run, tc, LocalPool(2))
    state, _ = run.load_state()
    assert [h["step"] for h in state.history] == [1, 2, 3]
    assert isinstance(load_policy(run.policy_dir), CandidatePolicy)


@pytest.mark.slow
def test_ppo_on_regalloc_scores_slots_and_resumes(ra_bc, mini_corpus_o2, tc, tmp_path):
    from mlgo.train.ppo import PPO, Agent, PPOConfig

    _, data, policy, _ = ra_bc
    run = RunDir(tmp_path / "ppo", "ppo")
    cfg = PPOConfig(steps=2, batch=2, epochs=2, eval_every=1, max_module_seconds=60)
    trained = PPO(cfg).train(mini_corpus_o2, PROBLEM, policy, run, tc, LocalPool(2)).policy
    state, _ = run.load_state()
    assert state.step == 2 and all(np.isfinite(h["ppo/loss"]) for h in state.history)
    assert_saved_best_is_best_evaluated(run, policy)
    assert isinstance(load_policy(run.policy_dir), CandidatePolicy)
    # the agent's actor is the policy's network: PPO moved its weights, and a policy made
    # of them answers only legal slots
    agent = Agent(policy, cfg)
    agent.restore(run.root / "agent")
    moved = replace(policy, weights=agent.weights())
    assert [w.shape for w in moved.weights] == [w.shape for w in policy.weights]
    assert not np.allclose(moved.flat(), policy.flat())
    legal = data.x[:, :, PROBLEM.feature_names.index("mask")] > 0
    for answered in (trained, moved):
        assert legal[np.arange(len(data.x)), answered.predict(data.x)].all()
    PPO(replace(cfg, steps=3)).train(mini_corpus_o2, PROBLEM, policy, run, tc, LocalPool(2))
    state, _ = run.load_state()
    assert [h["step"] for h in state.history] == [1, 2, 3]


def test_saved_model_evicts_like_the_candidate_policy(ra_bc, tmp_path):
    from mlgo.ship.export import export_saved_model, saved_model_decisions

    _, data, policy, _ = ra_bc
    saved = export_saved_model(policy, tmp_path)
    rows = slice(0, 40)
    got = saved_model_decisions(saved, {f: data.x[rows, :, j] for j, f in enumerate(data.features)})
    assert np.array_equal(got, policy.predict(data.x[rows]))


@pytest.mark.unit
def test_regression_penalty_weighs_each_package_and_its_losses():
    from mlgo.train.rollouts import penalized_reduction

    base = np.array([100.0, 10.0])
    costs = np.array([[80.0, 11.0], [100.0, 10.0], [90.0, 9.0]])
    got = penalized_reduction(base, costs, 2.0)
    # -20% in one package, +10% in the other counted three times: worse than no change
    assert np.allclose(got, [(0.2 - 3 * 0.1) / 2, 0.0, (0.1 + 0.1) / 2])
    assert np.allclose(penalized_reduction(base[:1], costs[:, :1], 0.0), [0.2, 0.0, 0.1])


def test_normalizer_ignores_infinite_weights_and_the_graph_looks_up_the_same_quantiles():
    from mlgo.runtime.tfutil import import_tf
    from mlgo.ship.export import quantile_counts

    rng = np.random.default_rng(2)
    x = rng.exponential(1.0, (400, 2))
    x[::40, 0] = np.inf  # an unspillable live range's weight
    norm = Normalizer.fit(["weight", "other"], x)
    assert all(np.all(np.isfinite(q)) and len(q) > 100 for q in norm.quantiles)
    probe = np.concatenate([x[:50], [[np.inf, -np.inf], [np.nan, 0.0]]])
    probe[:26, 1] = norm.quantiles[1][:26]  # values equal to boundaries
    frac = norm.transform(probe)[:, :2]
    assert np.all(frac[50] == [1.0, 0.0]) and frac[51, 0] == 1.0
    old = [np.array([0.5, 1.0, np.nan]), np.array([1.0])]  # NaN boundaries in old policies
    for quantiles in (norm.quantiles, old):
        want = np.stack(
            [
                np.searchsorted(q, probe[:, j], side="right") / len(q)
                for j, q in enumerate(quantiles)
            ],
            1,
        )
        got = quantile_counts(import_tf().constant(probe), quantiles).numpy()
        assert np.array_equal(got / [len(q) for q in quantiles], want)
