"""Policies and training on the small real corpus: BC, ES, resume after kill -9, eval, report."""

import json
import os
import signal
import subprocess
import time
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mlgo.problems import get_problem
from mlgo.problems.normalizer import Normalizer
from mlgo.problems.policy_files import load_policy, save_policy
from mlgo.programs.speed import read_costs
from mlgo.runtime.commands import BuildError
from mlgo.runtime.workers import LocalPool, make_workers
from mlgo.traces.collect import collect
from mlgo.traces.dataset import load_decisions
from mlgo.train import RunDir
from mlgo.train.bc import train_bc
from mlgo.train.calibrate import GRID, NEVER, choose
from mlgo.train.es import ES, ESConfig
from mlgo.train.evaluate import Evaluation, evaluate
from mlgo.train.modelcard import model_card
from mlgo.train.report import render_html, summary
from mlgo.train.run import load_start, start_policy
from tests.cli_helpers import POLICIES
from tests.conftest import MLGO, assert_saved_best_is_best_evaluated, run_mlgo

PROBLEM = get_problem("inlining-size")


@pytest.fixture(scope="module")
def bc_run(mini_corpus, tc, tmp_path_factory):
    run = RunDir(tmp_path_factory.mktemp("bc"), "bc")
    collect(PROBLEM, mini_corpus, run.traces_dir, tc, LocalPool(2))
    data = load_decisions(run.traces_dir, PROBLEM)
    policy, acc = train_bc(data, PROBLEM, run, epochs=40)
    return run, data, policy, acc


@pytest.mark.unit
def test_normalizer_is_monotone_and_bounded():
    x = np.arange(100, dtype=np.float64)[:, None]
    norm = Normalizer.fit(["f"], x, n=10)
    q = norm.transform(np.array([[-5.0], [0.0], [50.0], [99.0], [1e9]]))[:, 0]
    assert np.all(np.diff(q) >= 0) and q[0] == 0.0 and q[-1] == 1.0


def test_bc_reproduces_the_default_and_saves_a_policy(bc_run, mini_corpus, tc):
    run, data, policy, acc = bc_run
    assert acc["accuracy"] >= 0.95
    loaded = load_policy(run.policy_dir)
    assert np.array_equal(loaded.logits(data.x), policy.logits(data.x))
    ev = evaluate(loaded, mini_corpus, tc, LocalPool(2), PROBLEM)
    assert not ev.failed and abs(ev.totals()["delta"]) < 0.02


def test_bc_resumes_from_its_checkpoint(bc_run):
    run, data, _, _ = bc_run
    state, _ = run.load_state()
    assert state.step == 40 and len(state.history) == 40
    policy, _ = train_bc(data, PROBLEM, run, epochs=42)
    state, _ = run.load_state()
    assert state.step == 42 and [h["epoch"] for h in state.history] == list(range(1, 43))


def test_es_moves_the_weights_and_keeps_the_best_evaluated_policy(
    bc_run, mini_corpus, tc, tmp_path
):
    _, _, policy, _ = bc_run
    run = RunDir(tmp_path / "es", "es")
    cfg = ESConfig(
        steps=2,
        directions=2,
        batch=3,
        eval_every=1,
        max_module_seconds=60,
        lr=0.005,
        init="policies/start",
    )
    best = ES(cfg).train(mini_corpus, PROBLEM, policy, run, tc, LocalPool(2)).policy
    state, _ = run.load_state()
    assert state.step == 2 and state.compiles >= 2 * 2 * 3 * 2
    arrays = assert_saved_best_is_best_evaluated(run, policy)
    assert not np.allclose(arrays["theta"], policy.flat())  # two Adam steps moved it
    assert np.array_equal(load_policy(run.policy_dir).flat(), best.flat())
    # its model card retrains it from where it started, with the step size it used
    card = model_card(best, run.root)
    assert "mlgo train --algo es --init policies/start " in card and " --lr 0.005" in card
    assert " --max-module-seconds 60" in card and "--algo bc" not in card


def _es_args(bc_dir: RunDir, corpus: Path, out: Path) -> list[str]:
    """`mlgo train --algo es` from the BC run, on CORPUS, into OUT."""
    init = ["--init", str(bc_dir.root)]
    return ["train", "--algo", "es", "--corpus", str(corpus), "--out", str(out), *init]


