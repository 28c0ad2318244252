"""BC-Max on the small real corpus: the per-module search, the trainer, its resume."""

import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest

from mlgo.corpus.compile import compile_module
from mlgo.data import shipped_policy
from mlgo.problems import get_problem
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import load_policy
from mlgo.runtime.workers import LocalPool
from mlgo.train import RunDir
from mlgo.train.bcmax import (
    Answerer,
    BCMax,
    BCMaxConfig,
    SearchConfig,
    SearchTask,
    search_module,
)
from mlgo.train.evaluate import baseline
from mlgo.train.modelcard import model_card
from mlgo.train.run import load_start, run
from tests.conftest import MLGO, run_mlgo

PROBLEM = get_problem("inlining-size")


@pytest.fixture(scope="module")
def shipped() -> MLPPolicy:
    return load_policy(shipped_policy("inlining-size"))


@pytest.fixture(scope="module")
def default_sizes(mini_corpus, tc) -> dict[str, float]:
    base = baseline(mini_corpus, tc, LocalPool(2), PROBLEM).costs
    return {name: b["text_once"] for name, b in base.items()}


def made_up_decisions(policy: MLPPolicy, n: int, clang_inlines) -> list:
    """N decisions with every feature POLICY reads, and clang's answer CLANG_INLINES(i)."""
    from mlgo.llvm.log_format import Observation

    names = policy.normalizer.features
    return [
        Observation(
            "f",
            i,
            {f: np.array([i * 7 % 13 + j]) for j, f in enumerate(names)}
            | {"inlining_default": np.array([clang_inlines(i)])},
        )
        for i in range(n)
    ]


@pytest.mark.unit
def test_an_answerer_flips_the_indices_it_names_and_samples_reproducibly(shipped):
    obs = made_up_decisions(shipped, 40, lambda i: i % 2)
    default = Answerer(PROBLEM)
    assert [default(o) for o in obs] == [o.index % 2 for o in obs]
    flipped = default.flipped({3, 5}).flipped({5})  # flipping twice undoes a flip
    assert [flipped(o) for o in obs] == [
        1 - o.index % 2 if o.index == 3 else o.index % 2 for o in obs
    ]
    hot = Answerer(PROBLEM, replace(shipped, temperature=50.0), seed=(1,))
    first = [hot(o) for o in obs]
    assert [hot(o) for o in reversed(obs)] == first[::-1]  # one stream per decision
    other = [Answerer(PROBLEM, replace(shipped, temperature=50.0), seed=(2,))(o) for o in obs]
    assert first != other


@pytest.mark.unit
def test_a_group_move_answers_every_call_site_of_one_callee_alike():
    from mlgo.llvm.log_format import Observation

    callee = {"callee_conditionally_executed_blocks": 2, "is_callee_avail_external": 0}
    obs = [  # call sites 0, 2 and 4 call one callee, 1 and 3 another
        Observation(
            "f",
            i,
            {"inlining_default": np.array([i % 3 == 0])}
            | {f: np.array([v]) for f, v in callee.items()}
            | {"callee_basic_block_count": np.array([5 if i % 2 == 0 else 9])},
        )
        for i in range(5)
    ]
    default = Answerer(PROBLEM)
    assert [default(o) for o in obs] == [1, 0, 0, 1, 0]
    inline_all = default.moved([((5, 2, 0), 1)])
    assert [inline_all(o) for o in obs] == [1, 0, 1, 1, 1]
    assert [inline_all.moved([3])(o) for o in obs] == [1, 0, 1, 0, 1]  # then flips
    none = inline_all.moved([((5, 2, 0), 0)])  # a group has one answer: the last moved
    assert len(none.groups) == 1 and [none(o) for o in obs] == [0, 0, 0, 1, 0]


