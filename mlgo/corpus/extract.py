"""`mlgo corpus build`: real Debian source packages -> a corpus of bitcode modules.

For each package: fetch its source with `apt-get source`, build it with its own build
system under Debian's `bear` (compile_commands.json) with a compiler wrapper that adds
`-Xclang -fembed-bitcode=all` (pre-optimization bitcode and the cc1 command line go into
each object), then let LLVM's own `extract_ir` (PyPI's mlgo-utils) pull them out. A
package that fails is reported with the tail of its build log and the others go on.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
import tomllib
from dataclasses import dataclass
from pathlib import Path

from elftools.common.exceptions import ELFError
from elftools.elf.elffile import ELFFile

from mlgo import data as shipped
from mlgo.corpus.format import DESCRIPTION, CorpusError, write_description
from mlgo.llvm.toolchain import Toolchain
from mlgo.runtime.files import atomic_directory, atomic_write_text
from mlgo.runtime.messages import copy_error, error_line, writing

RECIPES = shipped.recipes_dir()
MLGO_UTILS_DIR = Path(sys.prefix) / "mlgo-utils"  # installed by tools/setup.sh


class BuildError(RuntimeError):
    """A package could not be fetched, built or extracted; the message is one line."""


@dataclass(frozen=True)
class Recipe:
    name: str
    source: str
    build: tuple[str, ...]
    build_depends: tuple[str, ...] = ()
    configure: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()
    test: tuple[str, ...] = ()
    test_timeout_s: float = 600.0
    build_timeout_s: float = 1800.0
    # a workload for throughput: shell lines that make its input in the built tree, the
    # commands timed (argv, no shell), and a shell line that checks their result
    bench_prepare: tuple[str, ...] = ()
    bench: tuple[str, ...] = ()
    bench_check: str = "true"


def available_recipes() -> list[str]:
    return sorted(p.stem for p in RECIPES.glob("*.toml"))


def _recipe_path(name: str, recipes_dir: Path) -> Path:
    """A recipe by its own name (`lua`) or by its Debian source package (`lua5.4`)."""
    path = recipes_dir / f"{name}.toml"
    if path.is_file():
        return path
    for candidate in sorted(recipes_dir.glob("*.toml")):
        if re.search(rf'^source\s*=\s*"{re.escape(name)}"', candidate.read_text(), re.M):
            return candidate
    raise BuildError(
        f"no recipe {path.name} in {recipes_dir} (have: {', '.join(available_recipes())})"
    )


def load_recipe(name: str, recipes_dir: Path = RECIPES) -> Recipe:
    path = _recipe_path(name, recipes_dir)
    name = path.stem
    try:
        d = tomllib.loads(path.read_text())
        return Recipe(
            name=name,
            source=d["source"],
            build=tuple(d["build"]),
            build_depends=tuple(d.get("build_depends", ())),
            configure=tuple(d.get("configure", ())),
            programs=tuple(d.get("programs", ())),
            test=tuple(d.get("test", ())),
            test_timeout_s=float(d.get("test_timeout_s", 600)),
            build_timeout_s=float(d.get("build_timeout_s", 1800)),
            bench_prepare=tuple(d.get("bench_prepare", ())),
            bench=tuple(d.get("bench", ())),
            bench_check=str(d.get("bench_check", "true")),
        )
    except (tomllib.TOMLDecodeError, KeyError, TypeError, ValueError) as e:
        raise BuildError(f"{path}: bad recipe ({e})") from e


def run_logged(
    cmd: list[str] | str,
    cwd: Path,
    log: Path,
    timeout_s: float | None,
    env: dict[str, str] | None = None,
    what: str = "",
) -> None:
    """Runs CMD (a shell line if a string) with its output appended to LOG; a failure or
    timeout is a BuildError naming WHAT and the line of this command's output that says why
    (not the `$ CMD` line logged before it: a command is not its error)."""
    with open(log, "a", errors="surrogateescape") as f:  # a file name need not be UTF-8
        with writing(log):
            f.write(f"\n$ {cmd if isinstance(cmd, str) else shlex.join(cmd)}\n")
            f.flush()
        start = f.tell()
        try:
            proc = subprocess.run(
                cmd,
                cwd=cwd,
                stdout=f,
                stderr=subprocess.STDOUT,
                env=env,
                shell=isinstance(cmd, str),
                timeout=timeout_s,
                stdin=subprocess.DEVNULL,
            )
        except subprocess.TimeoutExpired as e:
            raise BuildError(f"{what or cmd} timed out after {timeout_s:g} s (log: {log})") from e
    if proc.returncode != 0:
        output = log.read_bytes()[start:].decode(errors="replace")
        raise BuildError(f"{what or cmd} failed ({error_line(output, 200)}; log: {log})")


def run_tests(recipe: Recipe, tree: Path, log: Path, env: dict[str, str] | None, what: str) -> None:
    """Every test line of RECIPE in TREE, logged to LOG; the first that fails raises
    BuildError naming WHAT."""
    for cmd in recipe.test:
        run_logged(cmd, tree, log, recipe.test_timeout_s, env, what)


def ensure_build_depends(recipe: Recipe, log: Path) -> None:
    missing = [
        p
        for p in recipe.build_depends
        if subprocess.run(["dpkg", "-s", p], capture_output=True).returncode != 0
    ]
    if not missing:
        return
    if os.geteuid() != 0:
        raise BuildError(
            f"{recipe.name} needs Debian packages {' '.join(missing)}; install them as root"
        )
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    run_logged(
        ["apt-get", "install", "-y", "-q", *missing],
        Path("/"),
        log,
        900,
        env,
        f"apt-get install {' '.join(missing)}",
    )


def _source_versions(source: str) -> list[str]:
    out = subprocess.run(["apt-cache", "showsrc", source], capture_output=True, text=True)
    versions = re.findall(r"^Version: (\S+)$", out.stdout, re.M)
    return list(dict.fromkeys(versions))


def fetch_source(recipe: Recipe, work: Path, log: Path) -> Path:
    """Downloads and unpacks the Debian source package; returns the source tree.

    When the newest version cannot be downloaded (a security update whose files the
    mirror lacks), the other versions apt knows are tried in turn.
    """
    dl = work / "download"
    if not any(dl.glob(f"{recipe.source}_*.dsc")):
        shutil.rmtree(dl, ignore_errors=True)
        dl.mkdir(parents=True)
        what = f"apt-get source {recipe.source} (is deb-src enabled? run tools/setup.sh)"
        try:
            run_logged(
                ["apt-get", "source", "--download-only", recipe.source], dl, log, 900, what=what
            )
        except BuildError:
            for version in _source_versions(recipe.source):
                try:
                    run_logged(
                        ["apt-get", "source", "--download-only", f"{recipe.source}={version}"],
                        dl,
                        log,
                        900,
                        what=what,
                    )
                    break
                except BuildError:
                    continue
            else:
                raise
    dsc = sorted(dl.glob(f"{recipe.source}_*.dsc"))[-1]
    src = work / "src"
    shutil.rmtree(src, ignore_errors=True)
    run_logged(
        ["dpkg-source", "--no-check", "-x", str(dsc), str(src)],
        dl,
        log,
        600,
        what=f"dpkg-source -x {dsc.name}",
    )
    return src


def write_wrapper(path: Path, compiler: str, flags: list[str], log_dir: Path | None = None) -> Path:
    """A CC wrapper: the package's own flags, then ours (the last -O and -g win). With
    LOG_DIR, each call first leaves its directory and arguments in a file there (NUL after
    each: they are bytes, not necessarily UTF-8; read by `logged_compiles`) while LOG_DIR
    exists, and fails if it cannot: a compile left out would be a corpus silently short.
    Once LOG_DIR is gone, a build configured under `record` still compiles with it."""
    log = ""
    if log_dir is not None:
        where, template = shlex.quote(str(log_dir)), shlex.quote(str(log_dir / "XXXXXXXX"))
        log = (
            f"if [ -d {where} ]; then\n"
            f'  log=$(mktemp {template}) && printf \'%s\\0\' "$(pwd -P)" "$@" >"$log" || exit 1\n'
            "fi\n"
        )
    path.write_text(
        f"#!/bin/sh\n{log}exec " + shlex.join([compiler]) + ' "$@" ' + shlex.join(flags) + "\n"
    )
    path.chmod(0o755)
    return path


# Appended to the package's own flags, so the recorded level is ours whatever the package asks.
RECORD_FLAGS = ["-g0", "-Xclang", "-fembed-bitcode=all", "-Qunused-arguments"]


BINUTILS = ("ar", "ranlib", "nm")


def build_env(
    tc: Toolchain,
    work: Path,
    flags: list[str],
    cc: str | None = None,
    cxx: str | None = None,
    log_dir: Path | None = None,
) -> dict[str, str]:
    """The environment of a package build: CC/CXX wrappers adding FLAGS to the compilers
    (default: the toolchain's clang), logging their compiles to LOG_DIR if given
    (`write_wrapper`), and LLVM's binutils."""
    cc, cxx = cc or tc.clang, cxx or tc.clangxx
    cc_wrapper = write_wrapper(work / "cc", cc, flags, log_dir)
    cxx_wrapper = write_wrapper(work / "c++", cxx, flags, log_dir)
    # GNU ar/nm would index these objects through an older LLVM's bfd plugin, which
    # chokes on the embedded bitcode and leaves archives without symbols: use LLVM's,
    # also where a Makefile names `ar` itself instead of $(AR).
    binutils = work / "binutils"
    binutils.mkdir(exist_ok=True)
    for name in BINUTILS:
        link = binutils / name
        link.unlink(missing_ok=True)
        link.symlink_to(tc.tool(f"llvm-{name}"))  # LLVM's tools act by the name they run as
    return dict(
        os.environ,
        CC=str(cc_wrapper),
        CXX=str(cxx_wrapper),
        LC_ALL="C",
        AR=str(binutils / "ar"),
        RANLIB=str(binutils / "ranlib"),
        NM=str(binutils / "nm"),
        PATH=f"{binutils}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
    )


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
) -> Built:
    """Fetches and builds one Debian package at OPT_LEVEL; writes its corpus to OUT/NAME.
    With PROFILE, the recorded modules carry the counts of the package's own tests.

    The finished corpus is kept in WORK with a stamp of everything that made it, so that
    rebuilding a split only builds the packages that failed, changed or are new.
    """
    work = work.resolve()
    work.mkdir(parents=True, exist_ok=True)
    finished, stamp = work / "finished", work / "finished.stamp"
    key = hashlib.sha256(repr((recipe, opt_level, profile, tc.describe())).encode()).hexdigest()
    reused = stamp.is_file() and stamp.read_text() == key and (finished / recipe.name).is_dir()
    skipped: list[str] = []
    if not reused:
        stamp.unlink(missing_ok=True)
        log = work / "build.log"
        log.write_text("")
        ensure_build_depends(recipe, log)
        src = fetch_source(recipe, work, log)
        profdata = profile_own_tests(recipe, src, tc, work, opt_level) if profile else None
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
    modules = json.loads((finished / recipe.name / DESCRIPTION).read_text())["modules"]
    return Built(len(modules), reused, tuple(skipped))


