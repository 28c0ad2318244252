"""The build a performance engineer makes anyway, timed beside the plain build and the
policy's: profile-guided optimization (PGO) from the user's own workload.

The project is built instrumented at the comparison's own flags (under LTO too, where the
comparison links that way), its workload run once there, apart from the timed runs, and
the raw profiles merged into PROFILE/default.profdata beside the builds, a file the user
can ship with the project. Then it is built again with that profile (`-fprofile-instr-use`,
with clang's warnings about functions the run never reached silenced as a user would,
`llvm.profiles.PROFILE_USE_FLAGS`) and its tests run: the PGO row of a report
(`throughput.pgo`), timed in the same rounds as the others.

The row stands beside a tune's result and is never a reason to lose it: a workload that
reaches none of the project's code (no raw profile, or no count in it), or a PGO build
that fails or prints another result than the plain build, leaves the row out with one
line saying why (`throughput.pgo_left_out`).
"""

from __future__ import annotations

import shutil
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mlgo.llvm.profiles import (
    INSTRUMENT_FLAGS,
    MERGED,
    hot_functions,
    merge_profiles,
    most_counted,
    raw_pattern,
    use_flags,
)
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import Recipe
from mlgo.programs.build import Building, Variant, build_program, plain_compilers, problem_flags
from mlgo.programs.layouts import policy_over_layouts
from mlgo.programs.measure import (
    Timing,
    Workload,
    first_difference,
    inverted,
    prepare_workload,
    recipe_throughput,
    recipe_workload,
    run_workload,
    workload_output,
)
from mlgo.runtime.commands import BuildError
from mlgo.ship.decisions import read

if TYPE_CHECKING:
    from mlgo.programs.tune_run import TuneRun

PGO = "pgo"  # the PGO build: its tree's name beside the other builds, its key in a throughput
UNPROFILED = "unprofiled"  # on top of PGO, the plain build without the profile: the same
PROFILE = "profile"  # the directory beside the builds that holds the profile


def profile_workload(workload: Workload, tree: Path, where: Path, tc: Toolchain) -> Path:
    """WORKLOAD run once in the instrumented build TREE, each process writing a raw profile
    of its own, merged into WHERE/default.profdata. A run that reached none of the
    instrumented code is a BuildError, and leaves no profile."""
    where = where.resolve()
    raw, merged = where / "raw", where / MERGED
    shutil.rmtree(raw, ignore_errors=True)  # an interrupted run's profiles are not this run's
    raw.mkdir(parents=True)
    merged.unlink(missing_ok=True)
    run_workload(workload, tree, ("env", f"LLVM_PROFILE_FILE={raw_pattern(raw)}"))
    raws = sorted(raw.glob("*.profraw"))
    if not raws:
        raise BuildError(f"{workload.recipe}: the workload ran none of its code (no raw profile)")
    merge_profiles(tc, raws, merged, where / "profile.log", f"{workload.recipe} (instrumented)")
    shutil.rmtree(raw)
    if most_counted(tc, merged) == 0:
        merged.unlink()
        raise BuildError(
            f"{workload.recipe}: the workload reached none of its functions (no count in "
            "its profile)"
        )
    return merged


def profile_stage(run: TuneRun) -> None:
    """A tune's profile stage: with --pgo, the project built instrumented from the snapshot
    and its workload run once, for the profile every later build of the tune uses; without,
    nothing (the stage is finished all the same: --pgo is its argument)."""
    if run.profile is not None:
        name = run.recipe.name
        run.say(f"building {name} instrumented and running the workload, for its profile")
        flags = problem_flags(run.problem)
        instrumented_profile(run.recipe, run.pristine, run.profile.parent, run.tc, flags)


def instrumented_profile(
    recipe: Recipe, pristine: Path, where: Path, tc: Toolchain, flags: list[str]
) -> Path:
    """RECIPE built instrumented from PRISTINE at FLAGS in WHERE/instrumented (removed once
    profiled) and its workload run once there: the merged profile in WHERE."""
    tree = where.resolve() / "instrumented"
    compilers, instrumented = plain_compilers(tc), [*flags, *INSTRUMENT_FLAGS]
    build_program(
        recipe,
        pristine,
        tree,
        tc,
        Variant("instrumented", compilers, {}),
        instrumented,
        Building(tests=False),
    )
    try:
        prepare_workload(recipe, tree, f"{recipe.name} (instrumented): bench")
        return profile_workload(recipe_workload(recipe), tree, where, tc)
    finally:
        shutil.rmtree(tree)