@pytest.mark.unit
def test_the_answerers_kept_in_a_checkpoint_answer_as_before(shipped):
    from mlgo.train.bcmax import decode_answerers, encode_answerers

    obs = made_up_decisions(shipped, 30, lambda i: i % 3 == 0)
    moved = replace(shipped, weights=[w * 1.5 for w in shipped.weights])
    kept = [
        None,
        Answerer(PROBLEM).flipped({2}),
        Answerer(PROBLEM, replace(moved, temperature=0.0), flips=frozenset({1, 7})),
        Answerer(PROBLEM, replace(moved, temperature=1.0), (4, 2, 1)).moved([((5, 2, 0), 1)]),
        Answerer(PROBLEM, shipped),
    ]
    arrays = encode_answerers(kept)
    assert arrays["kept_policies"].shape[0] == 2  # each policy stored once
    assert all(a.dtype != object for a in arrays.values())  # loads without pickle
    again = decode_answerers(arrays, shipped)
    assert again[0] is None and again[1].policy is None
    for a, b in zip(again[1:], kept[1:], strict=True):
        assert (a.seed, a.flips, a.groups) == (b.seed, b.flips, b.groups)
        assert a.policy is None or np.array_equal(a.policy.flat(), b.policy.flat())
    assert [[a(o) for o in obs] for a in again[1:]] == [[a(o) for o in obs] for a in kept[1:]]
    assert decode_answerers({}, shipped) == []  # a checkpoint from before


@pytest.mark.unit
def test_a_time_budget_shrinks_each_search_to_a_share_of_the_time_left():
    from mlgo.train.bcmax import MIN_BUDGET, iteration_budget

    cfg = BCMaxConfig(search_budget=48, max_seconds=3600)
    assert iteration_budget(cfg, 3600, 10.0) == 48  # a quarter of an hour: 90 passes
    assert iteration_budget(cfg, 3600, 100.0) == 9
    assert iteration_budget(cfg, 60, 100.0) == MIN_BUDGET  # never too few to search at all
    assert iteration_budget(cfg, 3600, 10.0, 500.0) == 40  # the slow modules' compiles first
    assert iteration_budget(replace(cfg, max_seconds=0), 0, 100.0) == 48  # no time budget


@pytest.mark.unit
def test_cloning_a_large_code_bases_decisions_takes_fewer_epochs_counted_not_timed():
    from mlgo.train.bcmax import MOST_DECISIONS_CLONED, clone_epochs

    assert clone_epochs(400, 20_000) == 400  # a small project's clone is as configured
    assert clone_epochs(400, 585_708) == MOST_DECISIONS_CLONED // 585_708 < 400
    assert clone_epochs(400, 10 * MOST_DECISIONS_CLONED) == 1  # never none
    assert clone_epochs(10, 585_708) == 10  # the cap only ever lowers the configured number


@pytest.mark.unit
def test_a_time_budget_expects_the_next_search_at_the_least_budget_unless_it_is_done():
    from types import SimpleNamespace

    from mlgo.train.bcmax import MIN_BUDGET, BCMax

    trainer = BCMax(BCMaxConfig(max_seconds=3600))
    trainer.seconds, trainer.slow = np.array([1.0, 2.0, 30.0]), np.array([False, False, True])
    run = SimpleNamespace(state=SimpleNamespace(extra={"wall_per_second": 0.5, "searched": 2}))
    assert trainer.next_step_seconds(run, 2) == 0.5 * (MIN_BUDGET * 3.0 + 30.0)
    assert trainer.next_step_seconds(run, 1) == 0.0  # searched before a kill: cloning is left


def test_each_round_flips_decisions_not_tried_yet_least_sure_first(shipped, mini_corpus):
    from mlgo.train.bcmax import Trajectory, _Search

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 50, (30, len(shipped.normalizer.features)))
    traj = Trajectory(0.0, np.zeros(30, np.int64), x, Answerer(PROBLEM, shipped))
    task = SearchTask(PROBLEM, mini_corpus.modules[0], "clang", shipped, SearchConfig(singles=4))
    search = _Search(task)
    batches = []
    while flips := search.untried_flips(traj):
        batches.append(flips)
    tried = [i for b in batches for i in b]
    assert sorted(tried) == list(range(30)) and len(batches) == 8  # each once, 4 a round
    top2 = np.sort(shipped.logits(x), 1)[:, -2:]
    assert batches[0] == list(np.argsort(top2[:, 1] - top2[:, 0], kind="stable")[:4])
    # another seed (another BC-Max iteration) reaches the others in another order
    other = _Search(replace(task, seed=1))
    assert other.untried_flips(traj) == batches[0] and other.untried_flips(traj) != batches[1]


