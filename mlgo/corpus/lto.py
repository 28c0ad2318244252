"""A corpus of LTO links: the modules lld's LTO optimizes (`mlgo corpus record --lto
full|thin`), and how a link-time policy's size is judged as the link makes it.

The recorded build runs with the wrappers adding `lto_flags`, so its compiles write bitcode
objects and its links run lld's LTO. Afterwards each logged link is replayed in its own
directory with lld's `--save-temps` and its output in a private directory, so nothing is
written into the user's tree.
- Full LTO: lld keeps the merged module after LTO's internalization, before its optimization
  pipeline, beside that output (MERGED_SUFFIX): one module per program or shared library.
- ThinLTO: lld keeps each backend's module after import beside that backend's input, so the
  replay sees its bitcode inputs through links in the private directory (`backend_modules`):
  one module per object of the link, named under the link's own name.
Each module, with the cc1 command line `clang OPT -c` runs on it (`cc1_args`), is a module
of a corpus of that stage. That compile runs clang's per-file pipeline, not the link's, so a
policy is judged by the link's own (`linked_texts`).
"""

from __future__ import annotations

import itertools
import os
import re
import shlex
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from mlgo.corpus.extract import Invocation
from mlgo.corpus.format import Corpus
from mlgo.llvm.cmdline import without_outputs
from mlgo.llvm.driver import COMPILED_SUFFIXES, link_output
from mlgo.llvm.sizes import text_size
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import STAGE_FLAGS
from mlgo.runtime.commands import BuildError
from mlgo.runtime.messages import error_line

# lld keeps the merged module after LTO's internalization beside the output under this name,
# and each ThinLTO backend's module after import beside its input under this suffix.
MERGED_SUFFIX = ".0.2.internalize.bc"
IMPORTED_SUFFIX = ".3.import.bc"
# lld's LTO optimizes at --lto-O2 unless told otherwise (clang's driver passes no other
# for -Os and -Oz); a ThinLTO backend runs this pipeline, then compiles as lld does.
THIN_BACKEND = ["-passes=thinlto<O2>"]
THIN_CODEGEN = ["-O2", "-filetype=obj", "-function-sections", "-data-sections"]
THIN_CODEGEN += ["-relocation-model=pic"]
# A driver call with one of these compiles, preprocesses or links relocatably: no program.
NOT_LINKS = {"-c", "-S", "-E", "-M", "-MM", "-fsyntax-only", "-r"}
# Where CMake and Meson keep the programs they build to probe the compiler (CompilerIdC/a.out,
# sanitycheckc.exe): not the project's.
PROBES = {"CMakeFiles", "meson-private"}
# Raw LLVM bitcode, and bitcode in its wrapper header.
_BITCODE_MAGIC = (b"BC\xc0\xde", b"\xde\xc0\x17\x0b")
_ARCHIVE_MAGIC = b"!<arch>\n"
# Linker options that write a file of their own (-Wl,-Map=FILE, -Wl,-Map,FILE), and the
# driver's own temporaries: a replay writes only into its private directory.
_LINKER_OUTPUTS = ("-Map", "--Map", "--dependency-file", "--why-extract", "--reproduce")
_DRIVER_TEMPS = ("-save-temps", "--save-temps")


def lto_flags(stage: str) -> list[str]:
    """Appended after the recorded level, as RECORD_FLAGS are for a corpus of files: the
    STAGE's own flags, as the builds a link-time policy is compared on get them."""
    return [*STAGE_FLAGS[stage], "-Qunused-arguments", "-g0"]


@dataclass(frozen=True)
class Link:
    """One link of a recorded build: where it ran, its arguments (compiler first), and the
    program or shared library it wrote."""

    cwd: Path
    argv: list[str]
    output: Path


