"""The chain: train from a start, make candidates, judge them, keep one.

A tune runs it on a user's own code (`choose_policy`): clang's own decisions, the start and
the trained policy at a few departure thresholds (`train/candidates.py`) are each weighed
on the recorded corpus, and where the corpus's cost would mislead by a `Judge`
(`judges.py`: the real link, a workload's cost and its clock); the cheapest is kept, the
earliest of equals, so that a policy that does not beat clang's own on the code it will
build is not served. A shipped link-time policy's recipe runs it on held-out code
(`linked_choice`): judged on validation by the link, tested once.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass, replace
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING

from mlgo.corpus.format import Corpus, load_corpus
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import Problem
from mlgo.problems.policy_files import save_policy
from mlgo.programs.judges import (
    Judge,
    candidate_judge,
    judgement,
    linked_evaluations,
    rank_correlation,
)
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.inputs import read_json
from mlgo.runtime.workers import Workers, make_workers
from mlgo.train import RunState
from mlgo.train.candidates import (
    FINALISTS,
    GATES,
    Candidates,
    Weigh,
    cheapest,
    cheapest_distinct,
    clangs_own,
    none_larger,
    smaller,
    surely_faster,
    the_start,
    threshold_grid,
    trained_and_gated,
)
from mlgo.train.evaluate import Evaluation

if TYPE_CHECKING:
    from mlgo.problems.policy import MLPPolicy
    from mlgo.programs.tune_run import TuneDir, TuneRun
    from mlgo.train.loop import Reward
    from mlgo.train.run import Trained

ON_TRAINING_CODE = "measured on the modules it trained on, not on held-out code"
# Training on the code it will build: every module is searched however slowly it compiles,
# more compiles per module, and the best trajectories cloned until the policy has them
# (a held-out corpus would want fewer epochs; here the training code is the shipped code).
OWN_CODE = {
    "max_module_seconds": 600.0,
    "search_budget": 48,
    "clone_epochs": 400,
    "clone_lr": 3e-3,
}
# The start of a problem with no shipped policy, as a tune's candidates name it
CLONED = "clang's own, cloned"


def cloned_start(problem: Problem, traces: Path, start: Path, base: int | None = None) -> None:
    """Clang's own decisions on the recorded code (TRACES; made at BASE where given) cloned
    into a policy at START (its cloning run beside it): the start of a problem with none
    shipped. Gated so that it departs from none of them (`agreeing_gate`): on cmark the
    clone alone disagreed with 2.9% of clang's -O2 decisions, and its build cost 7.4% more
    on the workload; a search that keeps the gate (`TrainOptions.keep_gate`) moves only
    departures from clang's heuristic."""
    from mlgo.traces.dataset import load_decisions
    from mlgo.train import RunDir
    from mlgo.train.bc import train_bc
    from mlgo.train.calibrate import agreeing_gate

    if not start.is_dir():  # the clone resumes from its checkpoint if killed
        data = load_decisions(traces, problem)
        clone, _ = train_bc(data, problem, RunDir(start.parent / "clone", "bc"))
        save_policy(replace(agreeing_gate(clone, data), base=base), start)


def trainer(problem: Problem, reward: Reward | None = None) -> str:
    """BC-Max where the answers are yes/no and each module is scored alone: on a user's own
    code it searches these very modules for smaller decision trajectories and clones them,
    so the policy learns the code it will build. ES otherwise, and for a REWARD that
    scores whole programs (a workload's), which no module's search can see."""
    from mlgo.train.registry import get_trainer

    per_module = reward is None or reward.per_module
    return "bcmax" if per_module and get_trainer("bcmax").refuses(problem) is None else "es"


def search_headroom(state: RunState, evaluation: Evaluation) -> float | None:
    """The change of the whole corpus had every module the BC-Max search tried taken the
    smallest trajectory it found (a ceiling found on the way, not a policy); None for a
    trainer that does not search."""
    found = [r["bcmax/trajectory_reward"] for r in state.history if "bcmax/trajectory_reward" in r]
    if not found:
        return None
    default = f"default_{evaluation.metric}"
    searched = sum(
        evaluation.modules[m][default] for m in state.extra["modules"] if m in evaluation.modules
    )
    return -found[-1] * searched / evaluation.totals()[default]


