"""Real programs built twice from their Debian source packages, with the plain compiler and
with `mlgo-cc`, each checked by the package's own tests: the honest end-to-end figure.

A recipe (corpus/recipes/*.toml) says how to configure, build and test a package and
which programs it links. Both builds start from the same pristine source tree, use the
same flags, and differ only in CC/CXX; the linked programs' .text is compared.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import sys
import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path

from mlgo.corpus.wrappers import build_env
from mlgo.llvm.profiles import use_flags
from mlgo.llvm.sizes import text_size
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.build import run_tests as run_recipe_tests  # `run_tests` is a flag here
from mlgo.packages.debian import ensure_build_depends, fetch_source
from mlgo.packages.recipes import Recipe
from mlgo.problems import STAGE_FLAGS, Problem
from mlgo.programs.measure import children_cpu
from mlgo.runtime.commands import BuildError, run_logged
from mlgo.runtime.files import atomic_directory
from mlgo.runtime.messages import copy_error
from mlgo.runtime.trust import UntrustedPathError
from mlgo.serve.client import ServiceError, launch_service


def level_flags(level: str) -> list[str]:
    """What both builds of a comparison add after a package's own flags: the level the
    policy serves (the last -O wins) and no debug info."""
    return [level, "-g0", "-Qunused-arguments"]


SIZE_FLAGS = level_flags("-Oz")


def problem_flags(problem: Problem, profile: Path | None = None) -> list[str]:
    """What both builds of a comparison for PROBLEM add: its level and its stage's flags
    (full LTO linked by lld, for a link-time problem), so the plain side is `-Oz -flto`;
    with a PROFILE, the flags that optimize with its counts (a tune on top of PGO)."""
    profiled = use_flags(profile) if profile else []
    return [*level_flags(problem.opt_level), *STAGE_FLAGS[problem.stage], *profiled]


def baseline_label(problem: Problem, profiled: bool = False) -> str:
    """The plain build of a comparison for PROBLEM as reports name it: `clang` with this
    (PROFILED: built with the workload's profile, the baseline of a tune on top of PGO)."""
    profile = ["-fprofile-instr-use"] if profiled else []
    return " ".join([problem.opt_level, *STAGE_FLAGS[problem.stage], *profile])


@dataclass(frozen=True)
class Variant:
    """One side of a comparison: its name, its (CC, CXX) and what they need in the
    environment."""

    name: str
    compilers: tuple[str, str]
    env: dict[str, str]


@dataclass
class ProgramBuild:
    package: str
    variant: str  # "plain" or "mlgo"
    build_seconds: float
    build_cpu_seconds: float  # user + system time of every process the build ran
    text: dict[str, int]  # program -> linked .text bytes
    tests: str  # "passed" or "not run" (a failing test raises BuildError)

    def to_json(self) -> dict:
        return asdict(self)


def scratch_copy(pristine: Path, scratch: Path) -> None:
    """PRISTINE copied to SCRATCH, for a build of its own, after whatever an earlier one
    left in SCRATCH's parent is gone; a failed copy names every file that failed. A link in
    SCRATCH's place or its parent's is refused: what is removed and written is mlgo's own."""
    for path in (scratch.parent, scratch):
        if path.is_symlink():
            raise UntrustedPathError(f"{path} is a symbolic link where a scratch tree goes")
    shutil.rmtree(scratch.parent, ignore_errors=True)
    try:
        shutil.copytree(pristine, scratch, symlinks=True)
    except shutil.Error as e:  # its message is the list of every file that failed
        raise copy_error(e) from e


def pristine_source(recipe: Recipe, work: Path) -> Path:
    """The unpacked Debian source, fetched once and kept for every build."""
    work = work.resolve()  # apt-get and dpkg-source run in subdirectories
    pristine = work / "pristine"
    if not (pristine / ".complete").exists():
        work.mkdir(parents=True, exist_ok=True)
        log = work / "fetch.log"
        ensure_build_depends(recipe, log)
        with atomic_directory(pristine) as staged:
            fetch_source(recipe, work, log).rename(staged)  # onto the empty staging dir
            (staged / ".complete").touch()
    return pristine


@dataclass(frozen=True)
class Building:
    """How a build runs beyond what it compiles with: whether the package's own TESTS run
    after it, a LOG_DIR where each compiler call is logged (`wrappers.write_wrapper`), and
    a CONFIGURED copy that the configure step is done once into (`configured_copy`)."""

    tests: bool = True
    log_dir: Path | None = None
    configured: Path | None = None


def build_program(
    recipe: Recipe,
    pristine: Path,
    tree: Path,
    tc: Toolchain,
    variant: Variant,
    flags: list[str] | None = None,
    how: Building = Building(),
) -> ProgramBuild:
    """Configures, builds (timed) and tests (`Building`) a fresh copy of PRISTINE at TREE
    with VARIANT's (CC, CXX) and environment, the compilers getting FLAGS (default: -Oz)
    after the package's own."""
    tree = tree.resolve()
    wrappers = tree.parent / f".{tree.name}-bin"
    wrappers.mkdir(parents=True, exist_ok=True)
    log = tree.parent / f"{tree.name}.log"
    log.write_text("")
    (cc, cxx), compilers = variant.compilers, variant.compilers
    flags = flags or SIZE_FLAGS
    env = build_env(tc, wrappers, flags, cc=cc, cxx=cxx, log_dir=how.log_dir)
    env.update(variant.env)
    name = f"{recipe.name} ({variant.name})"
    configured_copy(recipe, pristine, tree, env, [*compilers, *flags], name, how.configured)
    start, cpu_start = time.monotonic(), children_cpu()
    for cmd in recipe.build:
        run_logged(cmd, tree, log, recipe.build_timeout_s, env, f"{name}: build")
    seconds, cpu = time.monotonic() - start, children_cpu() - cpu_start
    missing = [p for p in recipe.programs if not (tree / p).is_file()]
    if missing:
        raise BuildError(f"{name}: the build made no {', '.join(missing)} (log: {log})")
    text = {p: text_size(tree / p) for p in recipe.programs}
    if how.tests:
        run_recipe_tests(recipe, tree, log, env, f"{name}: its own tests")
    tests = "passed" if recipe.test and how.tests else "not run"
    return ProgramBuild(recipe.name, variant.name, seconds, cpu, text, tests)


def configured_copy(
    recipe: Recipe,
    pristine: Path,
    tree: Path,
    env: dict[str, str],
    compiles: list[str],
    name: str,
    kept: Path | None,
) -> None:
    """TREE as RECIPE's configure leaves a copy of PRISTINE in ENV, its wrappers running
    COMPILES (the compilers, then the flags they add). With KEPT, that tree is kept there
    and copied (times and all, so make sees nothing to redo) while the commands, the paths,
    ENV and COMPILES are the same: a speed tune builds the project once a candidate, and
    the candidates differ only in what the served policy decides, which no configure test
    can see (jq's autoreconf and configure were 32 of its 46 seconds of build)."""
    log = tree.parent / f"{tree.name}.log"
    saw = json.dumps([str(pristine), str(tree), recipe.configure, sorted(env.items()), compiles])
    key = hashlib.sha256(saw.encode()).hexdigest()
    shutil.rmtree(tree, ignore_errors=True)
    if kept and (kept / "key").is_file() and (kept / "key").read_text() == key:
        shutil.copytree(kept / "tree", tree, symlinks=True)
        with log.open("a") as out:
            out.write(f"configured as before: a copy of {kept / 'tree'}\n")
        return
    shutil.copytree(pristine, tree, symlinks=True)
    for cmd in recipe.configure:
        run_logged(cmd, tree, log, recipe.build_timeout_s, env, f"{name}: configure")
    if kept:
        with atomic_directory(kept) as staged:
            shutil.copytree(tree, staged / "tree", symlinks=True)
            (staged / "key").write_text(key)


def cleaned(recipe: Recipe, tree: Path) -> None:
    """TREE as `make clean` leaves it: no object, archive or program of the build."""
    for path in [*tree.rglob("*.o"), *tree.rglob("*.a"), *(tree / p for p in recipe.programs)]:
        path.unlink(missing_ok=True)


def rebuild_cpu_seconds(
    recipe: Recipe, tree: Path, tc: Toolchain, variant: Variant, flags: list[str]
) -> float:
    """TREE, built by `build_program` with VARIANT and FLAGS, cleaned and built again: its
    CPU seconds."""
    cleaned(recipe, tree)
    cc, cxx = variant.compilers
    env = dict(build_env(tc, tree.parent / f".{tree.name}-bin", flags, cc=cc, cxx=cxx))
    env |= variant.env
    log = tree.parent / f"{tree.name}.log"
    cpu_start = children_cpu()
    for cmd in recipe.build:
        run_logged(cmd, tree, log, recipe.build_timeout_s, env, f"{recipe.name}: rebuild")
    return children_cpu() - cpu_start


@contextmanager
def policy_service(policies: list[Path], directory: Path, backend: str = "auto"):
    """`mlgo serve` for a build, on a socket of its own; yields the environment to use."""
    directory = directory.resolve()  # the builds run in their own directories
    directory.mkdir(parents=True, exist_ok=True)
    socket = directory / "mlgo.sock"
    socket.unlink(missing_ok=True)  # a killed service's socket would look ready
    log = directory / "serve.log"
    try:
        served = [str(p.resolve()) for p in policies]
        proc = launch_service(socket, served, backend, log, 0, 300, bound=True)
    except ServiceError as e:
        raise BuildError(str(e)) from e
    try:
        yield {"MLGO_SOCKET": str(socket), "MLGO_STRICT": "1"}
    finally:
        proc.terminate()
        proc.wait(30)


def mlgo_compilers() -> tuple[str, str]:
    """mlgo-cc and mlgo-c++ as installed beside this interpreter."""
    paths = [Path(sys.executable).parent / name for name in ("mlgo-cc", "mlgo-c++")]
    for path in paths:
        if not os.access(path, os.X_OK):
            raise BuildError(f"{path} is missing; run tools/setup.sh")
    return str(paths[0]), str(paths[1])


def plain_compilers(tc: Toolchain) -> tuple[str, str]:
    return tc.clang, tc.clangxx
