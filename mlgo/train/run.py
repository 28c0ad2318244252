"""One entry point over the trainers: `run(algo, ...)` checks every input, trains with the
registered trainer ALGO (mlgo.train.registry) into a run directory, and evaluates the
result on the training corpus."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from mlgo.corpus.format import Corpus
from mlgo.errors import UsageError
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import Problem
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import load_policy
from mlgo.runtime.files import output_dir
from mlgo.runtime.workers import Workers
from mlgo.train import Outcome, RunDir, policy_dir
from mlgo.train.evaluate import Evaluation, evaluate
from mlgo.train.loop import Trainer
from mlgo.train.registry import get_trainer

if TYPE_CHECKING:
    from mlgo.train.loop import Reward


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """What a user may set; each trainer's config takes the fields its OPTIONS name.
    Keyword-only: a field added in the middle cannot shift the others' values."""

    steps: int = 0  # epochs (bc), steps (es, ppo) or iterations (bcmax); 0: the default
    init: Path | None = None  # run or policy to start from (es, ppo, bcmax)
    derived: bool = False  # BC: also feed the default's cost rule
    sigma: float = 0.05  # ES
    directions: int = 8  # ES
    lr: float = 0.02  # ES
    regression_penalty: float = 0.0  # ES
    batch: int = 24  # es, ppo
    max_module_seconds: float = 2.0  # es, ppo, bcmax
    search_budget: int = 24  # bcmax: compiles per module per iteration
    clone_epochs: int = 10  # bcmax: behavioral cloning per iteration
    clone_lr: float = 1e-3  # bcmax
    max_seconds: float = 0.0  # es, ppo, bcmax: stop between steps after this much training
    # es, ppo, bcmax: the start's departure gate kept while training, so that the search
    # moves only the departures from the compiler's own answers (a speed tune's)
    keep_gate: bool = False


@dataclass(kw_only=True)
class Trained(Outcome):
    evaluation: Evaluation | None  # on the training corpus, saved in OUT/eval; None if not asked


# Steps when only the time budget stops training (a run given minutes and no steps).
UNTIL_BUDGET = 1_000_000


def configure(config_type: type, opts: TrainOptions) -> Any:
    """CONFIG_TYPE made from the options its OPTIONS name, each by its own name: steps 0
    leaves the trainer's own number, or, given a time budget it takes, as many as the time
    allows; a path is kept as given (as the model card quotes it)."""
    values = {name: getattr(opts, name) for name in config_type.OPTIONS}
    if not values.get("steps"):
        values.pop("steps", None)
        if values.get("max_seconds"):
            values["steps"] = UNTIL_BUDGET
    return config_type(**{k: str(v) if isinstance(v, Path) else v for k, v in values.items()})


def load_start(init: Path, problem: Problem, option: str = "--init") -> MLPPolicy:
    """The policy at INIT (a policy or its run, given as OPTION) as a start for PROBLEM: one
    of PROBLEM, or of the problem it `starts_from` (taken over as PROBLEM's: the same
    decision at another stage, for every language)."""
    # A guard holds for the weights it was judged with; what trains from them is judged anew.
    start = replace(load_policy(policy_dir(init)), guard=None)
    if start.problem is problem:
        return start
    if start.problem.name != problem.starts_from:
        raise UsageError(f"{option} {init} is a {start.problem.name} policy, not {problem.name}")
    # The languages it was calibrated for are its compiles' (a link's module has none).
    return replace(start, problem=problem, languages=None)


def start_policy(
    algo: str, init: Path | None, problem: Problem, keep_gate: bool = False
) -> MLPPolicy | None:
    """The policy ALGO starts from (None for one that needs none, BC), checked with the
    problem before anything is written; with its departure gate if KEEP_GATE."""
    trainer = get_trainer(algo)
    start = None
    if trainer.uses_start:
        if init is None:
            raise UsageError(f"--algo {algo} needs --init (a BC run) as its starting point")
        start = replace(load_start(init, problem), languages=None)
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
) -> Trained:
    """Trains ALGO on CORPUS into the run directory OUT (an existing run resumes), scoring
    by REWARD if given (a search only), then evaluates the policy on CORPUS (saved in
    OUT/eval) unless told not to: a stage that only starts another has no use for it. A
    run that cannot start writes nothing."""
    trainer_type = get_trainer(algo)
    if reward is not None and not issubclass(trainer_type, Trainer):  # a search scores
        raise UsageError(f"--algo {algo} imitates the default's answers: it scores no reward")
    if reward is None and problem.needs_workload and issubclass(trainer_type, Trainer):
        raise UsageError(
            f"{problem.name} has no cost on a corpus to search by: tune it on a workload "
            f"(mlgo tune --problem {problem.name} --bench CMD)"
        )
    start = start_policy(algo, opts.init, problem, opts.keep_gate)
    trainer = trainer_type(configure(trainer_type.Config, opts))
    with output_dir(out):
        outcome = trainer.train(corpus, problem, start, RunDir(out, algo), tc, workers, reward)
    if not evaluate_on_corpus:
        return Trained(**vars(outcome), evaluation=None)
    evaluation = evaluate(outcome.policy, corpus, tc, workers, problem)
    evaluation.save(out / "eval")
    return Trained(**vars(outcome), evaluation=evaluation)