def test_a_flip_moves_the_decisions_the_policy_cannot_tell_apart_together(shipped, mini_corpus):
    from mlgo.train.bcmax import Trajectory, _Search

    rng = np.random.default_rng(0)
    x = rng.uniform(0, 50, (12, len(shipped.normalizer.features)))
    x[7], x[10] = x[2], x[2]  # three call sites the policy sees alike
    traj = Trajectory(0.0, np.zeros(12, np.int64), x, Answerer(PROBLEM, shipped))
    task = SearchTask(PROBLEM, mini_corpus.modules[0], "clang", shipped, SearchConfig(singles=0))
    search = _Search(task)
    flips = search.untried_flips(traj)
    assert len(flips) == 10 and len({2, 7, 10} & set(flips)) == 1  # one flip for the three
    twin = ({2, 7, 10} & set(flips)).pop()
    assert search.moved(traj.answerer, [twin]).flips == {2, 7, 10}
    assert search.moved(traj.answerer, [0, twin]).flips == {0, 2, 7, 10}
    alone = _Search(replace(task, cfg=SearchConfig(singles=0, twins=False)))
    assert sorted(alone.untried_flips(traj)) == list(range(12))  # each flip alone, as before
    assert alone.moved(traj.answerer, [2]).flips == {2}


def test_each_round_moves_groups_not_tried_yet_largest_first(shipped, mini_corpus):
    from mlgo.train.bcmax import Trajectory, _Search

    groups = [(1,), (2,), (1,), (3,), (2,), (1,), (4,)]
    actions = np.array([0, 1, 1, 0, 1, 0, 1])
    traj = Trajectory(0.0, actions, np.zeros((7, 1)), Answerer(PROBLEM), groups)
    task = SearchTask(PROBLEM, mini_corpus.modules[0], "clang", None, SearchConfig(groups=2))
    search = _Search(task)
    # (1,) is mixed: both answers; (2,) all inlined: only "none"; (3,), (4,) alone: no move
    assert search.untried_groups(traj) == [((1,), 1), ((1,), 0)]
    assert search.untried_groups(traj) == [((2,), 0)]
    assert search.untried_groups(traj) == []
    alone = replace(task, cfg=SearchConfig(move_groups=False))
    assert _Search(alone).untried_groups(traj) == []  # single flips alone


# What the search found on each module of the small corpus, measured before its compiles
# were made cheaper: (best size, best answers, flips kept, compiles), by the policy it
# started from (the shipped one, one that never inlines, none). A change that makes the
# search's compile cheaper must not change what it asks, answers or measures.
SEARCHED = {
    ("minipkg/hash.o", "never"): (441, [1, 0, 1, 0, 0, 0, 0, 0], [0, 2], 12),
    ("minipkg/hash.o", "shipped"): (441, [1, 0, 1, 0, 0, 0, 0, 0], [], 10),
    ("minipkg/hash.o", "default"): (441, [1, 0, 1, 0, 0, 0, 0, 0], [], 10),
    ("minipkg/main.o", "never"): (335, [0, 0, 1, 0, 0], [2], 12),
    ("minipkg/main.o", "shipped"): (335, [0, 0, 1, 0, 0], [], 6),
    ("minipkg/main.o", "default"): (335, [0, 0, 1, 0, 0], [], 7),
    ("minipkg/strbuf.o", "never"): (422, [1, 0, 1, 0, 1, 0, 0, 0], [0, 2, 4], 12),
    ("minipkg/strbuf.o", "shipped"): (422, [1, 0, 1, 0, 1, 0, 0, 0], [], 12),
    ("minipkg/strbuf.o", "default"): (422, [1, 0, 1, 0, 1, 0, 0, 0], [], 11),
}


