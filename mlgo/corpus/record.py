"""`mlgo corpus record`: a corpus from the user's own build, or from their compilation database.

`record` runs their build command as it is, in their tree, with CC/CXX set to the
recording wrappers (`wrappers.build_env`), so nothing in their build files changes; a build
system that fixes its compiler at configure time must be configured inside the recorded
command too, and one that runs `gcc` or `cc` by name finds the wrappers first on PATH. The
wrappers log each call themselves (`extract.logged_invocations`) rather than running under
Debian's `bear`: bear sends every intercepted command line through protobuf, which takes
UTF-8 only, so one source whose file name is not UTF-8 failed the whole recorded build (and
bear's wrapper mode puts its own `ld` first on PATH, which breaks links). Objects another
compiler wrote in the tree are found by looking for new objects without bitcode.
`record_from` recompiles the entries of an existing compile_commands.json with the
recording flags into a private directory, leaving their build tree alone. Both name each
module by its source's path under SOURCE_DIR, so a module's package is the top-level
directory its source is in (or the one `--package`), and both publish the corpus at OUT in
one rename, after LLVM's `extract_ir` succeeded.

`record(stage=...)` records the build's LTO links instead (`lto.py`): for full LTO one
module per program or shared library, the merged module lld's LTO optimizes, named by the
output's path under SOURCE_DIR; for ThinLTO each backend's module, under that name; in a
corpus of that stage.
"""

from __future__ import annotations

import hashlib
import math
import os
import shlex
import shutil
import subprocess
import time
from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

from mlgo.corpus.extract import (
    NO_BITCODE,
    distinct_modules,
    extract_modules,
    logged_compiles,
    logged_invocations,
    objects_without_bitcode,
)
from mlgo.corpus.format import DESCRIPTION, write_description
from mlgo.corpus.lto import Link, logged_links, lto_flags, write_link_modules
from mlgo.corpus.wrappers import RECORD_FLAGS, build_env
from mlgo.llvm.cmdline import without_outputs
from mlgo.llvm.driver import suffix_language
from mlgo.llvm.toolchain import Toolchain
from mlgo.runtime.commands import BuildError, run_logged
from mlgo.runtime.files import atomic_directory, cache_subdir
from mlgo.runtime.inputs import read_json
from mlgo.runtime.messages import error_line

# A database written for gcc may carry warning options clang lacks, and -Werror with them.
_FROM_FLAGS = ["-Wno-error", "-Wno-unknown-warning-option"]


@dataclass
class Recorded:
    """What a recording wrote, and one line for each thing it could not record."""

    out: Path
    packages: dict[str, int]
    skipped: list[str] = field(default_factory=list)

    @property
    def modules(self) -> int:
        return sum(self.packages.values())


def work_dir(out: Path) -> Path:
    """Where a recording into OUT keeps its wrappers, log and objects: the user cache, by
    OUT's path. Kept after the run: a build configured under `record` names the wrappers."""
    key = hashlib.sha256(str(out.resolve()).encode()).hexdigest()[:16]
    return cache_subdir("record") / key


def record(
    build_argv: list[str],
    out: Path,
    tc: Toolchain,
    source_dir: Path | None = None,
    package: str | None = None,
    opt_level: str = "-Oz",
    timeout_s: float | None = None,
    stage: str = "compile",
    flags: Sequence[str] = (),
) -> Recorded:
    """Runs BUILD_ARGV in SOURCE_DIR (default: here) with CC/CXX recording bitcode at
    OPT_LEVEL (and FLAGS, such as a profile's) and logging their calls, and writes the
    corpus of what they compiled to OUT
    (the module doc says why not under bear), or at a link STAGE, of what they linked with
    that kind of LTO.
    A source whose name is not UTF-8, an object another compiler wrote in the tree and a link
    that could not be replayed are each one line of the result's `skipped`."""
    if not build_argv:
        raise BuildError("no build command to record (give it after `--`)")
    src, work = _prepare(out, source_dir, package)
    log, calls_log = work / "build.log", work / "calls"
    shutil.rmtree(calls_log, ignore_errors=True)
    calls_log.mkdir()
    lto = stage != "compile"
    recording = lto_flags(stage) if lto else RECORD_FLAGS
    env = build_env(tc, work, [opt_level, *flags, *recording], log_dir=calls_log)
    what = f"{shlex.join(build_argv)} (in {src})"
    started = math.floor(time.time())  # a file system's times may be whole seconds
    try:
        run_logged(build_argv, src, log, timeout_s, env, what)
        calls = logged_invocations(calls_log)
    finally:
        shutil.rmtree(calls_log, ignore_errors=True)
    compiles = [] if lto else logged_compiles(calls)  # LTO's objects are bitcode, not ELF
    others = [
        f"{_shown(obj)}: {NO_BITCODE}, not recorded"
        for obj in objects_without_bitcode(src, started, {c.obj.resolve() for c in compiles})
    ]
    if lto:
        links = logged_links(calls, stage)
        return _publish_links(links, out, tc, src, package, opt_level, stage, others, timeout_s)
    if not compiles and not others:
        raise BuildError(
            f"{src}: the build compiled no object file that survived it "
            "(an up-to-date build compiles nothing: record a clean one)"
        )
    pairs = [(c.source, c.obj) for c in compiles]
    return _publish(pairs, [], out, tc, src, package, others)