def logged_links(invocations: list[Invocation], stage: str) -> list[Link]:
    """The links among a build's logged INVOCATIONS recorded for STAGE: calls that neither
    compile only nor preprocess and link at least one LLVM bitcode object that survived the
    build; for full LTO also a program compiled and linked in one call, whose sources and
    output survived it (replayed, it compiles them again; a ThinLTO backend's temporaries
    would land beside the driver's own). The build system's own probes are none (PROBES).
    An output linked twice is the last link's."""
    links: dict[Path, Link] = {}
    for call in invocations:
        args = call.argv[1:]
        inputs = [call.cwd / a for a in call.inputs()]
        output = Path(os.path.normpath(call.cwd / link_output(args)))
        sources = [p for p in inputs if p.name.endswith(COMPILED_SUFFIXES)]
        in_one = stage == "link" and output.is_file() and all(p.is_file() for p in sources)
        if (
            NOT_LINKS & set(args)
            or PROBES & set(output.parts)
            or not ((sources and in_one) or (not sources and any(map(_is_bitcode, inputs))))
        ):
            continue
        links.pop(output, None)  # keep the links in the order of their last run
        links[output] = Link(call.cwd, call.argv, output)
    return list(links.values())


def _is_bitcode(path: Path) -> bool:
    return _magic(path)[:4] in _BITCODE_MAGIC


def _is_archive(path: Path) -> bool:
    return _magic(path) == _ARCHIVE_MAGIC


def _magic(path: Path) -> bytes:
    try:
        with open(path, "rb") as f:
            return f.read(8)
    except OSError:  # gone, a directory, unreadable: not an object of the link
        return b""


def _writes_a_file(arg: str) -> bool:
    return arg.startswith(_DRIVER_TEMPS) or (
        arg.startswith("-Wl,") and any(p.startswith(_LINKER_OUTPUTS) for p in arg.split(",")[1:])
    )


def replay_command(link: Link, flags: list[str], out: Path) -> list[str]:
    """LINK's command with FLAGS after its own, writing OUT and no other file of its own
    (no map, no driver temporaries): run again in LINK's directory, it links the same."""
    args = [a for a in without_outputs(link.argv[1:]) if not _writes_a_file(a)]
    return [link.argv[0], *args, *flags, "-o", str(out)]


def _replay(link: Link, flags: list[str], out: Path, timeout_s: float | None) -> None:
    """Runs LINK again in its directory with FLAGS, writing OUT; a link that fails is a
    BuildError of one line."""
    cmd = replay_command(link, flags, out)
    try:
        r = subprocess.run(
            cmd,
            cwd=link.cwd,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=timeout_s,
            stdin=subprocess.DEVNULL,
        )
    except subprocess.TimeoutExpired as e:
        raise BuildError(f"its link timed out after {timeout_s:g} s") from e
    except OSError as e:
        raise BuildError(f"cannot link in {link.cwd} ({e.strerror})") from e
    if r.returncode != 0:
        raise BuildError(f"its link failed again ({error_line(r.stderr, 200)})")


def merged_module(link: Link, flags: list[str], private: Path, timeout_s: float | None) -> Path:
    """Replays the full-LTO LINK with FLAGS and lld's --save-temps, its output and every
    other file it writes in PRIVATE; returns the merged module lld kept there. A link that
    fails or merges no bitcode is a BuildError of one line."""
    out = private / link.output.name
    _replay(link, [*flags, "-Wl,--save-temps"], out, timeout_s)
    merged = out.with_name(out.name + MERGED_SUFFIX)
    if not merged.is_file():
        raise BuildError("its link merged no bitcode")
    return merged


