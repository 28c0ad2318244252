"""One entry point over the trainers: `run(algo, ...)` checks every input, trains with the
registered trainer ALGO (mlgo.train.registry) from a loaded start into a run directory, and
evaluates the result on the training corpus."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlgo.corpus.format import Corpus
from mlgo.errors import UsageError
from mlgo.llvm.toolchain import Toolchain
from mlgo.options import MOST_STEPS
from mlgo.problems import Problem
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import load_policy
from mlgo.runtime.files import output_dir
from mlgo.runtime.workers import Workers
from mlgo.train import Outcome, RunDir, policy_dir
from mlgo.train.evaluate import Evaluation, evaluate
from mlgo.train.loop import Trainer
from mlgo.train.options import declared
from mlgo.train.registry import get_trainer, options

if TYPE_CHECKING:
    from mlgo.train.loop import Reward


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """What a user may set for a run: the run's own options, and its trainer's by name
    (`registry.options()`: each trainer takes those its config declares and leaves the
    others' to them). Keyword-only: a field added in the middle cannot shift the others."""

    steps: int = 0  # the trainer's steps (bc: epochs, bcmax: iterations); 0: its own number
    max_seconds: float = 0.0  # a search's: stop between steps after this much training
    init: Path | None = None  # the run or policy the start was loaded from, as the card quotes it
    # a search's start keeps its departure gate while training, so that the search moves
    # only the departures from the compiler's own answers (a speed tune's)
    keep_gate: bool = False
    trainer: Mapping[str, Any] = field(default_factory=dict)


@dataclass(kw_only=True)
class Trained(Outcome):
    evaluation: Evaluation | None  # on the training corpus, saved in OUT/eval; None if not asked


# Steps when only the time budget stops training (a run given minutes and no steps).
UNTIL_BUDGET = MOST_STEPS


def configure(config_type: type, opts: TrainOptions) -> Any:
    """CONFIG_TYPE made from the options it declares (mlgo.train.options), each by its own
    name, and the run's where it has their fields: steps 0 leaves the trainer's own number,
    or, given a time budget it takes, as many as the time allows; the start's path is kept
    as given (as the model card quotes it)."""
    has = {f.name for f in fields(config_type)}
    values = {k: v for k, v in opts.trainer.items() if k in declared(config_type)}
    if "max_seconds" in has:
        values["max_seconds"] = opts.max_seconds
    if opts.steps or (opts.max_seconds and "max_seconds" in has):
        values["steps"] = opts.steps or UNTIL_BUDGET
    if opts.init is not None and "init" in has:
        values["init"] = str(opts.init)
    return config_type(**values)


def as_start(policy: MLPPolicy, problem: Problem, where: str) -> MLPPolicy:
    """POLICY (found at WHERE, as a user named it) as a start for PROBLEM: one of PROBLEM, or
    of the problem it `starts_from` (taken over as PROBLEM's: the same decision at another
    stage, for every language)."""
    # A guard holds for the weights it was judged with; what trains from them is judged anew.
    start = replace(policy, guard=None)
    if start.problem is problem:
        return start
    if start.problem.name != problem.starts_from:
        raise UsageError(f"{where} is a {start.problem.name} policy, not {problem.name}")
    # The languages it was calibrated for are its compiles' (a link's module has none).
    return replace(start, problem=problem, languages=None)


def load_start(init: Path, problem: Problem, option: str = "--init") -> MLPPolicy:
    """The policy at INIT (a policy or its run, given as OPTION) as a start for PROBLEM
    (`as_start`)."""
    return as_start(load_policy(policy_dir(init)), problem, f"{option} {init}")


def start_policy(
    algo: str, start: MLPPolicy | None, problem: Problem, keep_gate: bool = False
) -> MLPPolicy | None:
    """The policy ALGO trains from, made from START (None for one that needs none, BC),
    checked with the problem before anything is written; with its departure gate if
    KEEP_GATE."""
    trainer = get_trainer(algo)
    if not trainer.uses_start:
        start = None
    elif start is None:
        raise UsageError(f"--algo {algo} needs --init (a BC run) as its starting point")
    else:
        start = replace(as_start(start, problem, "the start"), languages=None)
        # A calibrated gate (and the languages it holds for) fits the weights it was
        # calibrated with, not new ones: a search that is to move departures keeps it.
        if not keep_gate:
            start = replace(start, departure_threshold=None)
    if (refusal := trainer.refuses(problem)) is not None:
        raise UsageError(refusal)
    return start


def run(
    algo: str,
    corpus: Corpus,
    problem: Problem,
    out: Path,
    tc: Toolchain,
    workers: Workers,
    opts: TrainOptions = TrainOptions(),
    reward: Reward | None = None,
    evaluate_on_corpus: bool = True,
    start: MLPPolicy | None = None,
) -> Trained:
    """Trains ALGO on CORPUS from START (a search's; `load_start` reads one) into the run
    directory OUT (an existing run resumes), scoring by REWARD if given (a search only),
    then evaluates the policy on CORPUS (saved in OUT/eval) unless told not to: a stage
    that only starts another has no use for it. A run that cannot start writes nothing."""
    trainer_type = get_trainer(algo)
    if unknown := sorted(opts.trainer.keys() - options().keys()):
        raise UsageError(f"no trainer takes the option {unknown[0]!r}")
    if reward is not None and not issubclass(trainer_type, Trainer):  # a search scores
        raise UsageError(f"--algo {algo} imitates the default's answers: it scores no reward")
    if reward is None and problem.needs_workload and issubclass(trainer_type, Trainer):
        raise UsageError(
            f"{problem.name} has no cost on a corpus to search by: tune it on a workload "
            f"(mlgo tune --problem {problem.name} --bench CMD)"
        )
    start = start_policy(algo, start, problem, opts.keep_gate)
    trainer = trainer_type(configure(trainer_type.Config, opts))
    with output_dir(out):
        outcome = trainer.train(corpus, problem, start, RunDir(out, algo), tc, workers, reward)
    if not evaluate_on_corpus:
        return Trained(**vars(outcome), evaluation=None)
    evaluation = evaluate(outcome.policy, corpus, tc, workers, problem)
    evaluation.save(out / "eval")
    return Trained(**vars(outcome), evaluation=evaluation)
