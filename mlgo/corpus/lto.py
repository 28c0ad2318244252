"""A corpus of full-LTO links: the module lld's LTO optimizes, one per linked program or
shared library (`mlgo corpus record --lto full`).

The recorded build runs with the wrappers adding LTO_FLAGS, so its compiles write bitcode
objects and its links run lld's LTO. Afterwards each logged link is replayed in its own
directory with lld's `--save-temps` and its output in a private directory, so nothing is
written into the user's tree: lld keeps the merged module after LTO's internalization, before
its optimization pipeline, beside that output (MERGED_SUFFIX). That module, with the cc1
command line `clang OPT -c` runs on it (`cc1_args`), is one module of a corpus of the link
stage, whose `.text` lands near the real link's.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import tempfile
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from mlgo.corpus.extract import Invocation
from mlgo.llvm.cmdline import link_output, without_outputs
from mlgo.llvm.sizes import text_size
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import STAGE_FLAGS
from mlgo.runtime.commands import BuildError
from mlgo.runtime.messages import error_line

# Appended after the recorded level, as RECORD_FLAGS are for a corpus of files: the link
# stage's own flags, as the builds a link-time policy is compared on get them.
LTO_FLAGS = [*STAGE_FLAGS["link"], "-Qunused-arguments", "-g0"]
# lld keeps the merged module after LTO's internalization beside the output under this name.
MERGED_SUFFIX = ".0.2.internalize.bc"
# A driver call with one of these compiles, preprocesses or links relocatably: no program.
_NOT_LINKS = {"-c", "-S", "-E", "-M", "-MM", "-fsyntax-only", "-r"}
# Raw LLVM bitcode, and bitcode in its wrapper header.
_BITCODE_MAGIC = (b"BC\xc0\xde", b"\xde\xc0\x17\x0b")
# Linker options that write a file of their own (-Wl,-Map=FILE, -Wl,-Map,FILE), and the
# driver's own temporaries: a replay writes only into its private directory.
_LINKER_OUTPUTS = ("-Map", "--Map", "--dependency-file", "--why-extract", "--reproduce")
_DRIVER_TEMPS = ("-save-temps", "--save-temps")


@dataclass(frozen=True)
class Link:
    """One link of a recorded build: where it ran, its arguments (compiler first), and the
    program or shared library it wrote."""

    cwd: Path
    argv: list[str]
    output: Path


def logged_links(invocations: list[Invocation]) -> list[Link]:
    """The links among a build's logged INVOCATIONS: calls that neither compile nor
    preprocess and link at least one LLVM bitcode object that survived the build. An output
    linked twice is the last link's."""
    links: dict[Path, Link] = {}
    for call in invocations:
        args = call.argv[1:]
        if _NOT_LINKS & set(args) or not any(_is_bitcode(call.cwd / a) for a in call.inputs()):
            continue
        output = Path(os.path.normpath(call.cwd / link_output(args)))
        links.pop(output, None)  # keep the links in the order of their last run
        links[output] = Link(call.cwd, call.argv, output)
    return list(links.values())


def _is_bitcode(path: Path) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(4) in _BITCODE_MAGIC
    except OSError:  # gone, a directory, unreadable: not an object of the link
        return False


def _writes_a_file(arg: str) -> bool:
    return arg.startswith(_DRIVER_TEMPS) or (
        arg.startswith("-Wl,") and any(p.startswith(_LINKER_OUTPUTS) for p in arg.split(",")[1:])
    )


def replay_command(link: Link, flags: list[str], out: Path) -> list[str]:
    """LINK's command with FLAGS after its own, writing OUT and no other file of its own
    (no map, no driver temporaries): run again in LINK's directory, it links the same."""
    args = [a for a in without_outputs(link.argv[1:]) if not _writes_a_file(a)]
    return [link.argv[0], *args, *flags, "-o", str(out)]


def merged_module(link: Link, flags: list[str], private: Path, timeout_s: float | None) -> Path:
    """Replays LINK in its directory with FLAGS and lld's --save-temps, its output and every
    other file it writes in PRIVATE; returns the merged module lld kept there. A link that
    fails or merges no bitcode is a BuildError of one line."""
    out = private / link.output.name
    cmd = replay_command(link, [*flags, "-Wl,--save-temps"], out)
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
    merged = out.with_name(out.name + MERGED_SUFFIX)
    if not merged.is_file():
        raise BuildError("its link merged no bitcode")
    return merged


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
    timeout_s: float | None = None,
) -> list[str]:
    """Replays LINKS (module name -> link) side by side in private directories under WORK
    and writes each merged module, `NAME.bc` + `NAME.cmd` at OPT_LEVEL, into the corpus
    directory STAGED; returns the names written. A link that could not be replayed (its
    objects removed by the build, a linker error) is one line of SKIPPED."""
    flags = [opt_level, *LTO_FLAGS]

    def write(name: str, link: Link) -> str | None:
        with tempfile.TemporaryDirectory(prefix="link-", dir=work) as private:
            try:
                merged = merged_module(link, flags, Path(private), timeout_s)
                args = cc1_args(tc, merged, opt_level)
            except BuildError as e:
                return f"{link.output}: {e}, not recorded"
            (staged / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(merged, staged / f"{name}.bc")
            (staged / f"{name}.cmd").write_bytes(b"\0".join(a.encode() for a in args))
        return None

    with ThreadPoolExecutor(os.cpu_count() or 2) as pool:
        failures = list(pool.map(write, links, links.values()))
    skipped += [f for f in failures if f]
    return [name for name, failure in zip(links, failures, strict=True) if not failure]


def lto_text(tc: Toolchain, module: Path, plugin: Path | None = None) -> int:
    """The `.text` lld's own LTO makes of the merged MODULE (a relocatable link, `-r`: no
    library to resolve), with PLUGIN's inlining policy in it if given. This is the link's
    pipeline, which a `clang -Oz` compile of the module is not: a policy's change here is its
    change in the real link, byte for byte as measured, where the compile can differ in sign."""
    with tempfile.TemporaryDirectory(prefix="mlgo-lto-") as d:
        out = Path(d) / "lto.o"
        cmd = [tc.tool("ld.lld"), "-r", str(module), "-o", str(out)]
        cmd += [f"--load-pass-plugin={plugin}"] if plugin else []
        r = subprocess.run(cmd, capture_output=True, text=True, errors="replace")
        if r.returncode != 0:
            raise BuildError(f"{module}: lld's LTO failed ({error_line(r.stderr, 200)})")
        return text_size(out)
