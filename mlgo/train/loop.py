"""The one training loop of the searches over whole compiles (ES, PPO, BC-Max).

A trainer says how to set up and how to take one step; the loop does what every run does
around the steps: it resumes from the run directory's checkpoint, counts the steps and the
training time against the budget (summed over resumes, checked between steps: a step the
trainer expects to end past it is not begun), keeps the best policy the steps scored on the
training pool (saved as soon as it is found, so that a stopped run keeps its best), records
the history and TensorBoard scalars, and draws the progress bar. A compile that fails drops
its candidate (a policy, a module) from the step, said in the log and in the step's
`<trainer>/failed_compiles`; a step where too few compiled is skipped (`TooFewCompiled`), so
that one flaky module does not end a long run. A new trainer is a `Trainer` subclass in a
module of its own, registered in mlgo.train.registry.
"""

from __future__ import annotations

import math
import os
import time
from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import ClassVar, Generic, Protocol, TypeVar

import numpy as np
from rich.markup import escape
from rich.progress import Progress

from mlgo.corpus.compile import CompileError
from mlgo.corpus.format import Corpus, Module
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import Problem
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import save_policy
from mlgo.runtime.workers import Workers
from mlgo.train import CHECKPOINT_COPIES, Outcome, RunDir, RunState

# A step goes on with the candidates that compiled (ES's antithetic pairs, the modules of a
# batch, a search or a scoring) while at least this share of them did, as ml-compiler-opt's
# learner does; below it the step is skipped: a gradient from a few directions is mostly
# noise, and so many failures are more likely a broken corpus or compiler than bad luck.
MIN_COMPILED = 0.4


class TooFewCompiled(CompileError):
    """Fewer than MIN_COMPILED of a step's candidates compiled: the loop skips the step."""


def require_compiled(compiled: int, total: int, what: str) -> None:
    """Raises TooFewCompiled unless COMPILED of TOTAL candidates (WHAT they are) is enough."""
    if compiled < MIN_COMPILED * total:
        raise TooFewCompiled(
            f"only {compiled} of {total} {what} compiled (fewer than {MIN_COMPILED:.0%})"
        )


class Reward(Protocol):
    """What a search scores policies by: the relative reduction of a cost against the
    default's (higher is better). `rollouts.Scorer` is the corpus's, module by module; another
    (mlgo.programs.speed's) may not look at the modules at all. A policy some of whose
    compiles failed may be scored NaN (`Scorer.rewards`)."""

    def rewards(self, policies: list[MLPPolicy], modules: list[Module]) -> np.ndarray: ...

    def reward(self, policy: MLPPolicy, modules: list[Module]) -> float: ...

    def take_compiles(self) -> int: ...

    @property
    def per_module(self) -> bool: ...  # False: a batch of modules scores the whole pool

    @property
    def label(self) -> str: ...  # what the progress line calls the cost it lowers


class Budget(Protocol):
    """What the loop reads of a trainer's config (a frozen dataclass)."""

    @property
    def steps(self) -> int: ...

    @property
    def max_seconds(self) -> float: ...  # training time over all resumes (0: no limit)


ConfigT = TypeVar("ConfigT", bound=Budget)


@dataclass(frozen=True)
class Candidate:
    """A policy a trainer compiled on its whole training pool, and its reward there."""

    policy: MLPPolicy
    reward: float


@dataclass(frozen=True)
class Step:
    """What one step did: its metrics (history and TensorBoard, keys "<trainer>/..."), and
    the policy it scored on the pool, if it scored one."""

    metrics: dict[str, float]
    candidate: Candidate | None = None


