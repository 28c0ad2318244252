"""`mlgo tune`: a user's own code base to a trained policy and a size-and-throughput report.

The stages, each writing its result into OUT atomically and then its name into
OUT/stages.log (`train.stages.Stages`), so that a rerun of the same command skips what is
finished (training resumes from its checkpoint):

    snapshot  the source copied once to OUT/pristine (OUT left out if it lies inside)
    profile   with --pgo, the project built instrumented and the workload run once:
              OUT/profile/default.profdata, which every later build uses (`pgo`), so
              that the policy departs from what clang decides with the profile and is
              judged against the PGO build
    record    configure and build a scratch copy with the recording compiler, at the
              problem's level: OUT/corpus
    rehearse  the tests and the workload (twice: its output must repeat) in that copy,
              so that a wrong --test or --bench stops before training, not after it
    collect   the default heuristic's decisions: OUT/traces
    train     the chain (`chain.choose_policy`): from the start policy until the budget
              is spent, then the cheapest on the corpus (or by its judge) of the
              default, the start and the trained policy, exported to OUT/policy
    decisions an inlining problem's: the policy's decisions on a build of the snapshot,
              kept per file (and per LTO-linked program) where smaller than clang's
              own, in OUT/decisions (`decide.py`), which plain clang builds from
    build     configure, build and test two copies of the snapshot: plain clang at the
              level, and from OUT/decisions by plain clang (eviction: mlgo-cc serving
              OUT/policy) (OUT/programs/plain, OUT/programs/mlgo)
    pgo       with a workload, the build a performance engineer makes anyway (`pgo`):
              instrumented, the workload run once, its profile in
              OUT/programs/profile/default.profdata, and the build with it, tested
              (OUT/programs/pgo); or the line saying why there is none (OUT/programs/pgo.json)
    bench     the workload on the builds in paired rounds, and over shuffled layouts:
              OUT/throughput.json
    report    OUT/report.json

The budget (`minutes`) counts training (the trainer's clock, summed over resumes) and, where a
workload judges, judging: training stops with what judging will take left, as the builds so
far measured it. Recording and building take what the user's build takes.
OUT/tune.json holds the arguments; a rerun whose arguments differ in one a finished stage
used stops and says which, rather than mixing results. A larger --minutes alone trains on
from where training stopped, and builds, measures and reports again.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from contextlib import AbstractContextManager, closing
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING

from mlgo.corpus.format import load_corpus
from mlgo.errors import UsageError
from mlgo.llvm.profiles import MERGED, use_flags
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.packages.build import run_tests
from mlgo.packages.recipes import Recipe, project
from mlgo.problems import Problem, get_problem
from mlgo.programs.build import ProgramBuild, baseline_label, problem_flags, scratch_copy
from mlgo.programs.chain import CLONED, Chain, choose_policy, cloned_start, export, shipped_start
from mlgo.programs.decide import DECISIONS, built_from, decide, writes_decisions
from mlgo.programs.judges import candidate_judge
from mlgo.programs.layouts import LAYOUTS
from mlgo.programs.measure import check_fixed_work, check_repeatable
from mlgo.programs.pgo import PROFILE, PGORow, hot_departures, instrumented_profile
from mlgo.programs.report import program_report, write_report
from mlgo.programs.tuned import build_twice, pgo_build, timed_builds
from mlgo.runtime.commands import BuildError
from mlgo.runtime.files import atomic_directory, atomic_write_text
from mlgo.runtime.inputs import read_json
from mlgo.runtime.messages import naming
from mlgo.runtime.trust import no_links_in, output_dir_checked
from mlgo.runtime.workers import make_workers
from mlgo.train.stages import Stages

if TYPE_CHECKING:
    from mlgo.programs.speed import WorkloadReward

# What the workload's timing depends on (as built, and over shuffled layouts).
TIMING = ("bench", "bench_rounds", "bench_seconds", "layouts")
# Each stage, and the arguments its result depends on besides its predecessors' ones.
STAGES: dict[str, tuple[str, ...]] = {
    "snapshot": ("source",),
    "profile": ("pgo", "profiled_by"),
    "record": ("configure", "build", "problem", "clang"),
    "rehearse": (),  # a check, not a result: a later --test or --bench may differ
    "collect": (),
    # a workload judges speed, its clock the last (`surely_faster`)
    "train": ("policy", "minutes", "train_steps", "profile_inputs", *TIMING),
    "decisions": (),
    "build": ("test", "guard"),
    "pgo": ("bench", "pgo_row"),
    "bench": TIMING,
    "report": (),
}
# What --refresh runs again: all but the training and what it was trained on.
REFRESHED = ("snapshot", "decisions", "build", "pgo", "bench", "report")


@dataclass(frozen=True, kw_only=True)
class TuneOptions:
    problem: str = "inlining-size"
    policy: Path | None = None  # the start policy; None: the shipped one for the problem
    minutes: float = 10.0  # budget of training (and of judging, by a workload), wall clock
    train_steps: int = 0  # ES steps; 0: as many as the budget allows
    guard: bool = False  # eviction: mlgo-cc keeps the smaller of the policy's and the default's
    bench_rounds: int = 10  # paired ABBA rounds of the workload
    bench_seconds: float = 1.0  # CPU seconds per timed sample (the workload loops to it)
    layouts: int = LAYOUTS  # shuffled layouts each build is also timed over (0: none)
    pgo_row: bool = True  # with a workload, its PGO build timed beside (`pgo.pgo_row`)
    refresh: bool = False  # the source changed: the trained policy's decisions judged again
    pgo: bool = False  # on top of PGO: every build with the workload's profile (`profile`)
    # inlining: the search's policy also reads the profile's counts (`profile_inputs`)
    profile_inputs: bool = False


def workload_reward(
    problem: Problem,
    recipe: Recipe,
    pristine: Path,
    out: Path,
    tc: Toolchain,
    opts: TuneOptions,
    profile: Path | None,
) -> WorkloadReward | None:
    """What a tune of a speed problem given a workload trains on and judges by: the
    workload's cost on each policy's build (`speed.WorkloadReward`, in OUT/judged), and its
    clock in the bench's rounds (each build with the PROFILE, if any). None for the
    others: they train on the corpus's cost."""
    from mlgo.programs.speed import WorkloadReward

    if problem.aim == "speed" and recipe.bench:
        timing = (opts.bench_rounds, opts.bench_seconds, opts.layouts)
        return WorkloadReward(recipe, pristine, out / "judged", tc, problem, *timing, profile)
    return None