def test_a_searched_modules_best_trajectory_and_size_are_as_measured_before(
    shipped, mini_corpus, tc
):
    w = [*shipped.weights[:-1], shipped.weights[-1] + np.array([30.0, -30.0], np.float32)]
    policies = {"never": replace(shipped, weights=w), "shipped": shipped, "default": None}
    # sampled trajectories too (hot, so that they differ), and from the policy alone
    cfg = SearchConfig(budget=12, samples=1, temperature=30.0)
    found = {}
    for m in mini_corpus.modules:
        for name, policy in policies.items():
            task = SearchTask(PROBLEM, m, tc.clang, policy, cfg, policy is None, seed=7)
            r = search_module(task)
            flips = sorted(r.best.answerer.flips)
            found[m.name, name] = (r.best.cost, r.best.actions.tolist(), flips, r.compiles)
    assert found == SEARCHED


def test_a_searchs_curve_is_its_best_after_each_compile_greedy_or_in_rounds(
    shipped, mini_corpus, tc
):
    """What a search finds per compile spent (tools/bench_yield.py reads it): one point a
    compile, never rising, ending at the best, which compiles again to its cost; a greedy
    search (each helpful move kept at once) as much as one in rounds."""
    for m in mini_corpus.modules:
        for greedy in (False, True):
            cfg = SearchConfig(budget=10, greedy=greedy)
            r = search_module(SearchTask(PROBLEM, m, tc.clang, shipped, cfg, True, seed=3))
            assert len(r.curve) == r.compiles <= cfg.budget
            assert all(a >= b for a, b in zip(r.curve, r.curve[1:], strict=False))
            assert r.curve[-1] == r.best.cost <= min(r.starts.values())
            again = compile_module(PROBLEM, m, tc.clang, r.best.answerer)
            assert again.metrics["text_once"] == r.best.cost


def test_a_module_without_call_sites_is_searched_without_error(mini_corpus, tc, tmp_path):
    (tmp_path / "leaf.c").write_text("int leaf(int x) { return x * 3 + 1; }\n")
    bitcode = tmp_path / "leaf.bc"
    cmd = [tc.clang, "-Oz", "-c", "-emit-llvm", "-Xclang", "-disable-llvm-passes"]
    subprocess.run([*cmd, str(tmp_path / "leaf.c"), "-o", str(bitcode)], check=True)
    module = replace(mini_corpus.modules[0], name="minipkg/leaf.o", bitcode=bitcode)
    r = search_module(SearchTask(PROBLEM, module, tc.clang, None, SearchConfig(budget=4)))
    assert len(r.best.actions) == 0 and r.best.groups == [] and r.compiles == 1


@pytest.mark.slow  # whole searches of every module; the rounds' rules are tested above
def test_the_search_improves_on_a_poor_policy_within_its_budget(
    mini_corpus, tc, shipped, default_sizes
):
    # a policy that never inlines: the tiny package's modules grow, and flips find it out
    w = [*shipped.weights[:-1], shipped.weights[-1] + np.array([30.0, -30.0], np.float32)]
    never = replace(shipped, weights=w)
    cfg = SearchConfig(budget=12, singles=8, samples=1)
    tasks = [SearchTask(PROBLEM, m, tc.clang, never, cfg) for m in mini_corpus.modules]
    for task, r in LocalPool(2).imap(search_module, tasks):
        name = task.module.name
        assert r.starts["default"] == default_sizes[name]  # the channel replays the default
        assert r.starts["policy"] > r.starts["default"]
        assert r.best.cost <= r.starts["default"] and r.compiles <= cfg.budget
        # the best trajectory is real: compiling its recipe again gives it again
        again = compile_module(PROBLEM, task.module, tc.clang, r.best.answerer)
        assert again.metrics["text_once"] == r.best.cost
        assert np.array_equal(again.advice, r.best.actions) and len(r.best.x) == len(again.advice)
        # without the default to fall back on, the search itself beats the policy
        alone = search_module(replace(task, with_default=False))
        assert "default" not in alone.starts and alone.best.cost < alone.starts["policy"]
        # a search given the best kept so far goes on from it, not from the policy
        goes_on = search_module(replace(task, with_default=False, resume=r.best.answerer))
        assert goes_on.starts["kept"] == r.best.cost and goes_on.best.cost <= r.best.cost