def backend_modules(
    link: Link, flags: list[str], private: Path, timeout_s: float | None
) -> dict[str, Path]:
    """Replays the ThinLTO LINK with FLAGS and lld's --save-temps in PRIVATE; returns each
    backend's module after import by a name of its own (its input's, numbered). lld writes a
    backend's temporaries beside its input, so the replay names each bitcode object and
    archive, and each archive a -l finds in the link's own -L directories, by a link in
    PRIVATE: nothing lands in the user's tree."""
    seen = private / "in"
    argv = list(link.argv)
    inputs = set(Invocation(link.cwd, link.argv).inputs())
    numbers = itertools.count(1)
    for i, arg in enumerate(argv[1:], 1):
        if arg in inputs and (_is_bitcode(link.cwd / arg) or _is_archive(link.cwd / arg)):
            argv[i] = str(_link_to(link.cwd / arg, seen / f"{next(numbers):03d}"))
    archives = _archives_by_l(argv[1:], link.cwd)
    for archive in archives:
        _link_to(archive, private / "lib")
    lib = [f"-L{private / 'lib'}"] if archives else []
    _replay(
        Link(link.cwd, [argv[0], *lib, *argv[1:]], link.output),
        [*flags, "-Wl,--save-temps"],
        private / link.output.name,
        timeout_s,
    )
    found = sorted(private.rglob(f"*{IMPORTED_SUFFIX}"))
    if not found:
        raise BuildError("its link ran no ThinLTO backend")
    return {_safe(str(m.relative_to(private))[: -len(IMPORTED_SUFFIX)]): m for m in found}


def _link_to(target: Path, directory: Path) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    named = directory / target.name
    named.symlink_to(os.path.abspath(target))
    return named


def _archives_by_l(args: list[str], cwd: Path) -> list[Path]:
    """The archives lld takes for ARGS' -lNAME from their own -L directories (a shared
    library found first, as lld prefers it, is none): a system library is in no -L of the
    build, and never bitcode."""
    dirs, names, rest = [], [], iter(args)
    for a in rest:
        if a in ("-L", "-l"):
            a += next(rest, "")
        if a.startswith("-L"):
            dirs.append(cwd / a[2:])
        elif a.startswith("-l") and not a.startswith("-l:"):
            names.append(a[2:])
    found = []
    for name in dict.fromkeys(names):
        for d in dirs:
            if (d / f"lib{name}.so").exists() and "-static" not in args:
                break
            if _is_archive(d / f"lib{name}.a"):
                found.append(d / f"lib{name}.a")
                break
    return found


def _safe(relative: str) -> str:
    """A backend module's path under the replay's directory as one part of a module name:
    `in/007/util.o` -> `007-util.o`; an archive member's parentheses and spaces as `_`."""
    parts = PurePosixPath(relative).parts[1:]
    return re.sub(r"[^A-Za-z0-9._+-]", "_", "-".join(parts))


def cc1_args(tc: Toolchain, bitcode: Path, opt_level: str) -> list[str]:
    """The cc1 arguments `clang OPT_LEVEL -c BITCODE` runs, less its input and output: a
    corpus module's command line (mlgo.corpus.format), which adds both back."""
    cmd = [tc.clang, "-###", opt_level, "-c", str(bitcode), "-o", os.devnull]
    proc = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if proc.returncode != 0:
        raise BuildError(f"{shlex.join(cmd)} failed ({error_line(proc.stderr, 200)})")
    args = shlex.split(proc.stderr.strip().splitlines()[-1])[1:]
    return without_outputs(args[: args.index("-x")] if "-x" in args else args)