def training_seconds(budget: float, spent: float, reserve: float) -> float:
    """What a chain's BUDGET of seconds leaves to training once SPENT are behind it and
    RESERVE are kept for judging: at least one second, as a run takes one step whatever
    its budget (a budget of 0 stays 0: none)."""
    return max(budget - spent - reserve, 1.0) if budget else 0.0


def planned_training(
    judge: Judge, budget: float, spent: float, steps: int, say: Callable[[str], None]
) -> tuple[float, dict]:
    """The seconds of BUDGET left to training once SPENT are behind and what JUDGE says
    judging will take is kept, and the split; 0 where not one search step fits and STEPS
    were left to the budget (none asked for): then clang's own candidates alone are judged."""
    from mlgo.programs.speed import WORKLOAD_SEARCH
    from mlgo.train.run import UNTIL_BUDGET

    assert judge.seconds is not None
    reserve = judge.seconds(len(GATES) + 2, FINALISTS)
    seconds = training_seconds(budget, spent, reserve)
    builds = 2 * WORKLOAD_SEARCH["directions"]  # a search step's
    step = judge.seconds(builds, 0)
    if seconds < step and steps >= UNTIL_BUDGET:
        say(
            f"no search step fits in the {budget / 60:g} minutes: a step builds the project "
            f"{builds} times ({step / 60:.0f} minutes here), and judging takes {reserve / 60:.0f}"
        )
        seconds = 0.0
    else:
        say(
            f"training for {seconds / 60:.0f} of the {budget / 60:g} minutes, "
            f"{reserve / 60:.0f} kept for judging its candidates ({judge.label})"
        )
    return seconds, {"budget_s": budget, "training_s": seconds, "judging_kept_s": reserve}


@dataclass(frozen=True)
class Chain:
    """What a tune's chain trains and judges with: the recorded CORPUS of PROBLEM, the
    START policy (named START_NAME among the candidates), the tune's directory OUT (it
    trains into OUT/train and keeps its choice in OUT/chosen), the toolchain, the STEPS
    of training (0: none) and SECONDS of budget, the JUDGE of its candidates and the
    REWARD a search scores by (None: the corpus's cost), and whether the search's policy
    also reads the profile's counts (PROFILE_INPUTS), and where its compiles run (WORKERS,
    a `make_workers` spec)."""

    corpus: Path
    problem: Problem
    start: Path
    out: TuneDir
    tc: Toolchain
    steps: int
    seconds: float = 0.0
    judge: Judge | None = None
    reward: Reward | None = None
    start_name: str = "shipped"
    profile_inputs: bool = False
    say: Callable[[str], None] = print
    workers: str = "local"


def choose_policy(chain: Chain) -> tuple[MLPPolicy, dict]:
    """The chain, after ml-compiler-opt's blackbox learner's step: candidates from each
    source (`train.candidates`: clang's own, the start, where a workload judges clang's
    own at each of the problem's bases, and the policy trained from the start (or from the
    fastest base: `based_start`) with its gates), each judged (`judged_changes`: on the
    corpus, or by the JUDGE), one kept (`kept`), saved in OUT/chosen and returned with
    the record of what training did (`training_record`). Training runs for STEPS or until
    the budget, which, where the JUDGE says what judging costs, is the whole chain's
    (`planned_training`); where it leaves less than one search step, clang's own
    candidates alone are judged."""
    from mlgo.train.evaluate import evaluate
    from mlgo.train.run import load_start

    began = time.monotonic()
    corpus = load_corpus(chain.corpus).require(chain.problem)
    first = load_start(chain.start, chain.problem)
    with closing(make_workers(chain.workers)) as pool:

        def weigh(policy: MLPPolicy) -> float:
            return evaluate(policy, corpus, chain.tc, pool, chain.problem).totals()["delta"]

        candidates = clangs_own(first) | the_start(first, chain.start_name, weigh)
        start, first, grid = grid_start(chain, first, corpus, pool, weigh)
        candidates |= grid
        steps, seconds, budgeted = planned_steps(chain, first, began)
        trained = train_from(chain, start, first, corpus, pool, steps, seconds)
        searched = search_compiles(trained.state, corpus, chain, pool) if trained else {}
        if trained is not None:
            sweep = partial(sweep_of, corpus=corpus, tc=chain.tc, pool=pool)
            change = trained.evaluation.totals()["delta"]
            candidates |= trained_and_gated(trained.policy, change, sweep)
    judged = judged_changes(candidates, chain.judge)
    chosen, timed = kept(candidates, judged, chain.judge)
    save_policy(candidates[chosen][0], chain.out.chosen)
    record = training_record(chain, candidates, judged, chosen, trained, timed, budgeted)
    return candidates[chosen][0], record | searched


