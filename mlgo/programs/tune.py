"""`mlgo tune`: a user's own code base to a trained policy and a size-and-throughput report.

The stages, each writing its result into OUT atomically and then its name into
OUT/stages.log, so that a rerun of the same command skips what is finished (training
resumes from its checkpoint):

    snapshot  the source copied once to OUT/pristine (OUT left out if it lies inside)
    record    configure and build a scratch copy with the recording compiler, at the
              problem's level: OUT/corpus
    rehearse  the tests and the workload (twice: its output must repeat) in that copy,
              so that a wrong --test or --bench stops before training, not after it
    collect   the default heuristic's decisions: OUT/traces
    train     from the start policy until the budget is spent (`trainer`), then the
              cheapest on the corpus of the default, the start and the trained policy
              (`choose_policy`), exported to OUT/policy
    build     configure, build and test two copies of the snapshot: plain clang at the
              level, and mlgo-cc serving OUT/policy (OUT/programs/plain, OUT/programs/mlgo)
    bench     the workload on both builds in paired rounds: OUT/throughput.json
    report    OUT/report.json

The budget (`minutes`) counts training only: the trainer's own clock, summed over resumes,
checked between iterations (BC-Max fits each iteration's search to the time left).
Recording and building take what the user's build takes.
OUT/tune.json holds the arguments; a rerun whose arguments differ in one a finished stage
used stops and says which, rather than mixing results. A larger --minutes alone trains on
from where training stopped, and builds, measures and reports again.
"""

from __future__ import annotations

import json
import math
import shlex
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager, closing
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from mlgo.corpus.format import Corpus, load_corpus
from mlgo.data import shipped_policy
from mlgo.errors import UsageError
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.build import run_tests
from mlgo.packages.recipes import Recipe
from mlgo.problems import Problem, get_problem
from mlgo.problems.policy_files import save_policy
from mlgo.programs.build import ProgramBuild, baseline_label, policy_service, problem_flags
from mlgo.programs.compare import build_pair, variants
from mlgo.programs.judges import Judge, candidate_judge, rank_correlation
from mlgo.programs.measure import check_fixed_work, check_repeatable, recipe_throughput
from mlgo.programs.report import program_report, write_report
from mlgo.runtime.commands import BuildError
from mlgo.runtime.files import atomic_directory, atomic_write_text
from mlgo.runtime.messages import copy_error, naming
from mlgo.runtime.workers import Workers, make_workers
from mlgo.train.candidates import (
    FINALISTS,
    GATES,
    cheapest,
    cheapest_distinct,
    gated_candidates,
    surely_faster,
)
from mlgo.train.stages import Stages

if TYPE_CHECKING:
    from mlgo.problems.policy import MLPPolicy
    from mlgo.programs.speed import WorkloadReward
    from mlgo.train import RunState
    from mlgo.train.evaluate import Evaluation
    from mlgo.train.loop import Reward

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

# Each stage, and the arguments its result depends on besides its predecessors' ones.
STAGES: dict[str, tuple[str, ...]] = {
    "snapshot": ("source",),
    "record": ("configure", "build", "problem", "clang"),
    "rehearse": (),  # a check, not a result: a later --test or --bench may differ
    "collect": (),
    # a workload judges speed, its clock the last (`surely_faster`)
    "train": ("policy", "minutes", "train_steps", "bench", "bench_rounds", "bench_seconds"),
    "build": ("test", "guard"),
    "bench": ("bench", "bench_rounds", "bench_seconds"),
    "report": (),
}


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    problem: str = "inlining-size"
    policy: Path | None = None  # the start policy; None: the shipped one for the problem
    minutes: float = 10.0  # training budget (wall clock of training alone)
    train_steps: int = 0  # ES steps; 0: as many as the budget allows
    guard: bool = False  # mlgo-cc keeps the smaller of the policy's and the default's object
    bench_rounds: int = 10  # paired ABBA rounds of the workload
    bench_seconds: float = 1.0  # CPU seconds per timed sample (the workload loops to it)