def test_a_pool_limit_that_leaves_no_module_says_so(bc_run, mini_corpus, tmp_path):
    bc_dir, _, _, _ = bc_run
    out = tmp_path / "es"
    args = _es_args(bc_dir, mini_corpus.root, out)
    r = run_mlgo(*args, "--max-module-seconds", "0.000001", timeout=600)
    assert r.returncode != 0
    assert "no module with call sites and a cost compiles within 1e-06 s" in r.stderr
    assert not (out / "policy").exists()


@pytest.mark.slow
def test_killed_es_training_resumes_without_losing_steps(bc_run, mini_corpus, tmp_path):
    bc_dir, _, bc_policy, _ = bc_run
    out = tmp_path / "es"
    args = [*_es_args(bc_dir, mini_corpus.root, out), "--steps", "6"]
    proc = subprocess.Popen([*MLGO, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 300
    while time.monotonic() < deadline:
        state = out / "state.json"
        if state.exists() and json.loads(state.read_text())["step"] >= 1:
            break
        time.sleep(0.1)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed_at = json.loads((out / "state.json").read_text())["step"]
    assert 1 <= killed_at < 6
    # the killed run already holds its best policy so far, whole
    assert load_policy(out / "policy").flat().size == bc_policy.flat().size
    r = run_mlgo(*args, timeout=600)
    assert r.returncode == 0, r.stderr
    state = json.loads((out / "state.json").read_text())
    assert state["step"] == 6 and [h["step"] for h in state["history"]] == list(range(1, 7))
    assert not list(out.rglob("*.tmp"))


@pytest.mark.slow
def test_eval_and_report(bc_run, mini_corpus, tc, tmp_path):
    run, _, policy, _ = bc_run
    r = run_mlgo(
        "eval",
        "--policy",
        str(run.root),
        "--corpus",
        str(mini_corpus.root),
        "--out",
        str(tmp_path / "ev"),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    ev = Evaluation.load(tmp_path / "ev")
    assert set(ev.modules) == {m.name for m in mini_corpus.modules}
    html = render_html(ev, "test")
    assert html.count("data:image/png;base64,") == 2 and "minipkg" in html
    assert summary(ev)["totals"]["modules"] == 3
    r = run_mlgo(
        "report",
        str(tmp_path / "ev"),
        "--html",
        str(tmp_path / "r.html"),
        "--json",
        str(tmp_path / "r.json"),
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert json.loads((tmp_path / "r.json").read_text())["totals"]["modules"] == 3


@pytest.mark.unit
def test_calibration_keeps_the_smallest_safe_threshold_the_higher_of_equals():
    """The lowest change with no package larger (a row's or one language's alone)."""

    def row(t, change, larger=(), failed=()):
        return {"threshold": t, "change": change, "packages_larger": larger, "failed": failed}

    sweep = [row(0.5, -0.03, ["a"]), row(0.7, -0.01), row(0.9, -0.01), row(0.99, -0.005)]
    assert choose(sweep) == (0.9, None)
    assert choose([row(0.5, -0.02, ["a"]), row(0.9, -0.01, failed=["a/m.c"])]) == (NEVER, None)
    # a language alone: chosen where it is safe and shrinks most, every language on a tie
    alone = {"c": row(0.5, -0.02), "c++": row(0.5, 0.01, ["cxxpkg"])}
    assert choose([{**row(0.5, -0.03, ["cxxpkg"]), "by_language": alone}]) == (0.5, ("c",))
    alone = {"c": row(0.9, -0.01), "c++": row(0.9, 0.0)}
    assert choose([{**row(0.9, -0.01), "by_language": alone}]) == (0.9, None)


@pytest.mark.unit
def test_a_budget_judged_by_a_workload_keeps_what_judging_takes(tmp_path):
    """A speed tune's minutes are its training's and its judging's: training stops with
    what judging its candidates and timing the finalists will take left, as the builds so
    far took (their seconds kept beside their costs, so a resumed tune knows them), and an
    ES step is not begun that its earlier steps say would end past the budget."""
    from types import SimpleNamespace

    from mlgo.programs.chain import training_seconds
    from mlgo.programs.measure import Timing
    from mlgo.programs.speed import SECONDS, WorkloadReward
    from mlgo.train.candidates import FINALISTS

    speed = get_problem("inlining-speed")
    none_yet = WorkloadReward(None, tmp_path, tmp_path, None, speed, Timing(10, 1.0, 4))
    assert none_yet.seconds_for(5, FINALISTS) == 0.0
    (tmp_path / SECONDS).write_text('{"plain": 20.0, "f00d": 40.0, "beef": 30.0}')
    reward = WorkloadReward(None, tmp_path, tmp_path, None, speed, Timing(10, 1.0, 4))
    timing = 10 * (FINALISTS + 2) * 4 * 1.0  # each build at each layout, plain twice, a round
    # two costed at once (SIDE_BY_SIDE), the clock's builds one at a time
    assert reward.seconds_for(5, FINALISTS) == 30.0 * (3 + FINALISTS + 1) + timing
    assert reward.seconds_for(8) == 4 * 30.0  # a search step: its builds alone
    assert training_seconds(1800, 120, 600) == 1080
    assert training_seconds(1800, 120, 3600) == 1.0  # one step, whatever it costs
    assert training_seconds(0, 120, 600) == 0.0  # no budget
    run = SimpleNamespace(state=SimpleNamespace(seconds=600.0))
    assert ES(ESConfig(max_seconds=1800)).next_step_seconds(run, 3) == 200.0


@pytest.mark.unit
def test_one_language_alone_is_a_candidate_only_where_the_policy_departs_in_two():
    from mlgo.train.calibrate import departing_languages

    language = {"p/a.o": "c", "p/b.o": "c", "p/x.o": "c++", "p/y.o": None}
    rows = {"p/a.o": 2, "p/b.o": 0, "p/x.o": 0, "p/y.o": 3}
    ev = Evaluation(PROBLEM, "t", "c", {n: {"changed": c} for n, c in rows.items()})
    assert departing_languages(ev, language) == ["c"]  # C alone: the policy itself
    ev.modules["p/x.o"]["changed"] = 1
    assert departing_languages(ev, language) == ["c", "c++"]


@pytest.mark.unit
def test_a_kept_workload_cost_file_that_is_not_one_is_refused_naming_it(tmp_path):
    """A speed tune resumed keeps its builds' costs; a file of anything else stops it in
    one line naming the file, which is left as it was."""
    path = tmp_path / "costs.json"
    for text in ("{", "[1.5]", '{"plain": "1"}', '{"plain": -1.0}', '{"plain": true}'):
        path.write_text(text)
        with pytest.raises(BuildError, match=f"{path}: .*remove it"):
            read_costs(path)
        assert path.read_text() == text
    path.write_text('{"plain": 2.5, "f00d": 3}')
    assert read_costs(path) == {"plain": 2.5, "f00d": 3}


@pytest.mark.slow
def test_calibrate_writes_a_gated_policy_no_package_grows_with(mini_corpus, tc, tmp_path):
    """An eager policy (shipped, pushed towards "inline") grows the package ungated; the
    calibrated one is written with its sweep, and re-evaluated grows no package."""
    eager = load_policy(POLICIES / "inlining-size")
    eager.weights[-1] = eager.weights[-1] + np.array([0.0, 6.0], np.float32)
    save_policy(eager, tmp_path / "eager")
    args = ("calibrate", "--policy", str(tmp_path / "eager"), "--corpus", str(mini_corpus.root))
    r = run_mlgo(*args, "--out", str(tmp_path / "cal"), timeout=600)
    assert r.returncode == 0, r.stderr
    record = json.loads((tmp_path / "cal" / "calibration.json").read_text())
    assert [row["threshold"] for row in record["sweep"]] == list(GRID)
    assert record["sweep"][0]["packages_larger"] == ["minipkg"]
    gated = load_policy(tmp_path / "cal")
    assert (gated.departure_threshold, gated.languages) == choose(record["sweep"])
    assert gated.departure_threshold == record["threshold"]
    assert ("never departs" in r.stderr) == (not record["safe"])
    with closing(make_workers("local")) as pool:
        ev = evaluate(gated, mini_corpus, tc, pool, gated.problem)
    assert ev.per_package()["minipkg"]["delta"] <= 0
    r = run_mlgo(*args, "--out", str(tmp_path / "eager"), timeout=120)
    assert r.returncode != 0 and r.stderr.count("\n") == 1 and "is the policy itself" in r.stderr
    (tmp_path / "mine").mkdir()
    (tmp_path / "mine" / "notes.txt").write_text("keep")
    r = run_mlgo(*args, "--out", str(tmp_path / "mine"), timeout=120)
    assert r.returncode != 0 and "not a policy directory" in r.stderr
    assert (tmp_path / "mine" / "notes.txt").read_text() == "keep"


def test_calibrating_for_the_guard_judges_as_served_and_asks_for_it(mini_corpus, tc, tmp_path):
    """--guard: each threshold judged as MLGO_GUARD=size serves it, so the eager policy that
    grows the package ungated grows nothing; the policy written asks to be guarded, and its
    evaluation reports what is served beside the policy alone."""
    eager = load_policy(POLICIES / "inlining-size")
    eager.weights[-1] = eager.weights[-1] + np.array([0.0, 6.0], np.float32)
    save_policy(eager, tmp_path / "eager")
    corpus = ("--corpus", str(mini_corpus.root))
    r = run_mlgo("calibrate", "--guard", "--policy", str(tmp_path / "eager"), *corpus,
                 "--out", str(tmp_path / "cal"), timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    assert "guarded (MLGO_GUARD=size)" in r.stdout
    record = json.loads((tmp_path / "cal" / "calibration.json").read_text())
    assert record["guard"] == "size" and record["safe"]
    assert all(not row["packages_larger"] for row in record["sweep"])
    calibrated = load_policy(tmp_path / "cal")
    assert calibrated.guard == "size" and calibrated.departure_threshold == record["threshold"]
    r = run_mlgo("eval", "--policy", str(tmp_path / "cal"), *corpus, "--out",
                 str(tmp_path / "eval-mini"), timeout=600)  # fmt: skip
    assert r.returncode == 0, r.stderr
    alone, served = (Evaluation.load(tmp_path / d) for d in ("eval-mini", "eval-mini/guarded"))
    assert served.modules == alone.guarded().modules
    chosen = next(row for row in record["sweep"] if row["threshold"] == record["threshold"])
    assert served.totals()["delta"] == pytest.approx(chosen["change"])
    assert not served.packages_larger()
    card = model_card(calibrated, tmp_path)  # the evaluations beside it, as served too
    assert "| eval-mini | " in card and "| eval-mini, guarded | " in card
    assert "It is served guarded" in card


def test_a_policy_for_another_language_leaves_every_module_to_the_default(mini_corpus, tc):
    """Evaluated as it is served: the C corpus's modules are the default's, none compiled."""
    eager = load_policy(POLICIES / "inlining-size")
    eager.weights[-1] = eager.weights[-1] + np.array([0.0, 6.0], np.float32)
    with closing(make_workers("local")) as pool:
        ev = evaluate(eager, mini_corpus, tc, pool, eager.problem)
        assert ev.totals()["delta"] != 0  # the premise: it changes the C modules
        cxx_only = evaluate(
            replace(eager, languages=("c++",)), mini_corpus, tc, pool, eager.problem
        )
    assert cxx_only.totals()["delta"] == 0 and cxx_only.packages_larger() == []
    assert all(r["decisions"] == 0 for r in cxx_only.modules.values())
    assert cxx_only.modules.keys() == ev.modules.keys()
    assert ev.with_default(set(ev.modules)).totals() == cxx_only.totals()


@pytest.mark.unit
def test_training_from_a_calibrated_policy_starts_without_its_gate(tmp_path):
    gated = replace(load_policy(POLICIES / "inlining-size"), departure_threshold=0.9)
    save_policy(gated, tmp_path / "gated")
    start = start_policy("es", load_start(tmp_path / "gated", PROBLEM), PROBLEM)
    assert start is not None and start.departure_threshold is None


@pytest.mark.unit
def test_a_policy_that_is_not_one_is_rejected(tmp_path):
    with pytest.raises(ValueError, match="not a policy"):
        load_policy(tmp_path)


def test_saved_model_decides_like_the_policy_on_real_features(bc_run, tmp_path):
    from mlgo.ship.export import export_saved_model, saved_model_decisions

    run, data, policy, _ = bc_run
    saved = export_saved_model(policy, tmp_path)
    assert (saved / "output_spec.json").exists() and not list(tmp_path.glob(".*partial"))
    rows = slice(0, 60)
    got = saved_model_decisions(saved, {f: data.x[rows, j] for j, f in enumerate(data.features)})
    assert np.array_equal(got, np.argmax(policy.logits(data.x[rows]), 1))


def test_ppo_with_tf_agents_trains_and_resumes(bc_run, mini_corpus, tc, tmp_path):
    from mlgo.train.ppo import PPO, Agent, PPOConfig

    _, _, policy, _ = bc_run
    run = RunDir(tmp_path / "ppo", "ppo")
    cfg = PPOConfig(steps=2, batch=3, epochs=2, eval_every=1, max_module_seconds=60)
    PPO(cfg).train(mini_corpus, PROBLEM, policy, run, tc, LocalPool(2))
    state, _ = run.load_state()
    assert state.step == 2 and (run.root / "agent").is_dir()
    assert all(np.isfinite(h["ppo/loss"]) for h in state.history)
    assert_saved_best_is_best_evaluated(run, policy)
    agent = Agent(policy, cfg)
    agent.restore(run.root / "agent")
    assert not np.allclose(replace(policy, weights=agent.weights()).flat(), policy.flat())
    # A rerun with a larger budget continues from step 2.
    PPO(replace(cfg, steps=3)).train(mini_corpus, PROBLEM, policy, run, tc, LocalPool(2))
    state, _ = run.load_state()
    assert [h["step"] for h in state.history] == [1, 2, 3]


def test_derived_inputs_reach_the_saved_model(bc_run, tmp_path):
    from mlgo.ship.export import export_saved_model, saved_model_decisions

    _, data, _, _ = bc_run
    policy, acc = train_bc(data, PROBLEM, RunDir(tmp_path / "bc", "bc"), epochs=20, derived=True)
    assert [d.name for d in policy.normalizer.derived] == ["cost_margin", "default_rule"]
    assert acc["accuracy"] >= 0.95
    saved = export_saved_model(policy, tmp_path)
    rows = slice(0, 60)
    got = saved_model_decisions(saved, {f: data.x[rows, j] for j, f in enumerate(data.features)})
    assert np.array_equal(got, np.argmax(policy.logits(data.x[rows]), 1))


def test_train_run_is_one_entry_point_over_bc_and_es(mini_corpus, tc, tmp_path):
    # what `mlgo train` calls: BC collects its traces and reports its accuracy, ES starts
    # from the BC run with the options given, and both runs are evaluated into OUT/eval
    from mlgo.train.run import TrainOptions, run

    bc = run("bc", mini_corpus, PROBLEM, tmp_path / "bc", tc, LocalPool(2), TrainOptions(steps=40))
    assert bc.accuracy["accuracy"] > 0.5 and bc.decisions > 0 and bc.left_out == 0
    assert Evaluation.load(tmp_path / "bc" / "eval").totals() == bc.evaluation.totals()
    assert bc.evaluation.totals()["modules"] == len(mini_corpus.modules)
    knobs = {"directions": 2, "batch": 3, "lr": 0.005}
    opts = TrainOptions(steps=1, init=tmp_path / "bc", trainer=knobs)
    es = run("es", mini_corpus, PROBLEM, tmp_path / "es", tc, LocalPool(2), opts, start=bc.policy)
    state, _ = RunDir(tmp_path / "es", "es").load_state()
    assert state.step == 1 and state.compiles >= 2 * 2 * 3
    assert_saved_best_is_best_evaluated(RunDir(tmp_path / "es", "es"), bc.policy)
    assert (tmp_path / "es" / "eval" / "eval.json").exists() and not es.accuracy
    card = model_card(es.policy, tmp_path / "es")  # retrains the BC run it started from too
    flags = "--corpus data/corpus --problem inlining-size"
    bc_line = card.index(f"mlgo train --algo bc {flags} --out runs/bc\n")
    es_line = card.index(f"mlgo train --algo es --init runs/bc {flags} --out runs/es --steps 1")
    assert bc_line < es_line and " --lr 0.005" in card
    assert "- with the runs it started from (bc): " in card
    with pytest.raises(ValueError, match="is a inlining-size policy, not regalloc-eviction"):
        run("ppo", mini_corpus, get_problem("regalloc-eviction"), tmp_path / "ppo", tc,
            LocalPool(1), start=bc.policy)  # fmt: skip
    assert not (tmp_path / "ppo").exists()


@pytest.mark.parametrize("algo", ["es", "ppo"])
def test_a_time_budget_stops_training_after_a_whole_evaluated_step(
    algo, bc_run, mini_corpus, tc, tmp_path
):
    # `mlgo tune`'s --minutes: a budget spent after the first step ends the run there, with
    # that step evaluated (not only every eval_every steps); a rerun trains no further
    from mlgo.train.run import TrainOptions, run

    bc_dir, _, policy, _ = bc_run
    knobs = {"directions": 2, "batch": 3, "max_module_seconds": 60}
    opts = TrainOptions(steps=50, init=bc_dir.root, max_seconds=1e-3, trainer=knobs)
    for _ in range(2):
        run(algo, mini_corpus, PROBLEM, tmp_path / algo, tc, LocalPool(2), opts, start=policy)
        state, _ = RunDir(tmp_path / algo, algo).load_state()
        assert state.step == 1 and state.seconds >= 1e-3
        assert f"{algo}/pool_reward" in state.history[-1]