def search_compiles(state: RunState | None, corpus: Corpus, chain: Chain, pool: Workers) -> dict:
    """The search's compiles (`RunState.compiles`) and how many of them cost one plain
    build's compile CPU: a whole program's reward builds it each time (one); a module's
    compile costs the module's plain compile seconds (`corpus_stats`, cached since the
    search measured them) out of the corpus's, the modules searched (every one, for a
    trainer that keeps none by name) taken as compiled equally often, as a search's budget
    per module makes them. Nothing for a trainer with no state."""
    if state is None:
        return {}
    if chain.reward is not None and not chain.reward.per_module:
        return {"compiles": state.compiles, "compiles_per_build": 1.0}
    from mlgo.corpus.stats import corpus_stats

    stats, _ = corpus_stats(corpus, chain.tc.describe(), chain.tc.clang, pool)
    seconds = {name: s.get("seconds", 0.0) for name, s in stats.items()}
    searched = [seconds[n] for n in state.extra.get("modules", seconds) if n in seconds]
    mean = sum(searched) / len(searched) if searched else 0.0
    per_build = {"compiles_per_build": sum(seconds.values()) / mean} if mean > 0 else {}
    return {"compiles": state.compiles, **per_build}


def grid_start(
    chain: Chain, first: MLPPolicy, corpus: Corpus, pool: Workers, weigh: Weigh
) -> tuple[Path, MLPPolicy, Candidates]:
    """Where a workload's REWARD judges: clang's own at each base (`threshold_grid`),
    costed side by side, and, where the fastest beats clang's own and training will run,
    the start moved there (`based_start`), a candidate too. Else the start as it was."""
    if chain.reward is None:
        return chain.start, first, {}
    grid = threshold_grid(first, weigh)
    if not grid:
        return chain.start, first, {}
    clangs = [policy for policy, _ in grid.values()]
    gains = chain.reward.rewards(clangs, [])  # costed side by side
    fastest = clangs[int(gains.argmax())]  # the first of equals
    if not (chain.steps and gains.max() > 0):
        return chain.start, first, grid
    from mlgo.train.run import load_start

    start = based_start(fastest, corpus, chain.out.based_start(fastest.base), chain.tc, pool)
    first = load_start(start, chain.problem)
    cloned = f"{chain.start_name}, {chain.problem.base_switch}={fastest.base}"
    return start, first, grid | {cloned: (first, weigh(first))}


def planned_steps(chain: Chain, first: MLPPolicy, began: float) -> tuple[int, float, dict]:
    """The steps and seconds training gets, and where the JUDGE says what judging costs,
    the budget's split (`planned_training`): none where not one search step fits."""
    steps, seconds, judge = chain.steps, chain.seconds, chain.judge
    if not (steps and seconds and judge is not None and judge.seconds is not None):
        return steps, seconds, {}
    if chain.reward is not None:  # one build measured (the search's start costs it anyway)
        chain.reward.reward(first, [])
    seconds, budgeted = planned_training(judge, seconds, time.monotonic() - began, steps, chain.say)
    return (steps if seconds else 0), seconds, budgeted