def test_bcmax_trains_resumes_and_keeps_the_best(mini_corpus, tc, tmp_path, shipped, default_sizes):
    out = RunDir(tmp_path / "bcmax", "bcmax")
    cfg = BCMaxConfig(steps=1, search_budget=6, clone_epochs=2, max_module_seconds=60)
    BCMax(cfg).train(mini_corpus, PROBLEM, shipped, out, tc, LocalPool(2))
    state, arrays = out.load_state()
    assert state.step == 1 and state.extra["searched"] == 1 and state.extra["evaluated"] == 1
    names = state.extra["modules"]
    # never worse than the default on any module
    assert all(c <= default_sizes[n] for c, n in zip(arrays["traj_cost"], names, strict=True))
    clone = load_policy(out.root / "clone-1" / "policy")
    assert np.array_equal(clone.flat(), arrays["theta"])
    assert not np.array_equal(clone.flat(), shipped.flat())  # cloning moved it
    first_compiles = state.compiles
    assert len(names) <= first_compiles <= len(names) * (6 + 1)  # search + final pool eval
    # a rerun with more iterations resumes: one more search and clone, nothing redone
    BCMax(replace(cfg, steps=2)).train(mini_corpus, PROBLEM, shipped, out, tc, LocalPool(2))
    state, again = out.load_state()
    assert state.step == 2 and [h["step"] for h in state.history] == [1, 2]
    assert (again["traj_cost"] <= arrays["traj_cost"]).all()  # the best only ever improves
    found = [h["bcmax/found"] for h in state.history]  # the bytes its progress line says
    gain = again["default_cost"] - again["traj_cost"]
    assert found == sorted(found) and found[-1] == pytest.approx(gain[gain > 0].sum())
    assert state.compiles > first_compiles and (out.root / "clone-2" / "policy").exists()
    saved = load_policy(out.policy_dir).flat()
    assert np.array_equal(saved, again["best"])
    rewards = [state.extra["init_reward"], state.extra["final_reward"]]
    rewards += [h["bcmax/pool_reward"] for h in state.history]
    assert state.extra["best_reward"] == max(rewards)
    card = model_card(load_policy(out.policy_dir), out.root)  # retrains it as it was run
    assert "mlgo train --algo bcmax --init " in card and " --search-budget 6" in card
    assert " --clone-epochs 2 --clone-lr 0.001" in card


def test_what_the_search_found_counts_only_the_modules_it_saved_on():
    """The progress line's bytes: per module the default's cost less the best trajectory's,
    where that is a saving; a module no search reached (NaN) or none beat counts nothing."""
    from types import SimpleNamespace

    bcmax = BCMax(BCMaxConfig())
    bcmax.base = np.array([100.0, 50.0, 80.0, 40.0])
    bcmax.trajectories = SimpleNamespace(cost=np.array([90.0, np.nan, 80.0, 33.0]))
    assert bcmax.found() == 17.0


def test_a_slow_module_is_compiled_with_the_policy_not_searched(
    mini_corpus, tc, tmp_path, shipped, default_sizes
):
    out = RunDir(tmp_path / "bcmax", "bcmax")
    cfg = BCMaxConfig(steps=1, search_budget=6, clone_epochs=1, max_module_seconds=1e-9)
    BCMax(cfg).train(mini_corpus, PROBLEM, shipped, out, tc, LocalPool(2))
    state, arrays = out.load_state()
    names = state.extra["modules"]
    assert len(names) == state.extra["pool"] > 0  # every module is slow, and still in the pool
    # the default's trajectory and the policy's, then the final evaluation: no search
    assert state.compiles == 3 * len(names)
    assert all(c <= default_sizes[n] for c, n in zip(arrays["traj_cost"], names, strict=True))


