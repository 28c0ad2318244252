"""The training loop's mechanics with a made-up trainer (no compiles): the time budget,
resuming after a kill, keeping the best policy; and the registry a trainer joins with one
line."""

from __future__ import annotations

import time
from dataclasses import asdict, dataclass, fields, replace
from pathlib import Path
from typing import ClassVar

import numpy as np
import pytest

from mlgo.corpus.format import Corpus
from mlgo.problems import get_problem
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import load_policy
from mlgo.train import RunDir, registry
from mlgo.train.bc import BCConfig
from mlgo.train.bcmax import BCMaxConfig
from mlgo.train.es import ESConfig
from mlgo.train.evaluate import Evaluation
from mlgo.train.loop import Candidate, Session, Step, Trainer
from mlgo.train.ppo import PPOConfig
from mlgo.train.run import UNTIL_BUDGET, TrainOptions, configure, run
from tests.cli_helpers import POLICIES

pytestmark = pytest.mark.unit

PROBLEM = get_problem("inlining-size")


class Killed(Exception):
    """What a kill -9 does to a step, as far as the run directory can tell."""


@dataclass(frozen=True)
class WalkConfig:
    OPTIONS: ClassVar[tuple[str, ...]] = ("steps", "max_seconds")

    steps: int = 4
    max_seconds: float = 0.0
    rewards: tuple[float, ...] = (0.0, 0.1, 0.3, 0.2, 0.25)  # the start's, then each step's
    eval_every: int = 1
    killed_in: int = 0  # the step a kill stops halfway (0: none)
    seconds_per_step: float = 0.0
    expected_seconds: float = 0.0  # what it says each step will take (0: it cannot tell)


class Walk(Trainer[WalkConfig]):
    """A made-up search: each step adds 1 to every weight and scores the result with the
    next of its config's rewards; its checkpoint is its weights."""

    name = "walk"
    title = "walking"
    Config = WalkConfig

    def start(
        self, run: Session, init: MLPPolicy, arrays: dict[str, np.ndarray] | None
    ) -> float | None:
        self.init = init
        if arrays is not None:
            self.theta = arrays["theta"]
            return None
        self.theta = init.flat()
        return self.config.rewards[0]

    def step(self, run: Session) -> Step:
        number = run.state.step + 1
        self.theta = self.theta + 1
        time.sleep(self.config.seconds_per_step)
        if number == self.config.killed_in:
            raise Killed
        run.state.compiles += 2
        if not run.due(self.config.eval_every):
            return Step({"walk/moved": 1.0})
        scored = Candidate(self.init.with_flat(self.theta), self.config.rewards[number])
        return Step({"walk/moved": 1.0, "walk/pool_reward": scored.reward}, scored)

    def next_step_seconds(self, run: Session, steps_done: int) -> float:
        return self.config.expected_seconds

    def arrays(self) -> dict[str, np.ndarray]:
        return {"theta": self.theta}


TRAINER = Walk  # what `registry.MODULES` finds in this module


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
    monkeypatch.setattr(registry, "MODULES", (*registry.MODULES, "tests.test_loop"))
    evaluated = Evaluation(PROBLEM, "made-up clang", "made-up corpus")
    monkeypatch.setattr("mlgo.train.run.evaluate", lambda *_: evaluated)
    monkeypatch.setattr(RunDir, "scalars", lambda *_: None)
    with pytest.raises(ValueError, match="use bc, es, ppo, bcmax or walk"):
        registry.get_trainer("sgd")
    opts = TrainOptions(steps=2, init=POLICIES / "inlining-size", lr=0.5)
    trained = run("walk", Corpus(tmp_path, []), PROBLEM, tmp_path / "walk", None, None, opts)
    assert trained.evaluation is evaluated and (tmp_path / "walk" / "eval" / "eval.json").exists()
    assert [h["step"] for h in trained.state.history] == [1, 2]
    # the options its config names (not --lr), and its own defaults for the rest
    assert trained.state.extra["config"] == asdict(replace(WalkConfig(), steps=2))


def test_each_trainer_takes_the_options_its_config_names_by_name():
    options = {f.name for f in fields(TrainOptions)}
    assert all(set(t.Config.OPTIONS) <= options for t in registry.trainers().values())
    opts = TrainOptions(lr=0.5, batch=3, init=Path("runs/bc"))
    es, ppo = configure(ESConfig, opts), configure(PPOConfig, opts)
    assert (es.lr, es.batch, es.init, es.steps) == (0.5, 3, "runs/bc", ESConfig.steps)
    assert (ppo.lr, ppo.batch, ppo.init) == (PPOConfig.lr, 3, "runs/bc")  # --lr is ES's
    assert configure(BCConfig, TrainOptions(steps=7, derived=True)) == BCConfig(7, True)


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
