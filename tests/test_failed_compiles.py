"""A training step survives a module that fails to compile, and is skipped when most do: ES,
PPO and BC-Max on a copy of the small real corpus whose bitcode goes bad during the run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from mlgo.corpus.format import load_corpus
from mlgo.problems import get_problem
from mlgo.problems.policy import MLPPolicy
from mlgo.runtime.workers import LocalPool
from mlgo.train import Outcome, RunDir, registry
from mlgo.train.bcmax import BCMaxConfig
from mlgo.train.es import ESConfig
from mlgo.train.loop import MIN_COMPILED, Session, Trainer
from mlgo.train.ppo import PPOConfig
from mlgo.train.run import load_start, start_policy
from tests.cli_helpers import POLICIES
from tests.conftest import copy_corpus

PROBLEM = get_problem("inlining-size")
CONFIGS = {  # one step each, on a batch of the whole pool (3 modules), scored on it
    "es": ESConfig(steps=1, directions=2, batch=3, eval_every=1, max_module_seconds=60),
    "ppo": PPOConfig(steps=1, batch=3, epochs=1, eval_every=1, max_module_seconds=60),
    "bcmax": BCMaxConfig(steps=1, search_budget=4, clone_epochs=2, max_module_seconds=60),
}


def breaking(trainer: type[Trainer], count: int) -> type[Trainer]:
    """TRAINER whose corpus goes bad once it has set up (its pool chosen, its start scored):
    the bitcode of COUNT pool modules overwritten, as a rebuild or a failing disk might do
    during a long run."""

    class Breaking(trainer):  # type: ignore[valid-type, misc]
        def start(
            self, run: Session, init: MLPPolicy, arrays: dict[str, np.ndarray] | None
        ) -> float | None:
            reward = super().start(run, init, arrays)
            for module in self.pool[:count]:
                module.bitcode.write_bytes(b"not bitcode")
            return reward

    return Breaking


def train_broken(
    algo: str, count: int, mini_corpus, tc, tmp_path: Path
) -> tuple[MLPPolicy, Outcome]:
    """ALGO's one step from the shipped policy on a copy of the corpus, COUNT of its 3
    pool modules broken after setting up: the start and what training made of it."""
    corpus = load_corpus(copy_corpus(mini_corpus, tmp_path / "corpus"))
    trainer = breaking(registry.get_trainer(algo), count)(CONFIGS[algo])
    assert len(corpus.modules) == 3
    start = start_policy(algo, load_start(POLICIES / "inlining-size", PROBLEM), PROBLEM)
    run_dir = RunDir(tmp_path / algo, algo)
    return start, trainer.train(corpus, PROBLEM, start, run_dir, tc, LocalPool(2))


@pytest.mark.parametrize(
    ("algo", "failed"),
    # ES: the broken module for both sides of both directions, then the policy's scoring;
    # PPO: its rollout, then the scoring; BC-Max: its search (the last scoring is after)
    [("es", 2 * 2 + 1), ("ppo", 1 + 1), ("bcmax", 1)],
)
def test_a_step_survives_a_module_that_fails_to_compile(algo, failed, mini_corpus, tc, tmp_path):
    _, outcome = train_broken(algo, 1, mini_corpus, tc, tmp_path)
    (step,) = outcome.state.history
    assert "skipped" not in step and step[f"{algo}/failed_compiles"] == failed
    assert np.isfinite(step[f"{algo}/pool_reward"])  # scored on the two modules left


@pytest.mark.parametrize("algo", ["es", "ppo", "bcmax"])
def test_a_step_where_most_modules_fail_is_skipped_and_learns_nothing(
    algo, mini_corpus, tc, tmp_path
):
    assert 1 / 3 < MIN_COMPILED < 2 / 3  # the premise: one module of three is too few
    start, outcome = train_broken(algo, 2, mini_corpus, tc, tmp_path)
    (step,) = outcome.state.history
    assert step["skipped"].startswith("only 1 of 3 ") and step[f"{algo}/skipped"] == 1.0
    assert step[f"{algo}/failed_compiles"] > 0 and f"{algo}/pool_reward" not in step
    assert np.array_equal(outcome.policy.flat(), start.flat())  # the start stays the run's