# clang's warnings that some functions have no counts (the tests never ran them) are expected.
PROFILE_USE_FLAGS = ["-Wno-profile-instr-unprofiled", "-Wno-profile-instr-out-of-date"]


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
    flags = [opt_level, "-g0", "-fprofile-instr-generate", "-Qunused-arguments"]
    env = build_env(tc, bin_dir, flags)
    what = f"{recipe.name} (instrumented)"
    for cmd in recipe.configure:
        run_logged(cmd, tree, log, recipe.build_timeout_s, env, f"{what}: configure")
    for cmd in recipe.build:
        run_logged(cmd, tree, log, recipe.build_timeout_s, env, f"{what}: build")
    env["LLVM_PROFILE_FILE"] = str(raw / "%m-%p.profraw")
    run_tests(recipe, tree, log, env, f"{what}: its own tests")
    profiles = sorted(raw.glob("*.profraw"))
    if not profiles:
        raise BuildError(f"{what}: its tests ran no instrumented code (log: {log})")
    merged, tmp = work / "profile.profdata", work / ".profile.profdata.tmp"
    merge = [tc.tool("llvm-profdata"), "merge", "-o", str(tmp), *map(str, profiles)]
    run_logged(merge, work, log, 600, what=f"{what}: llvm-profdata merge")
    tmp.replace(merged)
    return merged


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
        flags += [f"-fprofile-instr-use={profile.resolve()}", *PROFILE_USE_FLAGS]
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