def project(
    name: str,
    configure: list[str],
    build: list[str],
    test: list[str],
    bench: str | None,
) -> Recipe:
    """A user's project as a recipe without a Debian source: its shell lines, and its
    workload (a shell line whose output must be the same on both builds)."""
    if not build:
        raise BuildError("no build command: give --build, e.g. --build 'make -j2'")
    workload = (shlex.join(["sh", "-c", bench]),) if bench else ()
    return Recipe(
        name, "", tuple(build), configure=tuple(configure), test=tuple(test), bench=workload
    )


def shipped_start(problem: Problem) -> Path | None:
    """The shipped policy tuning PROBLEM starts from: its own, or where none is shipped, that
    of the problem it `starts_from` (the link-time inliner from the per-file one); None
    where there is neither (the start is then `cloned_start`)."""
    own = shipped_policy(problem.name)
    if own.is_dir():
        return own
    return shipped_policy(problem.starts_from) if problem.starts_from else None


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


def choose_policy(
    corpus_dir: Path,
    problem: Problem,
    start: Path,
    out: Path,
    tc: Toolchain,
    steps: int,
    max_seconds: float = 0.0,
    judge: Judge | None = None,
    reward: Reward | None = None,
    start_name: str = "shipped",
) -> tuple[Path, dict]:
    """Trains from START into OUT/train (see `trainer`; scoring by REWARD if given, else
    the corpus's cost) for STEPS steps or MAX_SECONDS of training, whichever ends first
    (STEPS 0: no training), and keeps the candidate that is
    cheapest on the corpus, or by JUDGE (`candidate_judge`), saved in OUT/chosen: the
    compiler's default (START gated never to depart), START (named START_NAME), the
    trained policy, and the trained policy at each departure threshold of GATES (each
    language alone too: `gated_candidates`); where a workload's REWARD judges, the
    compiler's default at each of the problem's bases as well (`Problem.base_grid`: on
    cmark, clang's inline threshold at 400 was faster than any departure a search of the
    network found), and training starts from the fastest of them where it beats the
    default (`based_start`). The earliest of equals wins, so a policy that does not beat
    the default on the code it will build is not served; where the JUDGE has a clock, its
    cheapest FINALISTS are timed, and only one surely faster is (`surely_faster`). Returns
    it and what training did."""
    from mlgo.programs.speed import WORKLOAD_SEARCH
    from mlgo.train import RunState
    from mlgo.train.calibrate import NEVER, calibrate
    from mlgo.train.evaluate import evaluate
    from mlgo.train.run import TrainOptions, load_start, run

    corpus = load_corpus(corpus_dir).require(problem)
    first = load_start(start, problem)
    candidates: dict[str, tuple[MLPPolicy, float]] = {}
    if first.can_gate:  # the default's own decisions: no change, by definition
        candidates["default"] = (replace(first, departure_threshold=NEVER), 0.0)
    algo = trainer(problem, reward) if steps else "none"
    state = RunState(algo)  # what training did: nothing until it runs
    headroom = None
    with closing(make_workers("local")) as pool:

        def on_corpus(policy: MLPPolicy) -> float:
            return evaluate(policy, corpus, tc, pool, problem).totals()["delta"]

        candidates[start_name] = (first, on_corpus(first))
        if reward is not None and first.can_gate and problem.base_grid:
            # where builds judge: clang's own at each base, and departures from the fastest
            bases = {
                f"clang's own, {problem.base_switch}={b}": replace(
                    first, departure_threshold=NEVER, base=b
                )
                for b in problem.base_grid
            }
            candidates |= {name: (at, on_corpus(at)) for name, at in bases.items()}
            fastest = min(bases.values(), key=reward.change)
            if steps and reward.change(fastest) < 0:
                start = based_start(fastest, corpus, out, tc, pool)
                first = load_start(start, problem)
                cloned = f"{start_name}, {problem.base_switch}={fastest.base}"
                candidates[cloned] = (first, on_corpus(first))
        if steps:
            search = WORKLOAD_SEARCH if reward is not None else {}
            # for speed, every departure from the compiler is judged by a build: a
            # search from a gated start moves only those (a clone alone is slower)
            keep_gate = problem.aim == "speed"
            opts = TrainOptions(
                steps=steps, init=start, max_seconds=max_seconds, keep_gate=keep_gate,
                **OWN_CODE, **search,
            )  # fmt: skip
            trained = run(algo, corpus, problem, out / "train", tc, pool, opts, reward)
            candidates["trained"] = (trained.policy, trained.evaluation.totals()["delta"])
            state = trained.state or state  # a search reports its run
            headroom = search_headroom(state, trained.evaluation)
            if trained.policy.can_gate:
                sweep = calibrate(trained.policy, corpus, tc, pool, GATES).sweep
                candidates.update(gated_candidates(trained.policy, sweep))
    judged = {name: c for name, (_, c) in candidates.items()}
    if judge is not None:
        policies = {n: p for n, (p, _) in candidates.items() if n != "default"}
        judged = {n: c for n, c in judged.items() if n == "default"}  # 0, by definition
        judged |= judge.changes(policies)
    chosen = cheapest(judged)
    timed = None
    if judge is not None and judge.clock is not None:
        if finalists := cheapest_distinct(judged, FINALISTS):
            timed = judge.clock({n: candidates[n][0] for n in finalists})
        # else, or where none is surely faster: clang's own (a problem that cannot gate has
        # none; the judge's choice stands there)
        surely = surely_faster(timed[0]) if timed else None
        chosen = surely or ("default" if "default" in candidates else chosen)
    save_policy(candidates[chosen][0], out / "chosen")
    change = {name: 100 * c for name, (_, c) in candidates.items()}
    training = {
        "algorithm": algo,
        "steps": len(state.history),
        "seconds": state.seconds,
        "metric": f"{problem.reward_metric} against {problem.opt_level}",
        "chosen": chosen,
        "corpus_change_pct": {
            name: change[name]
            for name in dict.fromkeys(["default", start_name, "trained", chosen])
            if name in change
        },
        "candidates_change_pct": change,
        "note": ON_TRAINING_CODE,
        "curve": state.history,  # the trainer's history: step, compiles and its rewards
    }
    if judge is not None:
        training["judged_by"] = judge.label
        # null: it made some program larger in the link, and was never a choice
        training["judged_change_pct"] = {
            n: 100 * c if math.isfinite(c) else None for n, c in judged.items()
        }
        training["rank_correlation"] = rank_correlation(
            {n: c for n, (_, c) in candidates.items()}, judged
        )
    if timed is not None:  # CPU time's change: median and IQR
        training["clock_change_pct"], training["clock_control_pct"] = timed
    if headroom is not None:
        training["headroom_pct"] = 100 * headroom
        if headroom < 0:  # the chosen policy's share of what the search found
            training["headroom_captured"] = min(candidates[chosen][1], 0.0) / headroom
    return out / "chosen", training


