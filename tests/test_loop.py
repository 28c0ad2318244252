"""The training loop's mechanics with a made-up trainer (tests/fake_trainer.py, no
compiles): the time budget, resuming after a kill, keeping the best policy; and the registry
a trainer joins with one line, its options with it."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import numpy as np
import pytest

from mlgo.corpus.format import Corpus
from mlgo.options import positive
from mlgo.problems import get_problem
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import load_policy
from mlgo.train import RunDir, registry
from mlgo.train.bc import BCConfig
from mlgo.train.bcmax import BCMaxConfig
from mlgo.train.es import ESConfig
from mlgo.train.evaluate import Evaluation
from mlgo.train.options import option
from mlgo.train.ppo import PPOConfig
from mlgo.train.run import UNTIL_BUDGET, TrainOptions, configure, run
from tests.cli_helpers import POLICIES
from tests.fake_trainer import Killed, Walk, WalkConfig

pytestmark = pytest.mark.unit

PROBLEM = get_problem("inlining-size")


@pytest.fixture
def start() -> MLPPolicy:
    return load_policy(POLICIES / "inlining-size")


@pytest.fixture
def scalars(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, dict[str, float]]]:
    """The TensorBoard scalars the loop writes, recorded instead (no TensorFlow here)."""
    written: list[tuple[int, dict[str, float]]] = []
    monkeypatch.setattr(RunDir, "scalars", lambda _, step, values: written.append((step, values)))
    return written


def moved(theta: np.ndarray, start: MLPPolicy, steps: int) -> bool:
    """Whether THETA is START's weights after STEPS steps of the walk (float32 sums)."""
    return np.allclose(theta, start.flat() + steps)


def walk(cfg: WalkConfig, start: MLPPolicy, root: Path):
    """CFG's walk from START in the run directory ROOT (it compiles nothing)."""
    return Walk(cfg).train(Corpus(root, []), PROBLEM, start, RunDir(root, "walk"), None, None)


def test_a_killed_run_resumes_without_losing_or_repeating_a_step_and_keeps_its_best(
    start, scalars, tmp_path
):
    with pytest.raises(Killed):
        walk(WalkConfig(killed_in=3), start, tmp_path)
    state, arrays = RunDir(tmp_path, "walk").load_state()
    assert state.step == 2 and state.compiles == 4
    assert moved(arrays["theta"], start, 2)
    # the best so far (step 2's, reward 0.3) is already the run's policy, whole
    assert moved(load_policy(tmp_path / "policy").flat(), start, 2)
    outcome = walk(WalkConfig(), start, tmp_path)
    state, arrays = RunDir(tmp_path, "walk").load_state()
    assert [h["step"] for h in state.history] == [1, 2, 3, 4] and state.compiles == 8
    assert moved(arrays["theta"], start, 4)  # step 3 once, not twice
    assert [step for step, _ in scalars] == [1, 2, 3, 4]
    assert scalars[-1][1] == {"walk/moved": 1.0, "walk/pool_reward": 0.25}
    # steps 3 and 4 scored less than step 2: its policy stays the run's
    assert (state.extra["init_reward"], state.extra["best_reward"]) == (0.0, 0.3)
    assert moved(outcome.policy.flat(), start, 2)
    assert moved(arrays["best"], start, 2)
    assert moved(load_policy(tmp_path / "policy").flat(), start, 2)
    assert (outcome.state.history, outcome.state.compiles) == (state.history, state.compiles)


def test_a_start_nothing_beats_stays_the_runs_policy(start, scalars, tmp_path):
    outcome = walk(WalkConfig(steps=2, rewards=(0.0, -0.1, -0.2)), start, tmp_path)
    assert outcome.state.extra["best_reward"] == 0.0
    assert moved(outcome.policy.flat(), start, 0)
    assert moved(load_policy(tmp_path / "policy").flat(), start, 0)


def test_the_time_budget_counts_over_resumes_and_its_last_step_is_scored(start, scalars, tmp_path):
    slow = WalkConfig(steps=50, max_seconds=0.005, seconds_per_step=0.01, eval_every=5)
    for _ in range(2):  # spent by the first step; a rerun with the same budget adds none
        outcome = walk(slow, start, tmp_path)
        assert outcome.state.step == 1 and outcome.state.seconds >= 0.01
        assert outcome.state.history[-1]["walk/pool_reward"] == 0.1  # scored: the last
    more = WalkConfig(steps=3, max_seconds=3600, eval_every=5)
    outcome = walk(more, start, tmp_path)
    assert [h["step"] for h in outcome.state.history] == [1, 2, 3]
    assert "walk/pool_reward" not in outcome.state.history[1]  # neither 5th nor last
    assert outcome.state.extra["config"]["max_seconds"] == 3600  # this invocation's