def _bitcode_digest(obj: Path) -> str | None:
    """The hash of OBJ's embedded bitcode, or None if it has none."""
    try:
        with open(obj, "rb") as f:
            section = ELFFile(f).get_section_by_name(".llvmbc")
            return hashlib.sha256(section.data()).hexdigest() if section else None
    except (OSError, ELFError):
        return None


NO_BITCODE = "no bitcode (not compiled by the recording CC/CXX, or not C/C++)"


def distinct_modules(named: list[tuple[str, Path]], skipped: list[str]) -> dict[str, Path]:
    """Module name -> object, from (wanted name, object) pairs: one module per distinct
    bitcode (a file compiled twice the same way is kept once, under its shortest name), and
    a name wanted twice for different bitcode (a library's PIC and static copies of one
    source) gets `.2`, `.3`... in the order of the objects' paths, so names do not depend on
    the order a parallel build ran in. An object without bitcode is named in SKIPPED."""
    names: dict[str, Path] = {}
    seen: set[str] = set()
    for base, obj in sorted(named, key=lambda n: (n[0].count("/"), n[0], str(n[1]))):
        digest = _bitcode_digest(obj)
        if digest is None:
            skipped.append(f"{obj}: {NO_BITCODE}, not recorded")
            continue
        if digest in seen:
            continue
        seen.add(digest)
        name, n = base, 1
        while name in names:
            n += 1
            name = f"{base}.{n}"
        names[name] = obj
    return names