def based_start(at: MLPPolicy, corpus: Corpus, out: Path, tc: Toolchain, pool: Workers) -> Path:
    """Clang's own decisions at AT's base (AT never departs), traced on CORPUS and cloned
    (`cloned_start`) into OUT/start-BASE/policy, which departs from none of them: where a
    base is faster than clang's own, a search of departures starts there, not from -O2's
    answers (whose clone, served at that base, would depart back to them)."""
    from mlgo.traces.collect import collect

    where = out / f"start-{at.base}"
    collect(at.problem, corpus, where / "traces", tc, pool, at_base=at)
    cloned_start(at.problem, where / "traces", where / "policy", at.base)
    return where / "policy"


def workload_reward(
    problem: Problem, recipe: Recipe, pristine: Path, out: Path, tc: Toolchain, opts: TuneOptions
) -> WorkloadReward | None:
    """What a tune of a speed problem given a workload trains on and judges by: the
    workload's cost on each policy's build (`speed.WorkloadReward`, in OUT/judged), and its
    clock in the bench's rounds. None for the others: they train on the corpus's cost."""
    from mlgo.programs.speed import WorkloadReward

    if problem.aim == "speed" and recipe.bench:
        timing = (opts.bench_rounds, opts.bench_seconds)
        return WorkloadReward(recipe, pristine, out / "judged", tc, problem, *timing)
    return None


def export(chosen: Path, out: Path) -> Path:
    """The chosen policy released (numpy and SavedModel) into OUT/policy."""
    from mlgo.ship.release import release

    return release(chosen, out / "policy", aot=False).saved_model.parent