def tuned_recipe(out: Path) -> tuple[Recipe, Problem, dict]:
    """The project the tune at OUT built, as OUT/tune.json says: its shell lines and its
    workload (named after its source directory), its problem, and all its arguments."""
    if not (out / "tune.json").is_file():
        raise BuildError(f"{out}: has no tune.json (not a tune's directory)")
    args = read_json(out / "tune.json", BuildError)
    try:
        recipe = project(
            Path(args["source"]).name, args["configure"], args["build"], args["test"], None
        )
        return replace(recipe, bench=tuple(args["bench"])), get_problem(args["problem"]), args
    except (KeyError, TypeError) as e:
        raise BuildError(f"{out / 'tune.json'}: not a tune's arguments (no {e})") from e


def tuned_reward(
    out: Path, work: Path, rounds: int, seconds: float, layouts: int
) -> WorkloadReward:
    """The workload reward of the finished speed tune at OUT, working in WORK: its project
    and workload (`tuned_recipe`, named as its report names it), its snapshot, and with
    --pgo its profile, so that its policies are costed or timed again after it, against
    the same baseline."""
    from mlgo.programs.speed import WorkloadReward

    for name, what in (("tune.json", "a tune's directory"), ("report.json", "a finished tune")):
        if not (out / name).is_file():
            raise BuildError(f"{out}: has no {name} (not {what})")
    try:
        package = read_json(out / "report.json", BuildError)["package"]
    except (KeyError, TypeError) as e:
        raise BuildError(f"{out}: not a finished tune's report.json (no {e})") from e
    recipe, problem, args = tuned_recipe(out)
    try:
        profile = out / PROFILE / MERGED if args["pgo"] else None
    except KeyError as e:
        raise BuildError(f"{out / 'tune.json'}: not a tune's arguments (no {e})") from e
    recipe = replace(recipe, name=package)
    if not recipe.bench or problem.aim != "speed":
        raise BuildError(f"{out}: not a speed tune with a workload")
    return WorkloadReward(
        recipe, out / "pristine", work, find_toolchain(), problem, rounds, seconds, layouts,
        profile,
    )  # fmt: skip


