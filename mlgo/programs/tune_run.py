"""A tune's run and its directory: `TuneRun` carries what every stage of `mlgo tune` needs
(the project, its snapshot, the toolchain, the problem, the profile, the options), so that a
stage takes the run and what is particular to it; `TuneDir` owns OUT/'s layout, every path a
tune writes, and reads a finished tune back, for the product and the tools alike.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from mlgo.data import shipped_policy
from mlgo.errors import UsageError
from mlgo.llvm.profiles import MERGED
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import Recipe, project
from mlgo.problems import Problem, get_problem
from mlgo.programs.build import baseline_label
from mlgo.programs.layouts import LAYOUTS
from mlgo.programs.measure import Timing
from mlgo.runtime.commands import BuildError
from mlgo.runtime.inputs import read_json

# Options that measured nothing yet, behind `mlgo tune --use-feature NAME` until they pay:
# each one's TuneOptions field, and what it does.
EXPERIMENTS = {
    "profile-inputs": (
        "profile_inputs",
        "with --pgo and --problem inlining-speed, the policy also reads the profile's counts "
        "at each call site (serd: changed nothing)",
    ),
    "guard": ("guard", "eviction: MLGO_GUARD=size on the policy's build"),
}


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
    # where collection and the search's compiles run (`make_workers`); the builds, recording
    # and judging run here
    workers: str = "local"

    @property
    def timing(self) -> Timing:
        return Timing(self.bench_rounds, self.bench_seconds, self.layouts)


@dataclass(frozen=True)
class TuneDir:
    """OUT, a tune's directory: where each stage writes (scratch trees included)."""

    root: Path

    pristine = property(lambda self: self.root / "pristine")  # the snapshot of the source
    arguments = property(lambda self: self.root / "tune.json")
    record = property(lambda self: self.root / "stages.json")  # the stages' `StageRecord`
    legacy_log = property(lambda self: self.root / "stages.log")  # a tune's record before it
    profile = property(lambda self: self.root / "profile" / MERGED)  # --pgo's profile
    corpus = property(lambda self: self.root / "corpus")
    traces = property(lambda self: self.root / "traces")
    # the recorded build's scratch (OUT resolved, what is in it not: `scratch_copy` refuses
    # a link there)
    recorded = property(lambda self: self.root.resolve() / "record")
    rehearsal_log = property(lambda self: self.root / "rehearsal.log")
    start = property(lambda self: self.root / "start" / "policy")  # clang's own, cloned
    judged = property(lambda self: self.root / "judged")  # a workload's costed builds
    chosen = property(lambda self: self.root / "chosen")
    policy = property(lambda self: self.root / "policy")  # the kept policy, released
    training = property(lambda self: self.root / "training.json")
    train = property(lambda self: self.root / "train")  # the trainer's run

    def kept_by_tool(self, name: str) -> Path:
        """Where a tool that reads the tune back keeps NAME, its own, in OUT."""
        if name in _LAYOUT:
            raise BuildError(f"{self.root / name}: the tune's own, not a tool's")
        return self.root / name

    def based_start(self, base: int | None) -> Path:
        """Where clang's own decisions at BASE are traced and cloned (`chain.based_start`)."""
        return self.root / f"start-{base}"

    decisions = property(lambda self: self.root / "decisions")
    deciding = property(lambda self: self.root.resolve() / "decide")  # the decisions' scratch
    programs = property(lambda self: self.root / "programs")  # the builds reported
    builds = property(lambda self: self.root / "programs" / "builds.json")
    pgo_row = property(lambda self: self.root / "programs" / "pgo.json")
    throughput = property(lambda self: self.root / "throughput.json")
    report = property(lambda self: self.root / "report.json")

    def tuned_recipe(self) -> tuple[Recipe, Problem, dict]:
        """The project this tune built, as its tune.json says: its shell lines and its
        workload (named after its source directory), its problem, and all its arguments."""
        if not self.arguments.is_file():
            raise BuildError(f"{self.root}: has no tune.json (not a tune's directory)")
        args = read_json(self.arguments, BuildError)
        try:
            recipe = project(
                Path(args["source"]).name, args["configure"], args["build"], args["test"], None
            )
            bench = tuple(args["bench"])
            return replace(recipe, bench=bench), get_problem(args["problem"]), args
        except (KeyError, TypeError) as e:
            raise BuildError(f"{self.arguments}: not a tune's arguments (no {e})") from e

    def finished_report(self) -> dict:
        """A finished tune's report.json (one line if it is not one)."""
        for path, what in (
            (self.arguments, "a tune's directory"),
            (self.report, "a finished tune"),
        ):
            if not path.is_file():
                raise BuildError(f"{self.root}: has no {path.name} (not {what})")
        report = read_json(self.report, BuildError)
        if not isinstance(report, dict) or "package" not in report:
            raise BuildError(f"{self.report}: not a finished tune's report.json (no 'package')")
        return report