def build_twice(
    recipe: Recipe,
    pristine: Path,
    policy: Path,
    work: Path,
    tc: Toolchain,
    problem: Problem,
    guard: bool = False,
) -> tuple[ProgramBuild, ProgramBuild]:
    """RECIPE configured, built and tested from PRISTINE twice, in WORK/plain (clang at
    the problem's level) and WORK/mlgo (mlgo-cc serving POLICY; GUARD: MLGO_GUARD=size).
    A failing build or test raises BuildError naming its log."""
    with policy_service([policy], work / "service") as env:
        pair = variants(tc, env, guard=guard)
        return build_pair(recipe, work, tc, pair, True, problem_flags(problem), pristine)


def snapshot(source: Path, out: Path) -> Path:
    """SOURCE copied to OUT/pristine in one rename, without OUT if it lies inside."""
    inner = out.resolve()

    def skip(directory: str, names: list[str]) -> list[str]:
        return [n for n in names if (Path(directory) / n).resolve() == inner]

    with atomic_directory(out / "pristine") as staged:
        shutil.copytree(source, staged, symlinks=True, ignore=skip, dirs_exist_ok=True)
    return out / "pristine"


def scratch_tree(recipe: Recipe, out: Path) -> Path:
    """Where the recorded build is made, and rehearsed."""
    return (out / "record" / recipe.name).resolve()


def record_corpus(
    recipe: Recipe, pristine: Path, out: Path, tc: Toolchain, problem: Problem
) -> None:
    """The configure and build of a scratch copy of PRISTINE recorded for PROBLEM into
    OUT/corpus (at its level; for a link-time problem, each link's merged module, named by
    its output's path, else each compile's, by its source's); the copy is kept for
    `rehearse`."""
    from mlgo.corpus.record import record

    scratch = scratch_tree(recipe, out)
    shutil.rmtree(scratch.parent, ignore_errors=True)
    try:
        shutil.copytree(pristine, scratch, symlinks=True)
    except shutil.Error as e:  # its message is the list of every file that failed
        raise copy_error(e) from e
    script = " && ".join([*recipe.configure, *recipe.build])
    level = problem.opt_level
    record(["sh", "-c", script], out / "corpus", tc, scratch, opt_level=level, stage=problem.stage)


def rehearse(recipe: Recipe, out: Path) -> None:
    """The project's tests, and its workload twice (its output) and twice more under
    callgrind (its work), in the recorded build: a test that fails there, a workload whose
    output changes from run to run (timings), or whose work does (one that runs for a fixed
    time), would stop the tune after training or measure nothing; this stops it before.
    Then the scratch copy goes."""
    scratch = scratch_tree(recipe, out)
    if scratch.is_dir():  # a tune recorded before this stage existed has none
        log = out / "rehearsal.log"
        what = f"{recipe.name}: its own tests, on the recorded build before training"
        run_tests(recipe, scratch, log, None, what)
        if recipe.bench:
            check_repeatable(recipe, scratch)
            if shutil.which("valgrind"):  # else no count is reported either
                check_fixed_work(recipe, scratch)
    shutil.rmtree(scratch.parent, ignore_errors=True)


def _stage(name: str, where: Path) -> AbstractContextManager[None]:
    """An OSError of stage NAME that names no file, as a write to a full disk raises it
    (`[Errno 28] No space left on device`) from whichever library wrote, names the stage
    and WHERE it writes; the atomic writes name their own file."""
    return naming(f"tune's {name} stage, in {where}")