def extract_modules(
    modules: dict[str, Path], staged: Path, tc: Toolchain, work: Path, log: Path, what: str
) -> list[str]:
    """LLVM's extract_ir over MODULES (name -> object) into the corpus directory STAGED;
    returns the names it extracted (a BuildError if none).

    extract_ir names each module by its object's path as the build wrote it (an absolute
    one lands outside the corpus): link the objects under WORK by their module names."""
    if not MLGO_UTILS_DIR.is_dir():
        raise BuildError(
            f"LLVM's mlgo-utils is not installed in {MLGO_UTILS_DIR}; run tools/setup.sh"
        )
    linked = work / "modules"
    shutil.rmtree(linked, ignore_errors=True)
    entries = []
    for name, obj in modules.items():
        (linked / name).parent.mkdir(parents=True, exist_ok=True)
        (linked / name).symlink_to(obj.resolve())
        entries.append({"directory": str(linked), "file": name, "arguments": ["-o", name]})
    cc_json = work / "compile_commands.modules.json"
    atomic_write_text(cc_json, json.dumps(entries, indent=1))
    # mlgo-utils' top-level package is also called `mlgo`: run it without site-packages.
    run_logged(
        [
            sys.executable,
            "-S",
            "-m",
            "mlgo.corpus.extract_ir",
            "--input",
            str(cc_json),
            "--input_type",
            "json",
            "--output_dir",
            str(staged.resolve()),  # extract_ir runs in WORK, not where OUT was named
            "--llvm_objcopy_path",
            tc.tool("llvm-objcopy"),
            "--num_workers",
            str(min(8, os.cpu_count() or 2)),
        ],
        work,
        log,
        900,
        dict(os.environ, PYTHONPATH=str(MLGO_UTILS_DIR)),
        f"{what}: extract_ir",
    )
    try:
        names = _extracted_modules(staged)
    except (OSError, ValueError, KeyError) as e:
        raise BuildError(f"{what}: extract_ir wrote no corpus ({e}; log: {log})") from e
    if not names:
        raise BuildError(f"{what}: the build produced no bitcode (log: {log})")
    write_description(staged, names)  # a failure to write it is not extract_ir's
    return names