def shipped_start(problem: Problem) -> Path | None:
    """The shipped policy tuning PROBLEM starts from: its own, or where none is shipped, that
    of the problem it `starts_from` (the link-time inliner from the per-file one); None
    where there is neither (the start is then `cloned_start`)."""
    own = shipped_policy(problem.name)
    if own.is_dir():
        return own
    return shipped_policy(problem.starts_from) if problem.starts_from else None


def writes_decisions(problem: Problem) -> bool:
    """Whether PROBLEM's decisions are the inliner's, which clang replays from a file (the
    problems our clang plugin serves, and records)."""
    return problem.plugin


# The names a tune writes in OUT itself (`kept_by_tool` refuses them to a tool).
_LAYOUT = {
    "pristine", "tune.json", "stages.json", "stages.log", "profile", "corpus", "traces",
    "record", "rehearsal.log", "start", "judged", "chosen", "policy", "training.json",
    "train", "decisions", "decide", "programs", "throughput.json", "report.json",
    "report.html", "per_file.json",
}  # fmt: skip


@dataclass(frozen=True)
class TuneRun:
    """One run of `mlgo tune`: the project RECIPE whose source is SOURCE, tuned into OUT
    with the toolchain TC for PROBLEM with OPTS, saying what it does with SAY."""

    source: Path
    recipe: Recipe
    out: TuneDir
    tc: Toolchain
    problem: Problem
    opts: TuneOptions
    say: Callable[[str], None] = print

    @classmethod
    def checked(
        cls,
        source: Path,
        recipe: Recipe,
        out: Path,
        tc: Toolchain,
        opts: TuneOptions,
        say: Callable[[str], None] = print,
    ) -> TuneRun:
        """The run, refused in one line before anything is written where the options cannot
        go together."""
        if not source.is_dir():
            raise UsageError(f"--source {source}: not a directory")
        if out.resolve() == source.resolve():
            raise UsageError(f"--out {out}: is the source directory; choose another")
        problem = get_problem(opts.problem)
        workload = "give --bench, a command that runs the programs the build makes"
        if problem.needs_workload and not recipe.bench:
            raise UsageError(f"--problem {problem.name} is trained on a workload: {workload}")
        if recipe.bench and not opts.bench_rounds:
            raise UsageError("--bench-rounds 0 with --bench: the workload needs a round or more")
        if opts.pgo and not recipe.bench:
            raise UsageError(
                f"--pgo tunes on top of a build with the workload's profile: {workload}"
            )
        if opts.profile_inputs and not (opts.pgo and problem.plugin and problem.aim == "speed"):
            raise UsageError(
                "--use-feature profile-inputs reads the profile's counts at each call site: it "
                "needs --pgo and --problem inlining-speed"
            )
        run = cls(source, recipe, TuneDir(out), tc, problem, opts, say)
        if run.given_start is not None:
            from mlgo.train.run import load_start

            load_start(run.given_start, problem, "--policy")  # one training may start from
        return run

    @property
    def given_start(self) -> Path | None:
        """The policy training starts from: --policy, or the problem's shipped one; None:
        clang's own decisions, cloned once traced (`chain.cloned_start`)."""
        return self.opts.policy or shipped_start(self.problem)

    @property
    def start(self) -> Path:
        return (self.given_start or self.out.start).resolve()

    @property
    def pristine(self) -> Path:
        return self.out.pristine

    @property
    def profile(self) -> Path | None:
        """With --pgo, the workload's profile every build uses; else None."""
        return self.out.profile.resolve() if self.opts.pgo else None

    @property
    def decisions(self) -> Path | None:
        """Where the kept decisions go, for a problem clang replays; else None."""
        return self.out.decisions if writes_decisions(self.problem) else None

    @property
    def baseline(self) -> str:
        """What the tune is measured against: the problem's level (with the profile)."""
        return baseline_label(self.problem, self.opts.pgo)
