"""`mlgo corpus build`: real Debian source packages -> a corpus of bitcode modules.

For each package: fetch its source with `apt-get source`, build it with its own build
system under Debian's `bear` (compile_commands.json) with a compiler wrapper that adds
`-Xclang -fembed-bitcode=all` (pre-optimization bitcode and the cc1 command line go into
each object), then let LLVM's own `extract_ir` (PyPI's mlgo-utils) pull them out
(`corpus.extract`). A package that fails is reported with the tail of its build log and
the others go on.
"""

from __future__ import annotations

import hashlib
import shutil
from dataclasses import dataclass
from pathlib import Path

from mlgo.corpus.extract import distinct_modules, extract_modules, kept_compiles
from mlgo.corpus.format import DESCRIPTION, load_corpus, write_description
from mlgo.corpus.record import record
from mlgo.corpus.wrappers import RECORD_FLAGS, build_env
from mlgo.llvm.profiles import INSTRUMENT_FLAGS, merge_profiles, raw_pattern, use_flags
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.debian import ensure_build_depends, fetch_source
from mlgo.packages.recipes import Recipe
from mlgo.runtime.commands import BuildError, run_logged
from mlgo.runtime.files import atomic_directory, atomic_write_text
from mlgo.runtime.inputs import read_json
from mlgo.runtime.messages import copy_error


def run_tests(recipe: Recipe, tree: Path, log: Path, env: dict[str, str] | None, what: str) -> None:
    """Every test line of RECIPE in TREE, logged to LOG; the first that fails raises
    BuildError naming WHAT."""
    for cmd in recipe.test:
        run_logged(cmd, tree, log, recipe.test_timeout_s, env, what)


@dataclass(frozen=True)
class Built:
    """One package's corpus: its module count, whether a finished earlier build of the
    same recipe, level and clang was reused instead of building again, and one line per
    object a new build left out."""

    modules: int
    reused: bool
    skipped: tuple[str, ...] = ()


def extract_package(
    recipe: Recipe,
    tc: Toolchain,
    out: Path,
    work: Path,
    opt_level: str = "-Oz",
    profile: bool = False,
    stage: str = "compile",
) -> Built:
    """Fetches and builds one Debian package at OPT_LEVEL; writes its corpus to OUT/NAME.
    With PROFILE, the recorded modules carry the counts of the package's own tests; with
    a link STAGE, the corpus is of its LTO links' modules (`record_links`).

    The finished corpus is kept in WORK with a stamp of everything that made it, so that
    rebuilding a split only builds the packages that failed, changed or are new.
    """
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    finished, stamp = work / "finished", work / "finished.stamp"
    if stage != "compile" and profile:
        raise BuildError(f"{recipe.name}: a link corpus is recorded without a profile")
    made_of = (recipe, opt_level, profile, stage, tc.describe())
    key = hashlib.sha256(repr(made_of).encode()).hexdigest()
    reused = stamp.is_file() and stamp.read_text() == key and (finished / recipe.name).is_dir()
    skipped: list[str] = []
    if not reused:
        stamp.unlink(missing_ok=True)
        log = work / "build.log"
        log.write_text("")
        ensure_build_depends(recipe, log)
        src = fetch_source(recipe, work, log)
        profdata = profile_own_tests(recipe, src, tc, work, opt_level) if profile else None
        if stage != "compile":
            skipped += record_links(recipe, src, tc, finished, opt_level, stage)
        else:
            build_corpus(
                recipe.name,
                src,
                recipe.configure,
                recipe.build,
                tc,
                finished,
                work,
                recipe.build_timeout_s,
                opt_level,
                profdata,
                skipped,
            )
        atomic_write_text(stamp, key)
    with atomic_directory(out.resolve() / recipe.name) as staged:
        shutil.copytree(finished / recipe.name, staged, dirs_exist_ok=True)
    modules = read_json(finished / recipe.name / DESCRIPTION)["modules"]
    return Built(len(modules), reused, tuple(skipped))


def record_links(
    recipe: Recipe, src: Path, tc: Toolchain, out: Path, opt_level: str, stage: str
) -> list[str]:
    """RECIPE's configure and build run in SRC under `mlgo corpus record --lto`'s recording
    for STAGE (`corpus.record.record`), its corpus of link modules written to OUT/NAME as a
    package's part of a corpus (named by their output's path in SRC, of that stage).
    Returns the lines of the links it left out."""
    script = " && ".join([*recipe.configure, *recipe.build])
    recorded_in = out / f".{recipe.name}-links"
    shutil.rmtree(recorded_in, ignore_errors=True)
    timeout = recipe.build_timeout_s
    build = ["sh", "-c", script]
    got = record(build, recorded_in, tc, src, recipe.name, opt_level, timeout, stage)
    names = [m.name.split("/", 1)[1] for m in load_corpus(recorded_in).modules]
    with atomic_directory(out / recipe.name) as staged:
        shutil.copytree(recorded_in / recipe.name, staged, dirs_exist_ok=True)
        write_description(staged, names, stage=stage)
    shutil.rmtree(recorded_in)
    return got.skipped


