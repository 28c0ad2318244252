"""`mlgo tune`: a user's own code base to a trained policy and a size-and-throughput report.

The stages (`STAGES`), each writing its result into OUT atomically and then recorded in
OUT/stages.json (`train.stages`), so that a rerun of the same command skips what is
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
    collect   the default heuristic's decisions (OUT/traces), which training clones where
              no policy is shipped for the problem and none is given; else nothing
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
              instrumented, the workload run once, and the build with its profile, tested
              (OUT/programs/pgo); or the line saying why there is none
    bench     the workload on the builds in paired rounds, and over shuffled layouts:
              OUT/throughput.json
    report    OUT/report.json

The budget (`minutes`) counts training (the trainer's clock, summed over resumes) and, where a
workload judges, judging: training stops with what judging will take left, as the builds so
far measured it. Recording and building take what the user's build takes. OUT/tune.json
holds the arguments; a rerun whose arguments differ in one a finished stage used stops and
says which, rather than mixing results. A larger --minutes alone trains on from where
training stopped, and builds, measures and reports again. OUT's layout: `tune_run.TuneDir`.
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from contextlib import closing
from dataclasses import asdict
from pathlib import Path

from mlgo.corpus.format import load_corpus
from mlgo.errors import UsageError
from mlgo.llvm.profiles import use_flags
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.build import run_tests
from mlgo.packages.recipes import Recipe
from mlgo.programs.build import scratch_copy
from mlgo.programs.chain import train_stage
from mlgo.programs.decide import decisions_stage
from mlgo.programs.measure import check_fixed_work, check_repeatable
from mlgo.programs.pgo import profile_stage
from mlgo.programs.report import report_stage
from mlgo.programs.tune_run import TuneDir, TuneOptions, TuneRun
from mlgo.programs.tuned import bench_stage, build_stage, pgo_stage
from mlgo.runtime.commands import BuildError
from mlgo.runtime.files import atomic_directory, atomic_write_text
from mlgo.runtime.inputs import read_json
from mlgo.runtime.trust import no_links_in, output_dir_checked
from mlgo.runtime.workers import make_workers
from mlgo.train.stages import Stage, StageRecord, check_arguments, run_stages


def snapshot(source: Path, into: Path, say: Callable[[str], None] = print) -> Path:
    """SOURCE copied to INTO in one rename, without the directory INTO is in if it lies
    inside (OUT), or a CMake build tree (cmake refuses a copy of one: its cache names its
    directory)."""
    inner = into.parent.resolve()

    def skip(directory: str, names: list[str]) -> list[str]:
        paths = {n: Path(directory) / n for n in names}
        built = [n for n, p in paths.items() if (p / "CMakeCache.txt").is_file()]
        for n in built:
            say(f"leaving {paths[n]} out of the copy: a CMake build tree")
        return [n for n, p in paths.items() if p.resolve() == inner or n in built]

    with atomic_directory(into) as staged:
        shutil.copytree(source, staged, symlinks=True, ignore=skip, dirs_exist_ok=True)
    return into


def record_corpus(run: TuneRun) -> None:
    """The configure and build of a scratch copy of the snapshot recorded for the problem
    into OUT/corpus (at its level, with the profile's counts if any; for a link-time
    problem, each link's merged module, named by its output's path, else each compile's, by
    its source's); the copy is kept for `rehearse`."""
    from mlgo.corpus.record import record

    recipe, problem, scratch = run.recipe, run.problem, run.out.recorded / run.recipe.name
    scratch_copy(run.pristine, scratch)
    script = " && ".join([*recipe.configure, *recipe.build])
    added = use_flags(run.profile) if run.profile else []
    record(["sh", "-c", script], run.out.corpus, run.tc, scratch, opt_level=problem.opt_level,
           stage=problem.stage, flags=added)  # fmt: skip


def rehearse(run: TuneRun) -> None:
    """The project's tests, and its workload twice (its output) and twice more under
    callgrind (its work), in the recorded build: a test that fails there, a workload whose
    output changes from run to run (timings), or whose work does (one that runs for a fixed
    time), would stop the tune after training or measure nothing; this stops it before.
    Then the scratch copy goes."""
    recipe, scratch = run.recipe, run.out.recorded / run.recipe.name
    if recipe.test or recipe.bench:
        run.say("running the tests and the workload (twice) on the recorded build")
    if scratch.is_dir():  # a tune recorded before this stage existed has none
        what = f"{recipe.name}: its own tests, on the recorded build before training"
        run_tests(recipe, scratch, run.out.rehearsal_log, None, what)
        if recipe.bench:
            check_repeatable(recipe, scratch)
            if shutil.which("valgrind"):  # else no count is reported either
                check_fixed_work(recipe, scratch)
    shutil.rmtree(run.out.recorded, ignore_errors=True)


def snapshot_stage(run: TuneRun) -> None:
    run.say(f"copying {run.source} to {run.pristine}")
    snapshot(run.source, run.pristine, run.say)


def record_stage(run: TuneRun) -> None:
    run.say(f"recording the corpus of {run.recipe.name}'s build at {run.baseline}")
    record_corpus(run)


def collect_stage(run: TuneRun) -> None:
    """The default's decisions, which training clones where it has no policy to start
    from; with one (shipped, or --policy), nothing: its search compiles the default's
    trajectory of every module anyway, and no stage reads the traces."""
    from mlgo.traces.collect import collect

    if run.given_start is not None:
        return
    corpus = load_corpus(run.out.corpus).require(run.problem)
    with closing(make_workers(run.opts.workers)) as pool:
        collect(run.problem, corpus, run.out.traces, run.tc, pool)


# What the workload's timing depends on (as built, and over shuffled layouts).
TIMING = ("bench", "bench_rounds", "bench_seconds", "layouts")
# Each stage, in order, with the arguments its result depends on besides its predecessors'.
STAGES: tuple[Stage[TuneRun], ...] = (
    Stage("snapshot", snapshot_stage, ("source",), refreshed=True, where=lambda r: r.pristine),
    # finished without a profile too: --pgo is its argument
    Stage("profile", profile_stage, ("pgo", "profiled_by"), where=lambda r: r.out.profile.parent),
    Stage(
        "record",
        record_stage,
        ("configure", "build", "problem", "clang"),
        where=lambda r: r.out.corpus,
    ),  # fmt: skip
    # a check, not a result: a later --test or --bench may differ
    Stage("rehearse", rehearse, where=lambda r: r.out.recorded),
    Stage("collect", collect_stage, where=lambda r: r.out.traces),
    # a workload judges speed, its clock the last (`surely_faster`); a larger budget alone
    # trains on from where training stopped
    Stage(
        "train",
        train_stage,
        ("policy", "minutes", "train_steps", "profile_inputs", *TIMING),
        grows="minutes",
        growing="training on from {old:g} to {new:g} minutes",
    ),  # fmt: skip
    Stage("decisions", decisions_stage, refreshed=True, where=lambda r: r.out.decisions),
    Stage("build", build_stage, ("test", "guard"), refreshed=True, where=lambda r: r.out.programs),
    Stage("pgo", pgo_stage, ("bench", "pgo_row"), refreshed=True, where=lambda r: r.out.programs),
    Stage("bench", bench_stage, TIMING, refreshed=True, where=lambda r: r.out.programs),
    Stage("report", report_stage, refreshed=True),
)
# How a run goes, not what any result depends on: a tune started on this machine resumes on
# a cluster (a search's budget and seeds do not depend on where it runs).
MODES = ("refresh", "workers")


def arguments(run: TuneRun) -> dict:
    """What OUT/tune.json records of RUN: every option but its MODES, the start policy, the
    project's lines and the toolchain."""
    recipe, opts = run.recipe, run.opts
    return {
        **{
            k: str(v) if isinstance(v, Path) else v
            for k, v in asdict(opts).items()
            if k not in MODES
        },
        "policy": str(run.start),
        "source": str(run.source.resolve()),
        "configure": list(recipe.configure),
        "build": list(recipe.build),
        "test": list(recipe.test),
        "bench": list(recipe.bench),
        "clang": run.tc.describe(),
        "profiled_by": list(recipe.bench) if opts.pgo else [],  # the profile's workload
    }


def stage_record(out: TuneDir, refresh: bool) -> StageRecord:
    """OUT's record of its stages (a tune's from before it had one: its stages.log), those
    a refresh runs again taken as unfinished; an OUT that holds other files is refused."""
    if any(out.root.iterdir()) and not out.arguments.is_file():
        raise UsageError(f"{out.root}: exists and is not a tune directory; choose another --out")
    names = [s.name for s in STAGES]
    skip = [s.name for s in STAGES if s.refreshed] if refresh else []
    try:
        record = StageRecord.load(out.record, names, skip=skip)
    except ValueError as e:
        raise BuildError(f"{out.record}: not a tune's record of its stages ({e})") from None
    if not out.record.exists() and out.legacy_log.is_file():
        logged = [line.split("\t")[0] for line in out.legacy_log.read_text().splitlines()]
        record.finished = [n for n in logged if n in names and n not in skip]
    return record


def tune(
    source: Path,
    recipe: Recipe,
    out: Path,
    tc: Toolchain,
    opts: TuneOptions,
    say: Callable[[str], None] = print,
) -> dict:
    """The loop of the module doc on the project RECIPE describes, whose source is SOURCE,
    into OUT; SAY says what it does. Writes and returns OUT/report.json."""
    run = TuneRun.checked(source, recipe, out, tc, opts, say)
    args = arguments(run)
    output_dir_checked(out, create=True)  # resumed from, and its builds run: ours alone
    no_links_in(out)
    record = stage_record(run.out, opts.refresh)
    check_arguments(run.out.arguments, args, STAGES, record, say)
    if opts.refresh and not record.done("train"):  # a new snapshot, the policy as trained
        raise UsageError(f"--refresh: {out} holds no finished training; tune without it")
    if not opts.refresh:  # a refresh that fails leaves the arguments its results follow
        atomic_write_text(run.out.arguments, json.dumps(args, indent=1))
    run_stages(STAGES, record, run, "tune")
    if opts.refresh:
        atomic_write_text(run.out.arguments, json.dumps(args, indent=1))
    return read_json(run.out.report)
