"""One entry point over the trainers: `run(algo, ...)` checks every input, trains with bc, es,
ppo or bcmax into a run directory, and evaluates the result on the training corpus."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path

from mlgo.corpus.format import Corpus
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import Problem
from mlgo.problems.policy import MLPPolicy
from mlgo.runtime.files import output_dir
from mlgo.runtime.workers import Workers
from mlgo.train import RunDir, policy_dir
from mlgo.train.evaluate import Evaluation, evaluate

ALGOS = ("bc", "es", "ppo", "bcmax")


@dataclass(frozen=True, kw_only=True)
class TrainOptions:
    """What a user may set; each trainer reads the fields it knows. Keyword-only: a field
    added in the middle cannot shift the others' values."""

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


@dataclass
class Trained:
    policy: MLPPolicy
    evaluation: Evaluation  # on the training corpus, saved in OUT/eval
    accuracy: dict[str, float] = field(default_factory=dict)  # BC, on the default's decisions
    decisions: int = 0  # BC: default decisions it learned from
    left_out: int = 0  # BC: modules whose default traces failed to compile


def start_policy(algo: str, init: Path | None, problem: Problem) -> MLPPolicy | None:
    """The policy ES, PPO or BC-Max starts from (None for BC), checked before anything is
    written."""
    if algo not in ALGOS:
        raise ValueError(f"unknown --algo {algo!r}: use bc, es, ppo or bcmax")
    if algo == "bc":
        return None
    if init is None:
        raise ValueError(f"--algo {algo} needs --init (a BC run) as its starting point")
    start = MLPPolicy.load(policy_dir(init))
    if start.problem is not problem:
        raise ValueError(f"--init {init} is a {start.problem.name} policy, not {problem.name}")
    if algo == "bcmax":
        from mlgo.train.bcmax import check_problem

        check_problem(problem)
    # A calibrated gate (and the languages it holds for) fits the weights it was calibrated
    # with, not new ones.
    return replace(start, departure_threshold=None, languages=None)


def run(
    algo: str,
    corpus: Corpus,
    problem: Problem,
    out: Path,
    tc: Toolchain,
    workers: Workers,
    opts: TrainOptions = TrainOptions(),
) -> Trained:
    """Trains ALGO on CORPUS into the run directory OUT (an existing run resumes), then
    evaluates the policy on CORPUS. A run that cannot start writes nothing."""
    start = start_policy(algo, opts.init, problem)
    with output_dir(out):
        run_dir = RunDir(out, algo)
        notes: dict = {}
        if start is None:
            policy = _bc(corpus, problem, run_dir, tc, workers, opts, notes)
        else:
            policy = _search(algo, corpus, start, run_dir, tc, workers, opts)
        evaluation = evaluate(policy, corpus, tc, workers, problem)
        evaluation.save(out / "eval")
    return Trained(policy, evaluation, **notes)


def _bc(
    corpus: Corpus,
    problem: Problem,
    run_dir: RunDir,
    tc: Toolchain,
    workers: Workers,
    opts: TrainOptions,
    notes: dict,
) -> MLPPolicy:
    """Collects the default traces of CORPUS into the run once, then imitates them; NOTES
    gets what the result reports about BC."""
    from mlgo.traces.collect import collect
    from mlgo.traces.dataset import load_decisions
    from mlgo.train.bc import train_bc

    manifest = collect(problem, corpus, run_dir.traces_dir, tc, workers)
    data = load_decisions(run_dir.traces_dir, problem)
    policy, accuracy = train_bc(
        data, problem, run_dir, epochs=opts.steps or 30, derived=opts.derived
    )
    notes.update(accuracy=accuracy, decisions=len(data.default), left_out=len(manifest.failed))
    return policy


def _search(
    algo: str,
    corpus: Corpus,
    start: MLPPolicy,
    run_dir: RunDir,
    tc: Toolchain,
    workers: Workers,
    opts: TrainOptions,
) -> MLPPolicy:
    """ES, PPO or BC-Max from START: all score whole compiles of CORPUS modules."""
    if algo == "bcmax":
        from mlgo.train.bcmax import BCMaxConfig, train_bcmax

        cfg = BCMaxConfig(
            steps=opts.steps or BCMaxConfig.steps,
            search_budget=opts.search_budget,
            clone_epochs=opts.clone_epochs,
            clone_lr=opts.clone_lr,
            max_module_seconds=opts.max_module_seconds,
            init=str(opts.init),
            max_seconds=opts.max_seconds,
        )
        return train_bcmax(corpus, start, run_dir, tc, workers, cfg)
    common = {
        "batch": opts.batch,
        "max_module_seconds": opts.max_module_seconds,
        "init": str(opts.init),
        "max_seconds": opts.max_seconds,
    }
    if algo == "es":
        from mlgo.train.es import ESConfig, train_es

        cfg = ESConfig(
            steps=opts.steps or ESConfig.steps,
            sigma=opts.sigma,
            directions=opts.directions,
            lr=opts.lr,
            regression_penalty=opts.regression_penalty,
            **common,
        )
        return train_es(corpus, start, run_dir, tc, workers, cfg)
    from mlgo.train.ppo import PPOConfig, train_ppo

    return train_ppo(
        corpus,
        start,
        run_dir,
        tc,
        workers,
        PPOConfig(steps=opts.steps or PPOConfig.steps, **common),
    )
