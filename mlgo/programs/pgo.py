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

from mlgo.llvm.profiles import (
    INSTRUMENT_FLAGS,
    merge_profiles,
    most_counted,
    raw_pattern,
    use_flags,
)
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import Recipe
from mlgo.programs.build import Variant, build_program, plain_compilers
from mlgo.programs.layouts import policy_over_layouts
from mlgo.programs.measure import (
    Workload,
    first_difference,
    prepare_workload,
    recipe_throughput,
    recipe_workload,
    run_workload,
    workload_output,
)
from mlgo.runtime.commands import BuildError

PGO = "pgo"  # the PGO build: its tree's name beside the other builds, its key in a throughput
PROFILE = "profile"  # the directory beside the builds that holds the profile
MERGED = "default.profdata"


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


def instrumented_profile(
    recipe: Recipe, pristine: Path, where: Path, tc: Toolchain, flags: list[str]
) -> Path:
    """RECIPE built instrumented from PRISTINE at FLAGS in WHERE/instrumented (removed once
    profiled) and its workload run once there: the merged profile in WHERE."""
    tree = where.resolve() / "instrumented"
    compilers, instrumented = plain_compilers(tc), [*flags, *INSTRUMENT_FLAGS]
    build_program(recipe, pristine, tree, tc, "instrumented", compilers, None, False, instrumented)
    try:
        prepare_workload(recipe, tree, f"{recipe.name} (instrumented): bench")
        return profile_workload(recipe_workload(recipe), tree, where, tc)
    finally:
        shutil.rmtree(tree)


@dataclass(frozen=True)
class PGORow:
    """The PGO build a report times beside the others (its TREE, the PROFILE it was built
    with, the FLAGS it added to the plain build's and its TESTS), or the one line saying
    why there is none (LEFT_OUT)."""

    tree: str = ""
    profile: str = ""
    flags: tuple[str, ...] = ()
    tests: str = ""
    left_out: str = ""

    def timed(self) -> dict[str, Path]:
        """The tree to time beside the others, by its name; none when the row is left out."""
        return {PGO: Path(self.tree)} if self.tree else {}

    def over_layouts(self) -> tuple[str, tuple[str, ...]] | None:
        """What `layouts.policy_over_layouts` builds and times beside plain and the policy
        for this row (its name and the flags the profile adds); none when left out."""
        return (PGO, self.flags) if self.tree else None

    def into(self, throughput: dict) -> dict:
        """THROUGHPUT, timed with `timed`'s tree among the others (and over layouts with
        `over_layouts`'s), with the build behind its PGO row and its change over layouts
        moved into it (`pgo.layouts`), or with the line saying why it has none."""
        if self.left_out:
            throughput["pgo_left_out"] = self.left_out
        elif PGO in throughput:
            throughput[PGO].update(profile=self.profile, flags=list(self.flags), tests=self.tests)
            if PGO in throughput.get("layouts", {}):
                throughput[PGO]["layouts"] = throughput["layouts"].pop(PGO)
        return throughput


def pgo_row(
    recipe: Recipe, pristine: Path, plain: Path, tc: Toolchain, flags: list[str], tests: bool
) -> PGORow:
    """RECIPE's PGO build from PRISTINE at the plain build's FLAGS, beside the plain build's
    tree PLAIN: the profile in PROFILE/ and the build in pgo/, tested if TESTS, its workload
    printing what the plain build's does; else the row left out, saying why."""
    work = plain.parent
    tree = work / PGO
    try:
        profile = instrumented_profile(recipe, pristine, work / PROFILE, tc, flags)
        added = use_flags(profile)
        built = build_program(
            recipe, pristine, tree, tc, PGO, plain_compilers(tc), None, tests, [*flags, *added]
        )
        workload = recipe_workload(recipe)
        for t in (plain, tree):
            prepare_workload(recipe, t, f"{recipe.name} ({t.name}): bench")
        expected, got = (workload_output(workload, t) for t in (plain, tree))
        if got != expected:
            runs = "the plain build and the PGO build"
            raise BuildError(f"{recipe.name}: {first_difference(expected, got, runs)}")
    except BuildError as e:
        shutil.rmtree(tree, ignore_errors=True)
        return PGORow(left_out=f"the PGO row is left out: {e}")
    return PGORow(str(tree), str(profile), tuple(added), built.tests)


def timed_beside_row(
    recipe: Recipe,
    pristine: Path,
    trees: dict[str, Path],
    row: PGORow,
    pair: Sequence[Variant],
    flags: list[str],
    at: Path,
    tc: Toolchain,
    timing: tuple[int, float, int],
) -> dict:
    """A report's `throughput`: the workload's clock on TREES (the plain build first, then
    the policy's) and the ROW's build, in ROUNDS paired rounds of about SECONDS of CPU each
    (`recipe_throughput`), and over LAYOUTS shuffled layouts of the PAIR's builds and the
    row's, built in AT (`layouts.policy_over_layouts`; TIMING: rounds, seconds, layouts);
    the row's figures in it (`PGORow.into`)."""
    rounds, seconds, layouts = timing
    speed = recipe_throughput(recipe, trees | row.timed(), rounds, seconds)
    if layouts:
        speed["layouts"] = policy_over_layouts(
            recipe, pristine, at, tc, pair, flags, layouts, rounds, seconds, row.over_layouts()
        )
    return row.into(speed)
