"""A package's first build and its rebuild, timed as a user sees them: plain clang against
`mlgo-cc` served by one policy service, with an A/A control.

A build's cost is its wall time and its CPU: every process the build ran and the service
that answered its compiles (its own accounting in /proc: the service runs beside the build,
not under it, so a build's own rusage leaves it out). A package is a recipe of
corpus/recipes, or any Debian source package, built as its tree says: `./configure && make`
(after `autoreconf -fi` where only configure.ac is shipped) or CMake.
"""

from __future__ import annotations

import os
import socket
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path

from mlgo.corpus.wrappers import build_env
from mlgo.errors import UsageError
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import Recipe, available_recipes, load_recipe
from mlgo.programs.build import (
    Variant,
    cleaned,
    policy_service,
    pristine_source,
    scratch_copy,
)
from mlgo.programs.compare import variants
from mlgo.programs.measure import (
    children_cpu,
    in_percent,
    paired_change,
    round_order,
    tree_cpu_seconds,
)
from mlgo.runtime.commands import BuildError, run_logged
from mlgo.serve.native_wrapper import install_native_wrappers

AUTOTOOLS_CONFIGURE = 'CC="$CC" CXX="$CXX" ./configure'
CMAKE_CONFIGURE = (
    'cmake -S . -B build -DCMAKE_C_COMPILER="$CC" -DCMAKE_CXX_COMPILER="$CXX" '
    "-DCMAKE_BUILD_TYPE=Release"
)


@dataclass(frozen=True)
class Package:
    """How to build a package, and how to clean its tree for a rebuild (CLEAN: shell lines
    as a user runs them; none: every object, archive and program removed, `cleaned`)."""

    recipe: Recipe
    clean: tuple[str, ...] = ()


def detected(name: str, tree: Path) -> Package:
    """The build of the Debian source NAME unpacked at TREE, as its files say: autotools
    (configure, or configure.ac to autoreconf) or CMake; `make clean` or CMake's clean."""
    if (tree / "configure").is_file() or (tree / "configure.ac").is_file():
        configure = [AUTOTOOLS_CONFIGURE]
        if not (tree / "configure").is_file():
            configure.insert(0, "autoreconf -fi")
        return Package(
            Recipe(name, name, ("make -j2",), configure=tuple(configure)), ("make clean",)
        )
    if (tree / "CMakeLists.txt").is_file():
        build, clean = "cmake --build build -j2", "cmake --build build --target clean"
        return Package(Recipe(name, name, (build,), configure=(CMAKE_CONFIGURE,)), (clean,))
    raise UsageError(f"{tree}: no configure, configure.ac or CMakeLists.txt to build {name} by")


def package(name: str, work: Path) -> tuple[Package, Path]:
    """NAME's recipe, or the build its Debian source's tree shows, and that pristine tree
    (fetched into WORK once)."""
    if name in available_recipes():
        recipe = load_recipe(name)
        return Package(recipe), pristine_source(recipe, work)
    pristine = pristine_source(Recipe(name, name, ()), work)
    return detected(name, pristine), pristine


def service_pid(socket_file: Path) -> int:
    """The pid of the process answering on SOCKET_FILE (SO_PEERCRED of a connection)."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.connect(str(socket_file))
        creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[0]


@dataclass
class Timed:
    """Seconds of one step: wall, CPU of the build's processes, CPU of the service."""

    wall: float
    cpu: float
    service_cpu: float

    @property
    def total_cpu(self) -> float:
        return self.cpu + self.service_cpu


def timed(
    commands: tuple[str, ...],
    tree: Path,
    env: dict,
    log: Path,
    what: str,
    timeout_s: float,
    service: int | None,
) -> Timed:
    """COMMANDS run in TREE, one after another, timed; SERVICE's CPU over the same span."""
    service_start = tree_cpu_seconds(service) if service else 0.0
    start, cpu_start = time.monotonic(), children_cpu()
    for cmd in commands:
        run_logged(cmd, tree, log, timeout_s, env, what)
    wall, cpu = time.monotonic() - start, children_cpu() - cpu_start
    return Timed(wall, cpu, (tree_cpu_seconds(service) if service else 0.0) - service_start)


def first_and_rebuild(
    pkg: Package,
    pristine: Path,
    tree: Path,
    tc: Toolchain,
    variant: Variant,
    flags: list[str],
    service: int | None,
    between: Callable[[], None] = lambda: None,
) -> tuple[Timed, Timed]:
    """VARIANT's first build of a fresh copy of PRISTINE at TREE (configure and build), then
    (after BETWEEN) its rebuild after cleaning, in the same tree with the same environment."""
    tree = tree.resolve()
    scratch_copy(pristine, tree)
    cc, cxx = variant.compilers
    (tree.parent / "bin").mkdir()
    env = build_env(tc, tree.parent / "bin", flags, cc=cc, cxx=cxx) | variant.env
    log, r = tree.parent / "build.log", pkg.recipe
    name, timeout = f"{r.name} ({variant.name})", r.build_timeout_s
    first = timed((*r.configure, *r.build), tree, env, log, f"{name}: build", timeout, service)
    between()
    if pkg.clean:
        for cmd in pkg.clean:
            run_logged(cmd, tree, log, timeout, env, f"{name}: clean")
    else:
        cleaned(r, tree)
    again = timed(r.build, tree, env, log, f"{name}: rebuild", timeout, service)
    return first, again