class Trainer(ABC, Generic[ConfigT]):
    """A search the loop steps, made from its config. Its checkpoint is its `arrays`, saved
    with the loop's own after every step."""

    name: ClassVar[str]  # --algo, the run's algo, its metrics' prefix
    title: ClassVar[str]  # its progress bar's
    Config: ClassVar[type]  # its config dataclass, declaring its options (mlgo.train.options)
    uses_start: ClassVar[bool] = True  # trains from a start policy (--init)

    def __init__(self, config: ConfigT):
        self.config = config

    @classmethod
    def refuses(cls, problem: Problem) -> str | None:
        """Why it cannot train PROBLEM, as said to a user; None: it can."""
        return None

    def resumable(self, root: Path) -> bool:
        """Whether the run directory ROOT holds what the trainer resumes from besides its
        checkpoint arrays; a run that does not starts over."""
        return True

    def reward_label(self, problem: Problem) -> str:
        """What the progress line calls the reward."""
        return problem.reward_metric

    @abstractmethod
    def start(
        self, run: Session, init: MLPPolicy, arrays: dict[str, np.ndarray] | None
    ) -> float | None:
        """Sets up from INIT for a new run (ARRAYS None), or restores from the checkpoint
        ARRAYS. Returns INIT's pool reward if it scored INIT (the run's first candidate);
        None otherwise."""

    @abstractmethod
    def step(self, run: Session) -> Step:
        """One step; it counts its compiles in run.state.compiles and tells `run.dropped`
        the failed ones. It raises TooFewCompiled where too few compiled: the loop then
        skips it, keeping what the trainer changed before (ES and PPO raise before they
        learn from a batch that failed)."""

    @abstractmethod
    def arrays(self) -> dict[str, np.ndarray]:
        """What it resumes from, as the checkpoint's arrays."""

    def finish(self, run: Session) -> Candidate | None:
        """Once the steps are over: a last policy scored on the pool, if any."""
        return None

    def next_step_seconds(self, run: Session, steps_done: int) -> float:
        """The least training time the step after STEPS_DONE steps will take, as far as the
        trainer can tell (0: it cannot): a time budget does not begin a step that would end
        past it."""
        return 0.0

    def train(
        self,
        corpus: Corpus,
        problem: Problem,
        start: MLPPolicy | None,
        run_dir: RunDir,
        tc: Toolchain,
        workers: Workers,
        reward: Reward | None = None,
    ) -> Outcome:
        """Trains (or resumes) from START in RUN_DIR until the steps or the time budget are
        spent, scoring by REWARD if given (else the corpus's metric); the best policy so
        far is in run_dir.policy_dir at every moment."""
        assert start is not None and start.problem is problem  # as run.start_policy makes it
        with Progress() as bar:
            return Session(self, start, run_dir, corpus, tc, workers, bar, reward).train()