@pytest.mark.slow
def test_killed_bcmax_resumes_from_its_search(mini_corpus, tmp_path):
    out = tmp_path / "bcmax"
    init = str(shipped_policy("inlining-size"))
    args = ["train", "--algo", "bcmax", "--corpus", str(mini_corpus.root), "--out", str(out)]
    args += ["--init", init, "--steps", "1", "--search-budget", "4", "--max-module-seconds", "60"]
    args += ["--minutes", "30", "--clone-epochs", "3", "--clone-lr", "0.002"]
    proc = subprocess.Popen([*MLGO, *args], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + 120
    state = out / "state.json"
    while time.monotonic() < deadline and proc.poll() is None:
        if state.exists() and json.loads(state.read_text())["extra"]["searched"] >= 1:
            break
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    killed = json.loads(state.read_text())
    assert killed["step"] == 0 and killed["extra"]["searched"] == 1  # killed while cloning
    load_policy(out / "policy")  # the run holds its best policy so far, whole
    r = run_mlgo(*args, timeout=300)
    assert r.returncode == 0, r.stderr
    done = json.loads(state.read_text())
    assert done["step"] == 1 and done["extra"]["searched"] == 1
    config = done["extra"]["config"]  # each option reached its own setting
    assert (config["steps"], config["search_budget"], config["max_module_seconds"]) == (1, 4, 60)
    assert (config["max_seconds"], config["clone_epochs"], config["clone_lr"]) == (1800, 3, 0.002)
    assert len(json.loads((out / "clone-1" / "state.json").read_text())["history"]) == 3
    # the search was not repeated: only the final pool evaluation was added
    assert done["compiles"] == killed["compiles"] + done["extra"]["pool"]
    assert "training corpus text_once" in r.stdout and not list(out.rglob("*.tmp"))


def test_bcmax_refuses_a_problem_it_cannot_flip(mini_corpus, tc, tmp_path):
    regalloc = get_problem("regalloc-eviction")
    start = load_start(shipped_policy("regalloc-eviction"), regalloc)
    with pytest.raises(ValueError, match="bcmax searches yes/no decisions"):
        run("bcmax", mini_corpus, regalloc, tmp_path / "r", tc, LocalPool(1), start=start)
    assert not (tmp_path / "r").exists()


def test_the_headroom_tool_runs_the_same_search(mini_corpus, tmp_path, default_sizes):
    tool = Path(__file__).resolve().parents[1] / "tools" / "headroom_inlining.py"
    out = tmp_path / "headroom.json"
    args = ["--corpus", str(mini_corpus.root), "--budget", "3", "--json", str(out)]
    r = subprocess.run([sys.executable, str(tool), *args], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    report = json.loads(out.read_text())
    assert report["modules"].keys() == default_sizes.keys()
    for name, m in report["modules"].items():
        assert m["default"] == default_sizes[name] and m["search"] <= m["default"]
    assert len(default_sizes) <= report["compiles"] <= 3 * len(default_sizes)


def test_the_searchs_compiles_are_counted_in_plain_builds_of_the_corpus(mini_corpus, tc, tmp_path):
    """A module's compile costs its plain compile seconds out of the corpus's: the search
    of every module, once each, is one build; of the one module, its share of the build."""
    from mlgo.corpus.stats import corpus_stats
    from mlgo.programs.chain import Chain, search_compiles
    from mlgo.programs.tune_run import TuneDir
    from mlgo.train import RunState

    chain = Chain(mini_corpus.root, PROBLEM, tmp_path, TuneDir(tmp_path), tc, 1)
    names = [m.name for m in mini_corpus.modules]
    with LocalPool(2) as pool:
        stats, _ = corpus_stats(mini_corpus, tc.describe(), tc.clang, pool)
        every = search_compiles(RunState("bcmax", compiles=9, extra={"modules": names}),
                                mini_corpus, chain, pool)  # fmt: skip
        one = search_compiles(RunState("bcmax", compiles=9, extra={"modules": names[:1]}),
                              mini_corpus, chain, pool)  # fmt: skip
    assert every["compiles"] == 9 and every["compiles_per_build"] == pytest.approx(len(names))
    seconds = {n: s["seconds"] for n, s in stats.items()}
    assert one["compiles_per_build"] == pytest.approx(sum(seconds.values()) / seconds[names[0]])
    assert search_compiles(None, mini_corpus, chain, pool) == {}