@dataclass(frozen=True)
class PGORow:
    """The build a report times beside plain and the policy's (its TREE, the PROFILE, its
    FLAGS and its TESTS), or the one line saying why there is none (LEFT_OUT). By its NAME:
    PGO, the PGO build, whose FLAGS the profile adds to the plain build's; or, in a tune on
    top of PGO, where the plain build is the PGO build, UNPROFILED, that build without the
    profile, FLAGS its own."""

    tree: str = ""
    profile: str = ""
    flags: tuple[str, ...] = ()
    tests: str = ""
    left_out: str = ""
    name: str = PGO

    def timed(self) -> dict[str, Path]:
        """The tree to time beside the others, by its name; none when the row is left out."""
        return {self.name: Path(self.tree)} if self.tree else {}

    def over_layouts(self, base: Variant, flags: list[str]) -> list[tuple[Variant, list[str]]]:
        """What `layouts.policy_over_layouts` builds and times beside plain (BASE, built at
        FLAGS) and the policy, for this row: BASE's compilers under its name, at its build's
        flags; none when the row is left out."""
        if not self.tree:
            return []
        its = [*flags, *self.flags] if self.name == PGO else [*self.flags]
        return [(Variant(self.name, base.compilers, base.env), its)]

    def into(self, throughput: dict) -> dict:
        """THROUGHPUT, timed with `timed`'s tree among the others (and over layouts with
        `over_layouts`'s), with the build behind its row and its change over layouts moved
        into it (`<name>.layouts`), or with the line saying why it has none. An UNPROFILED
        row's change is against the PGO build: PGO's own against plain clang is its inverse,
        round by round (`pgo_change_pct`, `pgo_iqr_pct`, over layouts `pgo_layouts`)."""
        if self.left_out:
            throughput["pgo_left_out"] = self.left_out
        elif self.name in throughput:
            row = throughput[self.name]
            row.update(profile=self.profile, flags=list(self.flags), tests=self.tests)
            if self.name in throughput.get("layouts", {}):
                row["layouts"] = throughput["layouts"].pop(self.name)
            if self.name == UNPROFILED:
                against = inverted(row["ratios_pct"])
                throughput.update(pgo_change_pct=against["change_pct"])
                throughput.update(pgo_iqr_pct=against["iqr_pct"])
                if over := row.get("layouts"):
                    throughput["pgo_layouts"] = inverted(over["ratios_pct"]) | {
                        "layouts": over["layouts"]
                    }
        return throughput


def row_build(
    recipe: Recipe,
    pristine: Path,
    plain: Path,
    tc: Toolchain,
    name: str,
    flags: list[str],
    tests: bool,
) -> str:
    """RECIPE built from PRISTINE at FLAGS beside the plain build's tree PLAIN, in NAME/,
    tested if TESTS (what its tests did), its workload printing what the plain build's
    does; a BuildError says why not, and leaves no tree."""
    tree = plain.parent / name
    try:
        built = build_program(
            recipe,
            pristine,
            tree,
            tc,
            Variant(name, plain_compilers(tc), {}),
            flags,
            Building(tests=tests),
        )
        workload = recipe_workload(recipe)
        for t in (plain, tree):
            prepare_workload(recipe, t, f"{recipe.name} ({t.name}): bench")
        expected, got = (workload_output(workload, t) for t in (plain, tree))
        if got != expected:
            runs = f"the plain build and the {name} build"
            raise BuildError(f"{recipe.name}: {first_difference(expected, got, runs)}")
    except BuildError:
        shutil.rmtree(tree, ignore_errors=True)
        raise
    return built.tests