def _is_relocatable_object(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return ELFFile(f).header["e_type"] == "ET_REL"
    except (OSError, ELFError):
        return False


@dataclass(frozen=True)
class Compile:
    """One compile step of a recorded build: its source and the object it wrote."""

    source: Path
    obj: Path


def kept_compiles(recorded: Path) -> list[Compile]:
    """The compile commands of bear's RECORDED compile_commands.json whose output is a
    relocatable object that survived the build, one per object (`surviving`).

    bear also records the `clang -cc1` jobs of a compile-and-link step (their objects are
    deleted temporaries) and splits such a step into one `-c` entry per source, all naming
    the linked program as output; none of those is a module.
    """
    steps = []
    for entry in json.loads(recorded.read_text()):
        args = entry.get("arguments") or shlex.split(entry.get("command", ""))
        if "-cc1" not in args:
            steps.append((Path(entry["directory"]), args, entry["file"]))
    keep = surviving(steps)
    if not keep:
        raise BuildError(
            f"{recorded}: the build compiled no object file that survived it "
            "(an up-to-date build compiles nothing: record a clean one)"
        )
    return keep


# What a compiler driver compiles, by suffix: C, C++, Objective-C, preprocessed, assembly.
COMPILED_SUFFIXES = (
    *(".c", ".cc", ".cpp", ".cxx", ".c++", ".cp", ".C", ".CPP"),
    *(".m", ".mm", ".i", ".ii", ".s", ".S", ".sx"),
)
# Options whose value is the next argument and may look like a source.
_NAMES_A_FILE = {"-o", "-MF", "-MT", "-MQ", "-MJ", "-include", "-imacros", "-Xclang", "-x"}


def logged_compiles(log_dir: Path) -> list[Compile]:
    """The compiles the recording wrappers logged in LOG_DIR (`write_wrapper`) whose object
    survived the build, one per object (`surviving`). Each source of a `-c` call is one
    compile; a log cut short (a killed wrapper) is none. Paths keep their bytes
    (`os.fsdecode`), whatever their encoding."""
    steps = []
    for log in sorted(log_dir.iterdir()):
        fields = log.read_bytes().split(b"\0")
        if len(fields) < 3 or fields[-1] != b"":
            continue
        directory, args = Path(os.fsdecode(fields[0])), [os.fsdecode(a) for a in fields[1:-1]]
        if "-c" not in args:
            continue  # a link, or a preprocessing run
        steps += [
            (directory, args, a)
            for i, a in enumerate(args)
            if a.endswith(COMPILED_SUFFIXES)
            and not a.startswith("-")
            and (i == 0 or args[i - 1] not in _NAMES_A_FILE)
        ]
    return surviving(steps)


def objects_without_bitcode(tree: Path, since: float, known: set[Path]) -> list[Path]:
    """The relocatable objects without bitcode under TREE modified SINCE, but those in KNOWN
    (resolved): what a build wrote with a compiler other than the recording wrappers (a
    Makefile that sets CC itself, a compiler named by its path), in order."""
    found = []
    for directory, _, files in os.walk(tree):
        for name in files:
            obj = Path(directory, name)
            if not name.endswith((".o", ".obj")) or obj.resolve() in known:
                continue
            try:
                if obj.stat().st_mtime < since:
                    continue
            except OSError:  # gone meanwhile
                continue
            if _is_relocatable_object(obj) and _bitcode_digest(obj) is None:
                found.append(obj)
    return sorted(found)


def surviving(steps: list[tuple[Path, list[str], str]]) -> list[Compile]:
    """The (directory, arguments, source) compile STEPS whose object is a relocatable object
    file that survived the build, one per object. A `cc -c dir/x.c` without `-o` writes x.o
    in its working directory. An object its source was compiled to twice (with other flags
    the second time) holds the last compile's bitcode, and is one module; one that several
    sources claim (a compile-and-link step's program) is none."""
    compiles: dict[Path, Compile] = {}
    sources: dict[Path, set[Path]] = {}
    for directory, args, file in steps:
        source = directory / file
        if "-o" in args[:-1]:
            obj = directory / args[args.index("-o") + 1]
        elif "-c" in args:
            obj = directory / source.with_suffix(".o").name
        else:
            continue
        compiles[obj] = Compile(source, obj)
        sources.setdefault(obj, set()).add(source)
    return [
        c for c in compiles.values() if len(sources[c.obj]) == 1 and _is_relocatable_object(c.obj)
    ]


def _extracted_modules(corpus_dir: Path) -> list[str]:
    """The modules whose bitcode was really extracted (extract_ir lists failures too)."""
    desc = corpus_dir / DESCRIPTION
    return [
        n for n in json.loads(desc.read_text())["modules"] if (corpus_dir / f"{n}.bc").is_file()
    ]


def combine(out: Path) -> list[str]:
    """Writes OUT's corpus_description.json over every package sub-corpus in OUT."""
    names: list[str] = []
    for desc in sorted(out.glob(f"*/{DESCRIPTION}")):
        pkg = desc.parent.name
        if pkg.startswith("."):
            continue
        try:
            names += [f"{pkg}/{m}" for m in json.loads(desc.read_text())["modules"]]
        except (ValueError, KeyError) as e:
            raise CorpusError(f"{desc}: malformed ({e})") from e
    write_description(out, names)
    return names