def write_link_modules(
    links: dict[str, Link],
    staged: Path,
    tc: Toolchain,
    opt_level: str,
    work: Path,
    skipped: list[str],
    stage: str,
    timeout_s: float | None = None,
) -> list[str]:
    """Replays LINKS (name -> link) of a build recorded for STAGE side by side in private
    directories under WORK and writes their modules, `NAME.bc` + `NAME.cmd` at OPT_LEVEL,
    into the corpus directory STAGED: a full-LTO link's merged module as NAME, a ThinLTO
    link's backend modules as NAME/EACH. Returns the names written. A link that could not
    be replayed (its objects removed by the build, a linker error) is one line of SKIPPED."""
    flags = [opt_level, *lto_flags(stage)]

    def write(name: str, link: Link) -> list[str] | str:
        with tempfile.TemporaryDirectory(prefix="link-", dir=work) as private:
            try:
                if stage == "thin-link":
                    found = backend_modules(link, flags, Path(private), timeout_s)
                    modules = {f"{name}/{each}": m for each, m in found.items()}
                else:
                    modules = {name: merged_module(link, flags, Path(private), timeout_s)}
                commands = {n: cc1_args(tc, m, opt_level) for n, m in modules.items()}
            except BuildError as e:
                return f"{link.output}: {e}, not recorded"
            for n, module in modules.items():
                (staged / n).parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(module, staged / f"{n}.bc")
                (staged / f"{n}.cmd").write_bytes(b"\0".join(a.encode() for a in commands[n]))
        return list(modules)

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        written = list(pool.map(write, links, links.values()))
    skipped += [w for w in written if isinstance(w, str)]
    return [n for w in written if isinstance(w, list) for n in w]


def lto_text(tc: Toolchain, module: Path, plugin: Path | None = None) -> int:
    """The `.text` lld's own LTO makes of the merged MODULE (a relocatable link, `-r`: no
    library to resolve), with PLUGIN's inlining policy in it if given. This is the link's
    pipeline, which a `clang -Oz` compile of the module is not: a policy's change here is its
    change in the real link, byte for byte as measured, where the compile can differ in sign."""
    with tempfile.TemporaryDirectory(prefix="mlgo-lto-") as d:
        out = Path(d) / "lto.o"
        load = [f"--load-pass-plugin={plugin}"] if plugin else []
        _tool([tc.tool("ld.lld"), "-r", str(module), *load, "-o", str(out)], module)
        return text_size(out)


def thin_text(tc: Toolchain, modules: list[Path], plugin: Path | None = None) -> int:
    """The `.text` one ThinLTO link keeps of its backend MODULES (each after import), with
    PLUGIN's inlining policy in them if given: each optimized by the backend's pipeline and
    compiled as lld does (THIN_BACKEND, THIN_CODEGEN), then all linked relocatably, which
    keeps each COMDAT group (an inline function's linkonce_odr copy) once, as the program
    does; an imported function is never emitted. Summing the modules alone would count
    each such copy in every module that keeps it."""
    load = [f"-load-pass-plugin={plugin}"] if plugin else []
    with tempfile.TemporaryDirectory(prefix="mlgo-thin-") as d:

        def backend(i: int, module: Path) -> Path:
            obj = Path(d) / f"{i}.o"
            _tool([tc.tool("opt"), *load, *THIN_BACKEND, str(module), "-o", f"{obj}.bc"], module)
            _tool([tc.tool("llc"), *THIN_CODEGEN, f"{obj}.bc", "-o", str(obj)], module)
            return obj

        with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
            objects = list(pool.map(backend, range(len(modules)), modules))
        out = Path(d) / "thin.o"
        _tool([tc.tool("ld.lld"), "-r", *map(str, objects), "-o", str(out)], modules[0])
        return text_size(out)


def _tool(cmd: list[str], module: Path) -> None:
    r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
    if r.returncode != 0:
        raise BuildError(f"{module}: {Path(cmd[0]).name} failed ({error_line(r.stderr, 200)})")


def linked_texts(tc: Toolchain, corpus: Corpus, plugin: Path | None = None) -> dict[str, int]:
    """The `.text` of each program or library of CORPUS (of a link stage) as lld's LTO
    makes it, with PLUGIN's policy if given: a full-LTO link's merged module alone
    (`lto_text`), a ThinLTO link's backend modules together (`thin_text`)."""
    if corpus.stage == "link":
        return {m.name: lto_text(tc, m.bitcode, plugin) for m in corpus.modules}
    links: dict[str, list[Path]] = {}
    for m in corpus.modules:
        links.setdefault(str(PurePosixPath(m.name).parent), []).append(m.bitcode)
    return {name: thin_text(tc, modules, plugin) for name, modules in links.items()}