class Session:
    """One run of a trainer: its inputs, its record (`state`: the trainer counts its
    compiles there and keeps its own facts in state.extra), and what a step may ask of the
    loop: the time spent, whether the run ends after this step, a checkpoint mid-step."""

    def __init__(
        self,
        trainer: Trainer,
        init: MLPPolicy,
        run_dir: RunDir,
        corpus: Corpus,
        tc: Toolchain,
        workers: Workers,
        bar: Progress,
        reward: Reward | None = None,
    ):
        self.trainer, self.init, self.run_dir = trainer, init, run_dir
        self.corpus, self.tc, self.workers, self.bar = corpus, tc, workers, bar
        self.reward = reward  # None: the corpus's metric (`rollouts.scored_pool`)
        self.state = RunState(trainer.name, extra={"best_reward": -math.inf})
        self.best = init.flat()  # the best policy's weights
        self._since = time.monotonic()  # training time not in state.seconds yet
        self._failed: list[str] = []  # the failed compiles not reported yet

    def dropped(self, failures: list[str]) -> None:
        """Compiles that failed (each its error line), their candidates left out: reported
        with the step, or with the start or the finish."""
        self._failed += failures

    def elapsed(self) -> float:
        """Seconds of training so far, over all resumes and this step's too."""
        return self.state.seconds + time.monotonic() - self._since

    def ends_here(self) -> bool:
        """Whether the run ends after the current step: its last, or the budget is spent or
        would be by the next."""
        return self._stops_after(self.state.step + 1, self.elapsed())

    def due(self, every: int) -> bool:
        """Whether the current step is one to score on the pool: every EVERY-th step, and
        the last (a run ends with its policy scored)."""
        return (self.state.step + 1) % every == 0 or self.ends_here()

    def checkpoint(self) -> None:
        """Saves the run as it stands; mid-step too (BC-Max, once it has searched), so
        that a kill replays the step from there."""
        self.run_dir.save_state(self.state, {"best": self.best, **self.trainer.arrays()})

    def train(self) -> Outcome:
        """Starts or resumes, steps until the run ends, and returns its best policy."""
        trainer, config = self.trainer, self.trainer.config
        job = self.bar.add_task(trainer.title, total=None if config.max_seconds else config.steps)
        self._start()
        self.bar.update(job, completed=self.state.step)
        self._since = time.monotonic()  # setting up is not training
        while not self._stops_after(self.state.step, self.state.seconds):
            skipped: dict[str, str] = {}
            try:
                step = trainer.step(self)
            except TooFewCompiled as e:  # nothing to learn from: the next step tries anew
                step, skipped = Step({f"{trainer.name}/skipped": 1.0}), {"skipped": str(e)}
            last = self.ends_here()
            self.state.step += 1
            if step.candidate is not None:
                self._keep(step.candidate)
            self._book_time()
            metrics = {**step.metrics, **self._failures(f"step {self.state.step}", skipped)}
            self.state.history.append(
                {"step": self.state.step, "compiles": self.state.compiles, **metrics, **skipped}
            )
            self.checkpoint()
            self.run_dir.scalars(self.state.step, metrics)
            self.bar.update(job, completed=self.state.step, description=self._progress())
            if last:
                break
        try:
            final = trainer.finish(self)
        except TooFewCompiled as e:  # the steps' best stands
            final = None
            self._failures("the last scoring", {"skipped": str(e)})
        if final is not None:
            self._keep(final)
            self._book_time()
            self.checkpoint()
        policy = self.init.with_flat(self.best)
        save_policy(policy, self.run_dir.policy_dir)
        return Outcome(policy, state=self.state)

    def _start(self) -> None:
        """The trainer set up, from the checkpoint if the run directory holds one. The
        config is this invocation's: the rest of the run follows it."""
        trainer, init = self.trainer, self.init
        resumes = trainer.resumable(self.run_dir.root)
        saved = self.run_dir.load_state(self._checkpoint_bound()) if resumes else None
        arrays = None
        if saved is not None:
            self.state, arrays = saved
            self.best = arrays["best"]
        self.state.extra["config"] = asdict(trainer.config)
        init_reward = trainer.start(self, init, arrays)
        self._failures("the start", {})
        if saved is None:  # the start is the best policy until one beats it
            save_policy(init, self.run_dir.policy_dir)
        if init_reward is not None:
            self._keep(Candidate(init, init_reward))

    def _checkpoint_bound(self) -> int:
        """The most numbers a checkpoint of this run can hold: the policy's weights a few
        times over (the best, the current, Adam's moments) and once per module (BC-Max's
        kept answerers), and per decision a trajectory's features, answer and record, a
        module holding at most one decision per byte of its bitcode."""
        weights, features = self.init.flat().size, self.init.normalizer.width
        modules = self.corpus.modules
        decisions = sum(_size(m.bitcode) for m in modules)
        return (CHECKPOINT_COPIES + len(modules)) * weights + decisions * (features + 64)

    def _keep(self, candidate: Candidate) -> None:
        """CANDIDATE as the best policy if it is better, saved at once. The first a run
        scores is its start: its reward is the run's init_reward."""
        extra = self.state.extra
        extra.setdefault("init_reward", candidate.reward)
        if candidate.reward > extra["best_reward"]:
            extra["best_reward"] = candidate.reward
            self.best = candidate.policy.flat()
            save_policy(candidate.policy, self.run_dir.policy_dir)

    def _stops_after(self, steps_done: int, seconds: float) -> bool:
        """Whether the run stops once STEPS_DONE steps and SECONDS of training (summed over
        resumes) are behind it: it reached its steps, or its time budget (0: none) is spent
        or would be by the next step (a run takes one step whatever it costs). Checked
        between steps, so a budget ends the run with a whole step and its best policy so
        far."""
        config = self.trainer.config
        if steps_done >= config.steps:
            return True
        if not config.max_seconds:
            return False
        ahead = self.trainer.next_step_seconds(self, steps_done) if steps_done else 0.0
        return config.max_seconds <= seconds + ahead

    def _failures(self, when: str, skipped: dict[str, str]) -> dict[str, float]:
        """The failed compiles since the last report, said in one line with WHEN they
        happened (and why it was SKIPPED, if it was), as the step's metric."""
        failed, self._failed = self._failed, []
        if failed or skipped:
            why = f"; skipped: {skipped['skipped']}" if skipped else ""
            example = f", e.g. {failed[0]}" if failed else ""
            self.bar.console.print(
                f"[yellow]{when}: {len(failed)} compiles failed, left out{escape(example)}"
                f"{escape(why)}",
                highlight=False,
            )
        return {f"{self.trainer.name}/failed_compiles": float(len(failed))} if failed else {}

    def _book_time(self) -> None:
        now = time.monotonic()
        self.state.seconds += now - self._since
        self._since = now

    def _progress(self) -> str:
        """The progress line, in the sign every report uses: a reward is the metric's
        relative reduction, so the best so far prints as its change (negative: lower than
        the default)."""
        problem = self.init.problem
        label = self.trainer.reward_label(problem) if self.reward is None else self.reward.label
        best = self.state.extra["best_reward"]
        if best == -math.inf:  # every step so far skipped, and the start not scored
            return f"{self.trainer.title} (nothing scored yet)"
        return f"{self.trainer.title} (best so far: {label} {-best:+.2%} against the default)"


def _size(path: Path) -> int:
    """PATH's size in bytes; 0 if it cannot be read (its compile will say why)."""
    try:
        return os.stat(path).st_size
    except OSError:
        return 0