def train_from(
    chain: Chain,
    start: Path,
    first: MLPPolicy,
    corpus: Corpus,
    pool: Workers,
    steps: int,
    seconds: float,
) -> Trained | None:
    """The policy trained from FIRST (at START) into OUT/train for STEPS or SECONDS, by
    `trainer`; None where there are no steps. For speed, a search from a gated start moves
    only departures from the compiler, each judged by a build (a clone alone is slower)."""
    from mlgo.programs.speed import WORKLOAD_SEARCH
    from mlgo.train.run import TrainOptions, run

    if not steps:
        return None
    search = WORKLOAD_SEARCH if chain.reward is not None else {}
    opts = TrainOptions(
        steps=steps, init=start, max_seconds=seconds, keep_gate=chain.problem.aim == "speed",
        trainer={**OWN_CODE, **search},
    )  # fmt: skip
    if chain.profile_inputs:  # the search's start reads them too, at zero weight
        first = first.with_profile_inputs()
    algo = trainer(chain.problem, chain.reward)
    where = chain.out.train
    return run(algo, corpus, chain.problem, where, chain.tc, pool, opts, chain.reward, start=first)


def sweep_of(policy: MLPPolicy, corpus: Corpus, tc: Toolchain, pool: Workers) -> list[dict]:
    """POLICY's calibration sweep over GATES on CORPUS."""
    from mlgo.train.calibrate import calibrate

    return calibrate(policy, corpus, tc, pool, GATES).sweep


def judged_changes(candidates: Candidates, judge: Judge | None) -> dict[str, float]:
    """Each candidate's change: on the corpus, or by the JUDGE (clang's own 0, by
    definition)."""
    judged = {name: c for name, (_, c) in candidates.items()}
    if judge is None:
        return judged
    policies = {n: p for n, (p, _) in candidates.items() if n != "default"}
    return {n: c for n, c in judged.items() if n == "default"} | judge.changes(policies)


def kept(
    candidates: Candidates, judged: dict[str, float], judge: Judge | None
) -> tuple[str, tuple[dict, dict] | None]:
    """The candidate kept: the cheapest as JUDGED, the earliest of equals; where the JUDGE
    has a clock, its cheapest FINALISTS timed and only one surely faster kept, else
    clang's own (a problem that cannot gate has none: the judge's choice stands). And the
    clock's timings, if any."""
    chosen = cheapest(judged)
    if judge is None or judge.clock is None:
        return chosen, None
    finalists = cheapest_distinct(judged, FINALISTS)
    timed = judge.clock({n: candidates[n][0] for n in finalists}) if finalists else None
    surely = surely_faster(timed[0]) if timed else None
    return surely or ("default" if "default" in candidates else chosen), timed


def training_record(
    chain: Chain,
    candidates: Candidates,
    judged: dict[str, float],
    chosen: str,
    trained: Trained | None,
    timed: tuple[dict, dict] | None,
    budgeted: dict,
) -> dict:
    """What training did and what each candidate weighed (and where judging counts in the
    budget, its split in seconds, BUDGETED): OUT/training.json."""
    state = (trained.state if trained else None) or RunState(
        trainer(chain.problem, chain.reward) if trained else "none"
    )
    change = {name: 100 * c for name, (_, c) in candidates.items()}
    shown = dict.fromkeys(["default", chain.start_name, "trained", chosen])
    training = {
        "algorithm": state.algo,
        "steps": len(state.history),
        "seconds": state.seconds,
        "metric": f"{chain.problem.reward_metric} against {chain.problem.opt_level}",
        "chosen": chosen,
        "corpus_change_pct": {name: change[name] for name in shown if name in change},
        "candidates_change_pct": change,
        "note": ON_TRAINING_CODE,
        "curve": state.history,  # the trainer's history: step, compiles and its rewards
        **budgeted,
    }
    if chain.judge is not None:
        training["judged_by"] = chain.judge.label
        # null: it made some program larger in the link, and was never a choice
        training["judged_change_pct"] = {
            n: 100 * c if math.isfinite(c) else None for n, c in judged.items()
        }
        training["rank_correlation"] = rank_correlation(
            {n: c for n, (_, c) in candidates.items()}, judged
        )
    if timed is not None:  # CPU time's change: median and IQR
        training["clock_change_pct"], training["clock_control_pct"] = timed
    headroom = search_headroom(state, trained.evaluation) if trained else None
    if headroom is not None:
        training["headroom_pct"] = 100 * headroom
        if headroom < 0:  # the chosen policy's share of what the search found
            training["headroom_captured"] = min(candidates[chosen][1], 0.0) / headroom
    return training