def snapshot(source: Path, out: Path, say: Callable[[str], None] = print) -> Path:
    """SOURCE copied to OUT/pristine in one rename, without OUT if it lies inside, or a
    CMake build tree (cmake refuses a copy of one: its cache names its directory)."""
    inner = out.resolve()

    def skip(directory: str, names: list[str]) -> list[str]:
        paths = {n: Path(directory) / n for n in names}
        built = [n for n, p in paths.items() if (p / "CMakeCache.txt").is_file()]
        for n in built:
            say(f"leaving {paths[n]} out of the copy: a CMake build tree")
        return [n for n, p in paths.items() if p.resolve() == inner or n in built]

    with atomic_directory(out / "pristine") as staged:
        shutil.copytree(source, staged, symlinks=True, ignore=skip, dirs_exist_ok=True)
    return out / "pristine"


def scratch_tree(recipe: Recipe, out: Path) -> Path:
    """Where the recorded build is made, and rehearsed (OUT resolved, what is in it not:
    `scratch_copy` refuses a link there)."""
    return out.resolve() / "record" / recipe.name


def record_corpus(
    recipe: Recipe,
    pristine: Path,
    out: Path,
    tc: Toolchain,
    problem: Problem,
    profile: Path | None = None,
) -> None:
    """The configure and build of a scratch copy of PRISTINE recorded for PROBLEM into
    OUT/corpus (at its level, with the PROFILE's counts if any; for a link-time problem,
    each link's merged module, named by its output's path, else each compile's, by its
    source's); the copy is kept for `rehearse`."""
    from mlgo.corpus.record import record

    scratch = scratch_tree(recipe, out)
    scratch_copy(pristine, scratch)
    script = " && ".join([*recipe.configure, *recipe.build])
    level = problem.opt_level
    added = use_flags(profile) if profile else []
    corpus, stage = out / "corpus", problem.stage
    record(["sh", "-c", script], corpus, tc, scratch, opt_level=level, stage=stage, flags=added)


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
    if opts.pgo and not recipe.bench:
        raise UsageError(
            "--pgo tunes on top of a build with the workload's profile: give --bench, a "
            "command that runs the programs the build makes"
        )
    if opts.profile_inputs and not (opts.pgo and problem.plugin and problem.aim == "speed"):
        raise UsageError(
            "--profile-inputs reads the profile's counts at each call site: it needs --pgo "
            "and --problem inlining-speed"
        )
    at = baseline_label(problem, opts.pgo)
    given = opts.policy or shipped_start(problem)
    if given is not None:
        load_start(given, problem, "--policy")  # one training may start from
    start = (given or out / "start" / "policy").resolve()  # else cloned once traced
    mode = {"refresh"}  # how this run goes, not what any result depends on
    args = {
        **{
            k: str(v) if isinstance(v, Path) else v
            for k, v in asdict(opts).items()
            if k not in mode
        },
        "policy": str(start),
        "source": str(source.resolve()),
        "configure": list(recipe.configure),
        "build": list(recipe.build),
        "test": list(recipe.test),
        "bench": list(recipe.bench),
        "clang": tc.describe(),
        "profiled_by": list(recipe.bench) if opts.pgo else [],  # the profile's workload
    }
    output_dir_checked(out, create=True)  # resumed from, and its builds run: ours alone
    no_links_in(out)
    stages = Stages.logged(out, STAGES, args, say, REFRESHED if opts.refresh else ())
    if opts.refresh and not stages.done("train"):  # a new snapshot, the policy as trained
        raise UsageError(f"--refresh: {out} holds no finished training; tune without it")
    if not stages.done("snapshot"):
        say(f"copying {source} to {out / 'pristine'}")
        with _stage("snapshot", out / "pristine"):
            snapshot(source, out, say)
        stages.finish("snapshot")
    pristine = out / "pristine"
    profile = (out / PROFILE / MERGED).resolve() if opts.pgo else None
    if not stages.done("profile"):  # finished without one too: --pgo is its argument
        if profile is not None:
            say(f"building {recipe.name} instrumented and running the workload, for its profile")
            with _stage("profile", profile.parent):
                instrumented_profile(recipe, pristine, profile.parent, tc, problem_flags(problem))
        stages.finish("profile")
    if not stages.done("record"):
        say(f"recording the corpus of {recipe.name}'s build at {at}")
        with _stage("record", out / "corpus"):
            record_corpus(recipe, pristine, out, tc, problem, profile)
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
            reward = workload_reward(problem, recipe, pristine, out, tc, opts, profile)
            judge = candidate_judge(problem, out, tc, reward)
            chain = Chain(
                out / "corpus", problem, start, out, tc, steps, 60 * opts.minutes, judge, reward,
                "shipped" if given else CLONED, opts.profile_inputs, say,
            )  # fmt: skip
            chosen, training = choose_policy(chain)
            export(chosen, out / "chosen", out)
            atomic_write_text(out / "training.json", json.dumps(training, indent=1))
        stages.finish("train")
    policy = out / "policy"
    decisions = out / DECISIONS if writes_decisions(problem) else None
    if not stages.done("decisions"):
        if decisions is not None:
            say(f"keeping the policy's decisions where they pay, in {decisions}")
            with _stage("decisions", decisions):
                decide(recipe, pristine, policy, out, source, tc, problem, opts.refresh, profile)
        stages.finish("decisions")
    work = out / "programs"
    if not stages.done("build"):
        tests = ", with tests" if recipe.test else " (no --test: tests not run)"
        ours = f"plain clang from {decisions}" if decisions else "mlgo-cc"
        say(f"building {recipe.name} twice (clang {at}, and {ours}){tests}")
        with _stage("build", work):
            served = (opts.guard, decisions, profile)  # how ours is built, and both with
            built = build_twice(recipe, pristine, policy, work, tc, problem, *served)
            atomic_write_text(work / "builds.json", json.dumps([b.to_json() for b in built]))
        stages.finish("build")
    if stages.done("report"):
        return read_json(out / "report.json")
    plain, ml = (ProgramBuild(**b) for b in read_json(work / "builds.json"))
    trees = {b.variant: work / b.variant for b in (plain, ml)}
    if not stages.done("pgo"):  # finished without one too: --bench and --pgo-row are its own
        row = PGORow()
        if recipe.bench and opts.pgo_row:
            how = "without the profile, beside" if profile else "with the workload's profile, for"
            say(f"building {recipe.name} {how} the PGO row")
            with _stage("pgo", work):
                row = pgo_build(recipe, pristine, work, tc, problem, say, profile)
        atomic_write_text(work / "pgo.json", json.dumps(asdict(row)))
        stages.finish("pgo")
    if not stages.done("bench"):  # finished without a workload too: --bench is its argument
        if recipe.bench:
            row, ours = PGORow(**read_json(work / "pgo.json")), (policy, decisions, opts.guard)
            timing = (opts.bench_rounds, opts.bench_seconds, opts.layouts)
            with _stage("bench", work):
                speed = timed_builds(
                    recipe, pristine, work, tc, problem, ours, row, timing, say, profile
                )
                atomic_write_text(out / "throughput.json", json.dumps(speed, indent=1))
        stages.finish("bench")
    speed = read_json(out / "throughput.json") if recipe.bench else None
    training = read_json(out / "training.json")
    with _stage("report", out):
        report = program_report((plain, ml), trees, [policy.resolve()], speed)
        report.update(problem=problem.name, level=problem.opt_level, training=training)
        report.update(stage=problem.stage, flags=at)
        report.update(built_from(decisions, trees["mlgo"], say))
        if profile is not None and decisions is not None:  # what the policy changed where hot
            report["hot"] = hot_departures(profile, decisions, tc)
        write_report(report, out)
    stages.finish("report")
    if opts.refresh:
        stages.keep_arguments()
    return report