def tune(
    source: Path,
    recipe: Recipe,
    out: Path,
    tc: Toolchain,
    opts: TuneOptions,
    say: Callable[[str], None] = print,
) -> dict:
    """The loop of the module doc on the project RECIPE describes, whose source is SOURCE;
    writes and returns OUT/report.json."""
    from mlgo.traces.collect import collect
    from mlgo.train.run import UNTIL_BUDGET, load_start

    if not source.is_dir():
        raise BuildError(f"--source {source}: not a directory")
    if out.resolve() == source.resolve():
        raise BuildError(f"--out {out}: is the source directory; choose another")
    problem = get_problem(opts.problem)
    if problem.needs_workload and not recipe.bench:
        raise UsageError(
            f"--problem {problem.name} is trained on a workload: give --bench, a command "
            "that runs the programs the build makes"
        )
    at = baseline_label(problem)
    given = opts.policy or shipped_start(problem)
    if given is not None:
        load_start(given, problem, "--policy")  # one training may start from
    start = (given or out / "start" / "policy").resolve()  # else cloned once traced
    args = {
        **{k: str(v) if isinstance(v, Path) else v for k, v in asdict(opts).items()},
        "policy": str(start),
        "source": str(source.resolve()),
        "configure": list(recipe.configure),
        "build": list(recipe.build),
        "test": list(recipe.test),
        "bench": list(recipe.bench),
        "clang": tc.describe(),
    }
    stages = Stages.logged(out, STAGES, args, say)
    if not stages.done("snapshot"):
        say(f"copying {source} to {out / 'pristine'}")
        with _stage("snapshot", out / "pristine"):
            snapshot(source, out)
        stages.finish("snapshot")
    pristine = out / "pristine"
    if not stages.done("record"):
        say(f"recording the corpus of {recipe.name}'s build at {at}")
        with _stage("record", out / "corpus"):
            record_corpus(recipe, pristine, out, tc, problem)
        stages.finish("record")
    if not stages.done("rehearse"):
        if recipe.test or recipe.bench:
            say("running the tests and the workload (twice) on the recorded build")
        with _stage("rehearse", scratch_tree(recipe, out)):
            rehearse(recipe, out)
        stages.finish("rehearse")
    if not stages.done("collect"):
        corpus = load_corpus(out / "corpus").require(problem)
        with _stage("collect", out / "traces"), closing(make_workers("local")) as pool:
            collect(problem, corpus, out / "traces", tc, pool)
        stages.finish("collect")
    if not stages.done("train"):
        origin = start if given else f"{CLONED} ({problem.opt_level})"
        say(f"training {problem.name} from {origin} for {opts.minutes:g} minutes")
        steps = opts.train_steps or UNTIL_BUDGET
        with _stage("train", out):
            if given is None:
                cloned_start(problem, out / "traces", start)
            reward = workload_reward(problem, recipe, pristine, out, tc, opts)
            judge = candidate_judge(problem, out, tc, reward)
            chosen, training = choose_policy(
                out / "corpus", problem, start, out, tc, steps, 60 * opts.minutes, judge, reward,
                "shipped" if given else CLONED,
            )  # fmt: skip
            export(chosen, out)
            atomic_write_text(out / "training.json", json.dumps(training, indent=1))
        stages.finish("train")
    policy = out / "policy"
    work = out / "programs"
    if not stages.done("build"):
        tests = ", with tests" if recipe.test else " (no --test: tests not run)"
        say(f"building {recipe.name} twice (clang {at}, and mlgo-cc){tests}")
        with _stage("build", work):
            built = build_twice(recipe, pristine, policy, work, tc, problem, opts.guard)
            atomic_write_text(work / "builds.json", json.dumps([b.to_json() for b in built]))
        stages.finish("build")
    if stages.done("report"):
        return json.loads((out / "report.json").read_text())
    plain, ml = (ProgramBuild(**b) for b in json.loads((work / "builds.json").read_text()))
    trees = {b.variant: work / b.variant for b in (plain, ml)}
    if not stages.done("bench"):  # finished without a workload too: --bench is its argument
        if recipe.bench:
            say(f"measuring the workload on both builds ({opts.bench_rounds} rounds)")
            with _stage("bench", work):
                speed = recipe_throughput(recipe, trees, opts.bench_rounds, opts.bench_seconds)
                atomic_write_text(out / "throughput.json", json.dumps(speed, indent=1))
        stages.finish("bench")
    speed = json.loads((out / "throughput.json").read_text()) if recipe.bench else None
    training = json.loads((out / "training.json").read_text())
    with _stage("report", out):
        report = program_report((plain, ml), trees, [policy.resolve()], speed)
        report.update(problem=problem.name, level=problem.opt_level, training=training)
        report.update(stage=problem.stage, flags=at)
        write_report(report, out)
    stages.finish("report")
    return report