def based_start(at: MLPPolicy, corpus: Corpus, where: Path, tc: Toolchain, pool: Workers) -> Path:
    """Clang's own decisions at AT's base (AT never departs), traced on CORPUS and cloned
    (`cloned_start`) into WHERE/policy, which departs from none of them: where a base is
    faster than clang's own, a search of departures starts there, not from -O2's answers
    (whose clone, served at that base, would depart back to them)."""
    from mlgo.traces.collect import collect

    collect(at.problem, corpus, where / "traces", tc, pool, at_base=at)
    cloned_start(at.problem, where / "traces", where / "policy", at.base)
    return where / "policy"


def linked_choice(
    candidates: dict[str, MLPPolicy],
    validation: Callable[[], Corpus],
    test: Callable[[], Corpus],
    tc: Toolchain,
    record: Path,
    guard: bool = False,
) -> dict:
    """The chain a shipped link-time policy's recipe runs on held-out code: each of
    CANDIDATES judged on the corpus VALIDATION gives as lld's LTO links each program
    (`judges.linked_evaluations`; with GUARD, as MLGO_GUARD=size serves it), the smallest
    with no package larger kept (`candidates.smaller`; None: clang's own stays), and it
    alone evaluated once on TEST (with GUARD, also as the policy alone, from the same
    links). The judgements its RECORD holds (if any) are taken where they are of the same
    candidates (the test, of the same choice): a rerun links nothing again. Each judgement
    is `judges.judgement`'s."""
    serve = Evaluation.guarded if guard else (lambda ev: ev)
    before = read_json(record) if record.exists() else {}
    judged = before.get("validation", {})
    if set(judged) != set(candidates):
        linked = linked_evaluations(candidates, validation(), tc)
        judged = {name: judgement(serve(ev)) for name, ev in linked.items()}
    chosen = smaller(
        {n: none_larger(v["change_pct"], v["packages_larger"]) for n, v in judged.items()}
    )
    choice: dict = {"validation": judged, "chosen": chosen}
    if chosen is None:
        return choice
    if before.get("chosen") == chosen and "test" in before:  # test is evaluated once
        return choice | {k: v for k, v in before.items() if k.startswith("test")}
    linked_test = linked_evaluations({chosen: candidates[chosen]}, test(), tc)[chosen]
    choice["test"] = judgement(serve(linked_test))
    if guard:
        choice["test, the policy alone"] = judgement(linked_test)
    return choice


def export(policy: MLPPolicy, chosen: Path, to: Path) -> Path:
    """The chosen POLICY (as saved in CHOSEN, for its card) released (numpy and
    SavedModel) into TO."""
    from mlgo.ship.release import release
    from mlgo.train.modelcard import run_card

    return release(policy, to, run_card(policy, chosen), aot=False).saved_model.parent


def train_stage(run: TuneRun) -> None:
    """A tune's training: from the start (clang's own decisions cloned first, where no
    policy is shipped) the chain (`choose_policy`), judged as the problem asks
    (`judges.candidate_judge`), its kept policy released into OUT/policy and what training
    did into OUT/training.json."""
    from mlgo.programs.speed import workload_reward
    from mlgo.train.run import UNTIL_BUDGET

    given, problem, out = run.given_start, run.problem, run.out
    origin = run.start if given else f"{CLONED} ({problem.opt_level})"
    run.say(f"training {problem.name} from {origin} for {run.opts.minutes:g} minutes")
    if given is None:
        cloned_start(problem, out.traces, run.start)
    reward = workload_reward(run)
    chain = Chain(
        out.corpus, problem, run.start, out, run.tc, run.opts.train_steps or UNTIL_BUDGET,
        60 * run.opts.minutes, candidate_judge(problem, out.corpus, run.tc, reward), reward,
        "shipped" if given else CLONED, run.opts.profile_inputs, run.say, run.opts.workers,
    )  # fmt: skip
    policy, training = choose_policy(chain)
    export(policy, out.chosen, out.policy)
    atomic_write_text(out.training, json.dumps(training, indent=1))