def record_from(
    database: Path,
    out: Path,
    tc: Toolchain,
    source_dir: Path | None = None,
    package: str | None = None,
    opt_level: str = "-Oz",
    timeout_s: float = 600.0,
) -> Recorded:
    """Recompiles every C/C++ entry of the compilation database DATABASE with its own
    command line, clang and the recording flags at OPT_LEVEL (in its own directory, its
    object written to a private one) and writes their corpus to OUT. Entries that are not
    C or C++ or fail to compile are named in the result's `skipped`."""
    entries = _read_database(database)
    src, work = _prepare(out, source_dir, package)
    objects = work / "objects"
    shutil.rmtree(objects, ignore_errors=True)
    objects.mkdir(parents=True)
    jobs, skipped = [], []
    for i, entry in enumerate(entries):
        where = f"{database}: entry {i}"
        if not isinstance(entry, dict) or not isinstance(entry.get("directory"), str):
            skipped.append(f"{where}: no 'directory', not recorded")
            continue
        argv = _entry_argv(entry)
        if not argv or not isinstance(entry.get("file"), str):
            skipped.append(f"{where}: no 'file' and command line, not recorded")
            continue
        source = Path(entry["directory"]) / entry["file"]
        language = suffix_language(source.name)
        if language is None:
            skipped.append(f"{source}: not C or C++, not recorded")
            continue
        clang = tc.clangxx if language == "c++" else tc.clang
        obj = objects / f"{i}.o"
        # Nothing written into the user's build tree: no -o there, no dependency file.
        kept = [a for a in without_outputs(argv[1:]) if a != "-c"]
        cmd = [clang, *kept, "-c", "-o", str(obj), opt_level]
        jobs.append((source, obj, Path(entry["directory"]), [*cmd, *RECORD_FLAGS, *_FROM_FLAGS]))

    def compile_one(job: tuple[Path, Path, Path, list[str]]) -> str | None:
        source, _, directory, cmd = job
        try:
            r = subprocess.run(
                cmd,
                cwd=directory,
                capture_output=True,
                text=True,
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired:
            return f"{source}: compile timed out after {timeout_s:g} s, not recorded"
        except OSError as e:
            return f"{source}: cannot compile in {directory} ({e.strerror}), not recorded"
        if r.returncode != 0:
            return f"{source}: compile failed ({error_line(r.stderr, 200)}), not recorded"
        return None

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        failures = list(pool.map(compile_one, jobs))
    skipped += [f for f in failures if f]
    compiled = [(j[0], j[1]) for j, f in zip(jobs, failures, strict=True) if not f]
    return _publish(compiled, skipped, out, tc, src, package)


def _read_database(database: Path) -> list:
    try:
        entries = read_json(database, BuildError)
    except FileNotFoundError as e:
        raise BuildError(f"{database}: not found") from e
    except OSError as e:
        raise BuildError(f"{database}: not a compilation database ({error_line(e)})") from e
    if not isinstance(entries, list) or not entries:
        raise BuildError(f"{database}: not a compilation database (needs a non-empty list)")
    return entries


def _entry_argv(entry: dict) -> list[str]:
    args = entry.get("arguments")
    if isinstance(args, list) and all(isinstance(a, str) for a in args):
        return args
    command = entry.get("command")
    try:
        return shlex.split(command) if isinstance(command, str) else []
    except ValueError:  # unbalanced quotes
        return []


def _prepare(out: Path, source_dir: Path | None, package: str | None) -> tuple[Path, Path]:
    """The resolved source directory and the work directory, once the arguments are sane:
    OUT must be new, empty or a corpus (which is replaced), never a directory of other
    files, which replacing it would delete."""
    src = (source_dir or Path.cwd()).resolve()
    if not src.is_dir():
        raise BuildError(f"{src}: source directory not found")
    if package is not None and (not package or "/" in package or package in (".", "..")):
        raise BuildError(f"--package {package!r}: must be a plain directory name")
    new_or_empty = not out.exists() or (out.is_dir() and not any(out.iterdir()))
    if not new_or_empty and not (out / DESCRIPTION).is_file():
        raise BuildError(f"{out}: exists and is not a corpus; choose another --out")
    work = work_dir(out)
    work.mkdir(mode=0o700, exist_ok=True)
    (work / "build.log").write_text("")
    return src, work


def _module_names(
    compiles: list[tuple[Path, Path]], src: Path, package: str | None, skipped: list[str]
) -> dict[str, Path]:
    """Module name -> object (`extract.distinct_modules`): the source's path under SRC (its
    first directory is its package), under PACKAGE if given. A file at SRC's top is in the
    package named after SRC. A skipped object is named in SKIPPED."""
    named = []
    for source, obj in compiles:
        name = _module_name(source, src, package, skipped, obj)
        if name:
            named.append((name, obj))
    return distinct_modules(named, skipped)


def _module_name(
    path: Path, src: Path, package: str | None, skipped: list[str], *also: Path
) -> str | None:
    """The name of the module of PATH (a source, or a linked output): its path under SRC,
    whose first directory is its package, under PACKAGE if given; a file at SRC's top is in
    the package named after SRC. None, with a line in SKIPPED, when PATH is outside SRC or
    PATH or one of ALSO is not UTF-8 (extract_ir and the corpus's JSON take only that)."""
    not_utf8 = [p for p in (path, *also) if _shown(p) != str(p)]
    if not_utf8:
        skipped.append(f"{_shown(not_utf8[0])}: its file name is not UTF-8, not recorded")
        return None
    try:
        rel = path.resolve().relative_to(src)
    except ValueError:
        skipped.append(f"{path}: outside the source directory {src}, not recorded")
        return None
    return module_name(rel, src.name, package)


def module_name(rel: Path, top: str, package: str | None = None) -> str:
    """The corpus's name of the module of REL, a path under the recorded tree named TOP:
    REL, whose first directory is its package, under PACKAGE if given; a file at the top is
    in the package named TOP."""
    prefix = package or (top if len(rel.parts) == 1 else "")
    return f"{prefix}/{rel}" if prefix else str(rel)


def _shown(path: Path) -> str:
    """PATH as a line can print it: a byte that is not UTF-8 as \\xNN."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


def nothing_recorded(skipped: list[str]) -> str:
    """Why a recording found no module: the first object it skipped, and the usual cause
    when no object carries bitcode, a build that does not compile with $CC and $CXX."""
    if not skipped:
        return "the build compiled no C or C++ file (an up-to-date build compiles nothing)"
    why = f"{len(skipped)} objects skipped, the first: {skipped[0]}"
    if all(NO_BITCODE in s for s in skipped):
        why += '; a build that runs its compiler by path needs `make -e` or `make CC="$CC"`'
    return why


def _publish(
    compiles: list[tuple[Path, Path]],
    skipped: list[str],
    out: Path,
    tc: Toolchain,
    src: Path,
    package: str | None,
    unrecorded: list[str] | None = None,
) -> Recorded:
    """Extracts the modules of COMPILES' objects with LLVM's extract_ir into OUT, replacing
    it only once that succeeded. SKIPPED, the lines of those left out, gets UNRECORDED's
    after those of COMPILES."""
    work = work_dir(out)
    log = work / "build.log"
    names = _module_names(compiles, src, package, skipped)
    skipped += unrecorded or []
    if not names:
        raise BuildError(f"{src}: nothing to record ({nothing_recorded(skipped)}; log: {log})")
    with atomic_directory(out) as staged:
        modules = extract_modules(names, staged, tc, work, log, str(src))
    return Recorded(out, dict(Counter(m.split("/", 1)[0] for m in modules)), skipped)


def _publish_links(
    links: list[Link],
    out: Path,
    tc: Toolchain,
    src: Path,
    package: str | None,
    opt_level: str,
    stage: str,
    unrecorded: list[str],
    timeout_s: float | None,
) -> Recorded:
    """Writes the modules of each of LINKS (`lto.write_link_modules`, each replayed within
    TIMEOUT_S), named by its output, into OUT as a corpus of the link STAGE, replacing OUT
    only once that succeeded. The result's `skipped` lists the links left out, then
    UNRECORDED."""
    work = work_dir(out)
    log = work / "build.log"
    skipped: list[str] = []
    named = {}
    for link in links:
        name = _module_name(link.output, src, package, skipped)
        if name:
            named[name] = link
    if not named:
        why = (
            f"{len(skipped)} links skipped, the first: {skipped[0]}"
            if skipped
            else "the build linked no program or shared library from bitcode objects "
            "(an up-to-date build links nothing: record a clean one)"
        )
        raise BuildError(f"{src}: nothing to record ({why}; log: {log})")
    with atomic_directory(out) as staged:
        names = write_link_modules(named, staged, tc, opt_level, work, skipped, stage, timeout_s)
        if not names:
            raise BuildError(f"{src}: no link could be replayed, the first: {skipped[0]}")
        write_description(staged, names, stage=stage)
    return Recorded(out, dict(Counter(m.split("/", 1)[0] for m in names)), skipped + unrecorded)