def changes(ours: list[float], base: list[float]) -> dict:
    """OURS against BASE, round by round: median and IQR in percent."""
    if len(ours) != len(base) or not ours or min(base) <= 0:
        raise BuildError("no paired rounds to compare")
    return in_percent(paired_change(ours, base))


def load_now() -> str:
    """The load averages (1, 5, 15 minutes), as `uptime` shows them."""
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


BUILDS = ("plain", "plain A/A", "mlgo-cc")  # the A/A: plain again, in a tree of its own
STEPS = ("first", "rebuild")
CLOCKS = ("wall", "cpu")  # cpu: the build's processes and the service's


def counting_clang(tc: Toolchain, directory: Path) -> tuple[Path, Path]:
    """An MLGO_CC in DIRECTORY that runs clang and logs each run, `plugin` or `plain`."""
    directory.mkdir(parents=True, exist_ok=True)
    log, clang = directory / "runs.log", directory / "clang"
    log.write_text("")
    how = 'case "$*" in *-fpass-plugin=*) echo plugin;; *) echo plain;; esac'
    clang.write_text(f'#!/bin/sh\n{how} >> {log}\nexec {tc.clang} "$@"\n')
    clang.chmod(0o755)
    return clang, log


def runs(log: Path) -> dict[str, int]:
    words = log.read_text().split()
    return {kind: words.count(kind) for kind in ("plugin", "plain")}


def bench(
    name: str, work: Path, policies: list[Path], rounds: int, flags: list[str], tc: Toolchain
) -> dict:
    """ROUNDS rounds (the order of BUILDS flips and turns round by round) of NAME's first
    build in a fresh tree and its rebuild there, each build with FLAGS: wall and CPU
    seconds; then one more mlgo-cc build and rebuild with a clang that counts its runs.
    mlgo-cc is the native wrapper built from this checkout, which the service expects."""
    pkg, pristine = package(name, work)
    stamp = time.strftime("%Y%m%d-%H%M%S")  # a fresh tree, so a cold memory, each round
    seconds = {s: {c: {b: [] for b in BUILDS} for c in CLOCKS} for s in STEPS}
    loads = []
    with policy_service(policies, work / "service") as service_env:
        pid = service_pid(Path(service_env["MLGO_SOCKET"]))
        plain, served = variants(tc, service_env, ("plain", "mlgo-cc"))
        (work / "wrappers").mkdir(parents=True, exist_ok=True)
        cc, cxx = install_native_wrappers(work / "wrappers")  # this checkout's, as the service
        served = replace(served, compilers=(str(cc), str(cxx)))
        by_name = {"plain": plain, "plain A/A": replace(plain, name="plain A/A"), "mlgo-cc": served}
        for r in range(rounds):
            for b in round_order(r, BUILDS):
                tree = work / f"{stamp}-{r}-{BUILDS.index(b)}" / "src"
                both = first_and_rebuild(pkg, pristine, tree, tc, by_name[b], flags, pid)
                for step, t in zip(STEPS, both, strict=True):
                    seconds[step]["wall"][b].append(t.wall)
                    seconds[step]["cpu"][b].append(t.total_cpu)
            loads.append(load_now())
        clang, log = counting_clang(tc, work / f"{stamp}-count")
        counted = replace(served, env=dict(served.env, MLGO_CC=str(clang)))
        tree = work / f"{stamp}-counted" / "src"
        clang_runs: dict[str, dict[str, int]] = {}
        first_and_rebuild(
            pkg,
            pristine,
            tree,
            tc,
            counted,
            flags,
            None,
            lambda: clang_runs.update(first=runs(log)),
        )
        clang_runs["rebuild"] = {k: n - clang_runs["first"][k] for k, n in runs(log).items()}
    return {
        "package": name,
        "recipe": name in available_recipes(),
        "configure": list(pkg.recipe.configure),
        "build": list(pkg.recipe.build),
        "clean": list(pkg.clean),
        "seconds": seconds,
        "against_plain": {
            s: {
                c: {b: changes(seconds[s][c][b], seconds[s][c]["plain"]) for b in BUILDS[1:]}
                for c in CLOCKS
            }
            for s in STEPS
        },
        "clang_runs": clang_runs,
        "load_after_rounds": loads,
    }