def profile_own_tests(recipe: Recipe, src: Path, tc: Toolchain, work: Path, opt_level: str) -> Path:
    """The merged profile (WORK/profile.profdata) of the recipe's own tests, run on a copy
    of SRC built instrumented at OPT_LEVEL.

    Static block-frequency estimates can weigh a function's blocks very differently from a
    real run (an interpreter's dispatch loop is the known case), and the regalloc reward
    weighs each spill by its block's frequency. Recorded with `-fprofile-instr-use`, a
    module's bitcode carries the measured counts (branch weights, function entry counts),
    so compiling it later needs no profile file.
    """
    if not recipe.test:
        raise BuildError(f"{recipe.name}: its recipe has no tests to profile")
    work = work.resolve()
    tree, raw, bin_dir = work / "instrumented", work / "profraw", work / "instrumented-bin"
    for d in (tree, raw):
        shutil.rmtree(d, ignore_errors=True)
    try:
        shutil.copytree(src, tree, symlinks=True)
    except shutil.Error as e:  # its message is the list of every file that failed
        raise copy_error(e) from e
    raw.mkdir(parents=True)
    bin_dir.mkdir(parents=True, exist_ok=True)
    log = work / "profile.log"
    log.write_text("")
    flags = [opt_level, "-g0", *INSTRUMENT_FLAGS, "-Qunused-arguments"]
    env = build_env(tc, bin_dir, flags)
    what = f"{recipe.name} (instrumented)"
    for cmd in recipe.configure:
        run_logged(cmd, tree, log, recipe.build_timeout_s, env, f"{what}: configure")
    for cmd in recipe.build:
        run_logged(cmd, tree, log, recipe.build_timeout_s, env, f"{what}: build")
    env["LLVM_PROFILE_FILE"] = raw_pattern(raw)
    run_tests(recipe, tree, log, env, f"{what}: its own tests")
    profiles = sorted(raw.glob("*.profraw"))
    if not profiles:
        raise BuildError(f"{what}: its tests ran no instrumented code (log: {log})")
    return merge_profiles(tc, profiles, work / "profile.profdata", log, what)


def build_corpus(
    name: str,
    src: Path,
    configure: tuple[str, ...],
    build: tuple[str, ...],
    tc: Toolchain,
    out: Path,
    work: Path,
    timeout_s: float = 1800.0,
    opt_level: str = "-Oz",
    profile: Path | None = None,
    skipped: list[str] | None = None,
) -> int:
    """Builds the tree SRC with the recording wrapper at OPT_LEVEL (using PROFILE's counts,
    if given) and writes its corpus to OUT/NAME, replacing it only once extraction
    succeeded. Returns the module count; SKIPPED gets one line per object left out.

    A module is named by its object's path under SRC, however the build named it (`-o
    $(CURDIR)/obj/x.o`, or `-o util.o` in two directories), so names are distinct,
    relative and the same in every build; an object outside SRC is left out."""
    src, out, work = src.resolve(), out.resolve(), work.resolve()  # the build runs in SRC
    work.mkdir(parents=True, exist_ok=True)
    log = work / "build.log"
    flags = [opt_level, *RECORD_FLAGS]
    if profile:
        flags += use_flags(profile)
    env = build_env(tc, work, flags)
    for cmd in configure:
        run_logged(cmd, src, log, timeout_s, env, f"{name}: configure")
    recorded = run_under_bear(
        ["sh", "-c", " && ".join(build)], src, work, log, timeout_s, env, f"{name}: build"
    )
    skipped = [] if skipped is None else skipped
    named = []
    for obj in (c.obj.resolve() for c in kept_compiles(recorded)):
        try:
            named.append((str(obj.relative_to(src)), obj))
        except ValueError:
            skipped.append(f"{obj}: outside the package's tree {src}, skipped")
    modules = distinct_modules(named, skipped)
    if not modules:
        raise BuildError(f"{name}: no object with bitcode in {src} (log: {log})")
    with atomic_directory(out / name) as staged:
        return len(extract_modules(modules, staged, tc, work, log, name))


def run_under_bear(
    argv: list[str],
    cwd: Path,
    work: Path,
    log: Path,
    timeout_s: float | None,
    env: dict[str, str],
    what: str,
) -> Path:
    """Runs the build ARGV in CWD under Debian's `bear`; returns the compile_commands.json
    it recorded (in WORK)."""
    recorded = work / "compile_commands.json"
    recorded.unlink(missing_ok=True)
    run_logged(["bear", "--output", str(recorded), "--", *argv], cwd, log, timeout_s, env, what)
    return recorded