def pgo_row(
    recipe: Recipe, pristine: Path, plain: Path, tc: Toolchain, flags: list[str], tests: bool
) -> PGORow:
    """RECIPE's PGO build from PRISTINE at the plain build's FLAGS, beside the plain build's
    tree PLAIN: the profile in PROFILE/ and the build in pgo/ (`row_build`); else the row
    left out, saying why."""
    try:
        profile = instrumented_profile(recipe, pristine, plain.parent / PROFILE, tc, flags)
        added = use_flags(profile)
        tested = row_build(recipe, pristine, plain, tc, PGO, [*flags, *added], tests)
    except BuildError as e:
        return PGORow(left_out=f"the PGO row is left out: {e}")
    return PGORow(str(plain.parent / PGO), str(profile), tuple(added), tested)


def unprofiled_row(
    recipe: Recipe,
    pristine: Path,
    plain: Path,
    tc: Toolchain,
    flags: list[str],
    profile: Path,
    tests: bool,
) -> PGORow:
    """In a tune on top of PGO, where the plain build PLAIN is built with PROFILE: RECIPE
    built from PRISTINE at FLAGS, without it, in unprofiled/ (`row_build`); else the row
    left out, saying why."""
    try:
        tested = row_build(recipe, pristine, plain, tc, UNPROFILED, flags, tests)
    except BuildError as e:
        return PGORow(left_out=f"the build without the profile is left out: {e}")
    tree = str(plain.parent / UNPROFILED)
    return PGORow(tree, str(profile), tuple(flags), tested, name=UNPROFILED)


def hot_departures(profile: Path, decisions: Path, tc: Toolchain) -> dict:
    """Where the profile and the policy meet, in a tune on top of PGO: the functions
    PROFILE's run made hot as clang's inliner reads it (`profiles.hot_functions`), and per
    file of the DECISIONS kept, the policy's departures from clang's own decisions (with
    the profile) in all its callers and in the hot ones, by caller (a program's, at an LTO
    link, as `links/PROGRAM`). A static function's profile name (`file.c:f`) is matched in
    the file whose path ends as its file's, and in any linked program."""
    hot, functions = hot_functions(tc, profile)
    files_of: dict[str, list[tuple[str, ...]]] = {}
    for name in functions:
        file, _, function = name.rpartition(":")
        files_of.setdefault(function, []).append(Path(file).parts)

    def is_hot(function: str, path: str | None) -> bool:  # a link's (None): by name alone
        parts = Path(path).parts if path is not None else ()
        return any(path is None or _ends_alike(parts, file) for file in files_of.get(function, []))

    artifact, files = read(decisions), {}
    units = [*artifact.files.items(), *((f"links/{p}", u) for p, u in artifact.links.items())]
    for path, unit in units:
        callers = unit.get("functions", {}).items()
        departed = {f: n for f, u in callers if (n := u.get("departures"))}
        if departed:
            linked = None if path.startswith("links/") else path
            in_hot = {f: n for f, n in departed.items() if is_hot(f, linked)}
            files[path] = {"departures": sum(departed.values()), "in_hot_callers": in_hot}
    return {"hot_count": hot, "hot_functions": sorted(functions), "files": files}


def _ends_alike(a: tuple[str, ...], b: tuple[str, ...]) -> bool:
    """Whether the shorter of the paths A and B is the end of the other, whole names only
    (`main.c` ends `src/main.c`, not `domain.c`); an empty one (a global function's file)
    ends any."""
    n = min(len(a), len(b))
    return a[len(a) - n :] == b[len(b) - n :]


def timed_beside_row(
    recipe: Recipe,
    pristine: Path,
    trees: dict[str, Path],
    row: PGORow,
    builds: Sequence[tuple[Variant, list[str]]],
    tc: Toolchain,
    timing: Timing,
) -> dict:
    """A report's `throughput`: the workload's clock on TREES (the plain build first, then
    the policy's) and the ROW's build, in TIMING's rounds (`recipe_throughput`), and over
    its layouts, BUILDS (plain and the policy's, each at its flags) and the row's relinked
    beside the plain tree, in layouts/ (`layouts.policy_over_layouts`); the row's figures
    in it (`PGORow.into`)."""
    speed = recipe_throughput(recipe, trees | row.timed(), timing.rounds, timing.seconds)
    if timing.layouts:
        at = trees["plain"].parent / "layouts"
        beside = row.over_layouts(*builds[0])
        speed["layouts"] = policy_over_layouts(recipe, pristine, at, tc, [*builds, *beside], timing)
    return row.into(speed)
