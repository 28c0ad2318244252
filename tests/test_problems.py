"""The Problem object: pickled by name, and the only thing the generic stages know about a
problem, so that a third one is its declaration and one line in the registry."""

import json
import pickle
import sys
import types
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

import mlgo.problems
from mlgo.corpus.format import Module
from mlgo.errors import UsageError
from mlgo.llvm.sizes import text_size
from mlgo.problems import Problem, get_problem, problems
from mlgo.problems.policy import MLPPolicy, policy_class
from mlgo.problems.policy_files import load_policy, save_policy
from mlgo.records import Decisions
from mlgo.traces.format import Manifest, TraceError
from mlgo.train.evaluate import EvalTask, Evaluation
from mlgo.train.modelcard import model_card
from mlgo.train.report import render_html, summary

MODULE = Module("pkg/a.o", Path("pkg/a.o.bc"), ("-cc1", "-O2"))


def _code_bytes(obj: Path, _workdir: Path) -> dict[str, float]:
    return {"code_bytes": float(text_size(obj))}


# Inlining's declaration under another name, level and reward metric.
THIRD = replace(
    get_problem("inlining-size"),
    name="inlining-code-bytes",
    summary="inline or not at each call site, for fewer code bytes (clang -O2)",
    opt_level="-O2",
    measure=_code_bytes,
    reward_metric="code_bytes",
    reward_in_stats=False,
    plugin=False,
)


@pytest.fixture
def third(monkeypatch) -> Problem:
    """THIRD registered as a problem module would be: a module with PROBLEM, one line in
    MODULES."""
    module = types.ModuleType("third_problem")
    module.PROBLEM = THIRD  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "third_problem", module)
    monkeypatch.setattr(mlgo.problems, "MODULES", (*mlgo.problems.MODULES, "third_problem"))
    return THIRD


def test_every_problem_pickles_to_itself():
    assert len(problems()) == len(mlgo.problems.MODULES)  # every module registered
    for problem in problems():
        assert pickle.loads(pickle.dumps(problem)) is problem
        task = pickle.loads(pickle.dumps(EvalTask(problem, MODULE, "clang", None)))
        assert task.problem is problem


def test_unknown_problem_names_are_rejected_where_they_are_read(tmp_path):
    with pytest.raises(UsageError, match="unknown problem 'nope'; known: inlining-size"):
        get_problem("nope")
    policy = tmp_path / "policy"
    inlining = get_problem("inlining-size")
    save_policy(MLPPolicy.for_cloning(inlining, _decisions(inlining))[0], policy)
    meta = json.loads((policy / "policy.json").read_text())
    (policy / "policy.json").write_text(json.dumps({**meta, "problem": "nope"}))
    with pytest.raises(ValueError, match="not a policy .*unknown problem 'nope'"):
        load_policy(policy)
    Manifest(get_problem("inlining-size"), "clang", "corpus").save(tmp_path)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "problem": "nope"}))
    with pytest.raises(TraceError, match="unknown problem 'nope'"):
        Manifest.load(tmp_path)


def _decisions(problem: Problem, n: int = 400) -> Decisions:
    """Decisions shaped like a trace of PROBLEM, the default inlining under the threshold."""
    rng = np.random.default_rng(0)
    x = rng.integers(0, 200, (n, len(problem.feature_names))).astype(np.float64)
    names = problem.feature_names
    default = (x[:, names.index("cost_estimate")] < x[:, names.index("threshold")]).astype(np.int64)
    return Decisions(names, x, default, np.zeros(n, np.int64), ["pkg/a.o"])


def test_a_third_problem_goes_through_the_generic_stages(third, tmp_path):
    assert get_problem("inlining-code-bytes") is third and third in problems()
    assert pickle.loads(pickle.dumps(third)) is third

    # policy construction, storage and loading
    data = _decisions(third)
    policy, rows, weight, offset = policy_class(third).for_cloning(third, data, derived=True)
    assert policy.problem is third and rows.shape == (len(data.x), policy.normalizer.width)
    assert offset.shape == (len(data.x), 2) and weight.shape == (len(data.x),)
    assert [d.name for d in policy.normalizer.derived] == ["cost_margin", "default_rule"]
    save_policy(policy, tmp_path / "policy")
    assert json.loads((tmp_path / "policy" / "policy.json").read_text())["problem"] == third.name
    loaded = load_policy(tmp_path / "policy")
    assert loaded.problem is third

    # the exported model: LLVM's feature names in, the problem's advice name out
    from mlgo.ship.export import export_saved_model, saved_model_decisions

    saved = export_saved_model(loaded, tmp_path / "ship")
    spec = json.loads((saved / "output_spec.json").read_text())
    assert spec[0]["logging_name"] == third.advice_name
    got = saved_model_decisions(saved, {f: data.x[:40, j] for j, f in enumerate(data.features)})
    assert np.array_equal(got, loaded.predict(data.x[:40]))
    card = model_card(loaded, tmp_path)
    assert "--problem inlining-code-bytes" in card and "--opt-level -O2" in card

    # an evaluation and its report, in the problem's own reward metric
    modules = {
        "pkg/a.o": {"code_bytes": 90.0, "default_code_bytes": 100.0},
        "pkg/b.o": {"code_bytes": 330.0, "default_code_bytes": 300.0},
    }
    Evaluation(third, "clang", "corpus", modules).save(tmp_path)
    ev = Evaluation.load(tmp_path)
    assert ev.problem is third and ev.metric == "code_bytes"
    s = summary(ev)
    assert s["totals"]["default_code_bytes"] == 400.0 and s["totals"]["delta"] == 0.05
    assert s["modules_smaller"] == 1 and s["modules_larger"] == 1
    page = render_html(ev, "third")
    assert "inlining-code-bytes with clang" in page and "<th>default code_bytes</th>" in page


def test_a_clone_is_gated_where_it_departs_from_none_of_the_compilers_answers():
    """The lowest threshold of the grid at which no traced decision departs, else the
    highest: the start of a search from the compiler's own decisions."""
    from mlgo.train.calibrate import GRID, agreeing_gate

    speed = get_problem("inlining-speed")
    data = _decisions(speed)
    clone = MLPPolicy.for_cloning(speed, data)[0]  # untrained: it disagrees often
    gated = agreeing_gate(clone, data)
    answers = gated.gate(gated.logits(data.x), data.default)
    if gated.departure_threshold != GRID[-1]:
        assert (answers == data.default).all()
    lower = [t for t in GRID if t < gated.departure_threshold]
    for t in lower:
        again = replace(clone, departure_threshold=t)
        assert (again.gate(again.logits(data.x), data.default) != data.default).any()
    even = replace(clone, weights=[w * 0 for w in clone.weights])  # p(other) 0.5 everywhere
    assert agreeing_gate(even, data).departure_threshold == GRID[1]  # 0.5 departs at a tie


def test_inlining_for_speed_is_not_searched_on_a_corpus(tmp_path):
    """Its corpus cost is the size beside its speed: a search without a workload is refused
    before anything is written; imitating clang's answers (its start) is not."""
    from mlgo.train.run import run

    speed = get_problem("inlining-speed")
    for algo in ("es", "bcmax", "ppo"):
        with pytest.raises(UsageError, match="inlining-speed has no cost on a corpus"):
            run(algo, None, speed, tmp_path / algo, None, None)  # type: ignore[arg-type]
        assert not (tmp_path / algo).exists()
