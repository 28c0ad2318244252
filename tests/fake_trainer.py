"""A made-up trainer, as a new one would be declared: one module, with its own option
(--stride) in its config, plus its line in mlgo.train.registry.MODULES (the tests add that
line for their lifetime). It compiles nothing, so that the loop's mechanics can be tested
fast."""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

from mlgo.options import positive
from mlgo.problems.policy import MLPPolicy
from mlgo.train.loop import Candidate, Session, Step, Trainer
from mlgo.train.options import option


class Killed(Exception):
    """What a kill -9 does to a step, as far as the run directory can tell."""


@dataclass(frozen=True)
class WalkConfig:
    steps: int = 4
    max_seconds: float = 0.0
    stride: float = field(
        default=1.0, metadata=option("what each step adds to every weight", check=positive)
    )
    rewards: tuple[float, ...] = (0.0, 0.1, 0.3, 0.2, 0.25)  # the start's, then each step's
    eval_every: int = 1
    killed_in: int = 0  # the step a kill stops halfway (0: none)
    seconds_per_step: float = 0.0
    expected_seconds: float = 0.0  # what it says each step will take (0: it cannot tell)


class Walk(Trainer[WalkConfig]):
    """A made-up search: each step adds its stride to every weight and scores the result
    with the next of its config's rewards; its checkpoint is its weights."""

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
        self.theta = self.theta + self.config.stride
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