def test_a_step_expected_to_end_past_the_budget_is_not_begun_but_the_first_always_is(
    start, scalars, tmp_path
):
    long = WalkConfig(steps=50, max_seconds=3600, expected_seconds=4000, eval_every=5)
    outcome = walk(long, start, tmp_path)
    assert outcome.state.step == 1  # a second would end near 4000 s, past the 3600
    assert outcome.state.history[-1]["walk/pool_reward"] == 0.1  # scored: the last
    assert walk(long, start, tmp_path).state.step == 1  # a rerun begins none either
    outcome = walk(replace(long, steps=3, expected_seconds=0), start, tmp_path)
    assert outcome.state.step == 3  # the budget itself is far from spent


def test_a_trainer_registered_with_one_line_is_run_by_name(start, monkeypatch, tmp_path):
    monkeypatch.setattr(registry, "MODULES", (*registry.MODULES, "tests.fake_trainer"))
    evaluated = Evaluation(PROBLEM, "made-up clang", "made-up corpus")
    monkeypatch.setattr("mlgo.train.run.evaluate", lambda *_: evaluated)
    monkeypatch.setattr(RunDir, "scalars", lambda *_: None)
    with pytest.raises(ValueError, match="use bc, es, ppo, bcmax or walk"):
        registry.get_trainer("sgd")
    opts = TrainOptions(steps=2, trainer={"lr": 0.5, "stride": 0.5})
    corpus = Corpus(tmp_path, [])
    trained = run("walk", corpus, PROBLEM, tmp_path / "walk", None, None, opts, start=start)
    assert trained.evaluation is evaluated and (tmp_path / "walk" / "eval" / "eval.json").exists()
    assert [h["step"] for h in trained.state.history] == [1, 2]
    # the options its config declares (not --lr), and its own defaults for the rest
    assert trained.state.extra["config"] == asdict(replace(WalkConfig(), steps=2, stride=0.5))
    with pytest.raises(ValueError, match="no trainer takes the option 'strides'"):
        run("walk", corpus, PROBLEM, tmp_path / "typo", None, None,
            TrainOptions(trainer={"strides": 2}), start=start)  # fmt: skip
    assert not (tmp_path / "typo").exists()


def test_each_trainer_takes_the_options_its_config_declares_by_name():
    opts = TrainOptions(init=Path("runs/bc"), trainer={"lr": 0.5, "batch": 3})
    es, ppo = configure(ESConfig, opts), configure(PPOConfig, opts)
    assert (es.lr, es.batch, es.init, es.steps) == (0.5, 3, "runs/bc", ESConfig.steps)
    assert (ppo.lr, ppo.batch, ppo.init) == (PPOConfig.lr, 3, "runs/bc")  # --lr is ES's
    derived = TrainOptions(steps=7, trainer={"derived": True})
    assert configure(BCConfig, derived) == BCConfig(7, True)


def test_the_registry_gives_each_option_once_with_the_trainers_that_take_it(monkeypatch):
    known = registry.options()
    assert known["batch"].help == "es, ppo: modules compiled per step"
    slow = known["max_module_seconds"].help
    assert slow.startswith("es, ppo: modules that compile slower stay out of training; bcmax: ")
    assert (known["sigma"].default, known["sigma"].check) == (0.05, positive)
    assert (known["directions"].type, known["directions"].min) == (int, 1)

    @dataclass(frozen=True)
    class OtherBatch:  # a made-up trainer's --batch with another default
        steps: int = 1
        batch: int = field(default=3, metadata=option("modules per step", min=1))

    es, other = registry.get_trainer("es"), type("Other", (), {"Config": OtherBatch})
    monkeypatch.setattr(registry, "trainers", lambda: {"es": es, "other": other})
    with pytest.raises(TypeError, match="other declares the option batch unlike another"):
        registry.options()


def test_a_time_budget_without_steps_trains_until_the_time_is_spent():
    timed = TrainOptions(max_seconds=3600)
    assert configure(BCMaxConfig, timed).steps == configure(ESConfig, timed).steps == UNTIL_BUDGET
    assert configure(BCMaxConfig, TrainOptions(steps=5, max_seconds=3600)).steps == 5
    assert configure(BCMaxConfig, TrainOptions()).steps == BCMaxConfig.steps  # no budget
    assert configure(BCConfig, timed).steps == BCConfig.steps  # BC takes no time budget


def test_tune_trains_with_bcmax_where_it_can_and_es_elsewhere():
    from mlgo.programs.chain import trainer

    assert trainer(get_problem("inlining-size")) == "bcmax"
    assert trainer(get_problem("regalloc-eviction")) == "es"
    refusal = registry.get_trainer("bcmax").refuses(get_problem("regalloc-eviction"))
    assert refusal == "--algo bcmax searches yes/no decisions; regalloc-eviction's are not"
