"""The compiler wrappers a build runs with: CC/CXX that add our flags after the build's own
(the recording flags, for a corpus), log each call for `record`, and LLVM's binutils.

Both a recipe's build (`mlgo.packages.build`) and the user's own recorded build
(`record.py`) run under them, as do the throughput measurements' builds and both builds
`mlgo tune` and `mlgo build` compare (`mlgo.programs.build`).
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

from mlgo.llvm.toolchain import Toolchain


def write_wrapper(path: Path, compiler: str, flags: list[str], log_dir: Path | None = None) -> Path:
    """A CC wrapper: the package's own flags, then ours (the last -O and -g win). With
    LOG_DIR, each call first leaves its directory, COMPILER and arguments in a file there
    (NUL after each: they are bytes, not necessarily UTF-8; read by
    `extract.logged_invocations`) while LOG_DIR exists, and fails if it cannot: a compile
    left out would be a corpus silently short. Once LOG_DIR is gone, a build configured
    under `record` still compiles with it."""
    log = ""
    run = shlex.join([compiler])
    if log_dir is not None:
        where, template = shlex.quote(str(log_dir)), shlex.quote(str(log_dir / "XXXXXXXX"))
        log = (
            f"if [ -d {where} ]; then\n"
            f"  log=$(mktemp {template}) && "
            f'printf \'%s\\0\' "$(pwd -P)" {run} "$@" >"$log" || exit 1\n'
            "fi\n"
        )
    path.write_text(f'#!/bin/sh\n{log}exec {run} "$@" ' + shlex.join(flags) + "\n")
    path.chmod(0o755)
    return path


# Appended to the package's own flags, so the recorded level is ours whatever the package asks.
RECORD_FLAGS = ["-g0", "-Xclang", "-fembed-bitcode=all", "-Qunused-arguments"]


BINUTILS = ("ar", "ranlib", "nm")
# The compiler names a build may run without asking $CC/$CXX (a hand-written configure that
# writes `CC = gcc`), answered by the wrappers as ccache's masquerade does. Not `clang`:
# `mlgo-cc` runs its compiler by name (MLGO_CC), which must not find a wrapper again.
MASQUERADE = {"cc": "cc", "gcc": "cc", "c++": "c++", "g++": "c++"}


def build_env(
    tc: Toolchain,
    work: Path,
    flags: list[str],
    cc: str | None = None,
    cxx: str | None = None,
    log_dir: Path | None = None,
) -> dict[str, str]:
    """The environment of a package build: CC/CXX wrappers adding FLAGS to the compilers
    (default: the toolchain's clang), logging their calls to LOG_DIR if given
    (`write_wrapper`), and LLVM's binutils. WORK/bin, first on PATH, holds the binutils and
    the wrappers under gcc's and cc's names (`MASQUERADE`), so a build that fixes its
    compiler by name gets them too: both builds a comparison makes run that way, clang
    against the same clang with a policy, never against the gcc a Makefile names. The
    wrappers run their compilers by absolute path, found before PATH changes: a wrapper
    that found itself would never end."""
    cc, cxx = _absolute(cc or tc.clang), _absolute(cxx or tc.clangxx)
    wrappers = {
        "cc": write_wrapper(work / "cc", cc, flags, log_dir),
        "c++": write_wrapper(work / "c++", cxx, flags, log_dir),
    }
    # GNU ar/nm would index these objects through an older LLVM's bfd plugin, which
    # chokes on the embedded bitcode and leaves archives without symbols: use LLVM's,
    # also where a Makefile names `ar` itself instead of $(AR), and where CMake looks for
    # `llvm-ar` beside clang (Debian's unversioned one is an older LLVM, which cannot read
    # this clang's bitcode objects in a full-LTO build).
    bin_dir = work / "bin"
    bin_dir.mkdir(exist_ok=True)
    targets = {
        alias: tc.tool(f"llvm-{name}")  # they act by their name
        for name in BINUTILS
        for alias in (name, f"llvm-{name}")
    }
    targets.update({name: str(wrappers[kind]) for name, kind in MASQUERADE.items()})
    for name, target in targets.items():
        link = bin_dir / name
        link.unlink(missing_ok=True)
        link.symlink_to(target)
    return dict(
        os.environ,
        CC=str(wrappers["cc"]),
        CXX=str(wrappers["c++"]),
        LC_ALL="C",
        AR=str(bin_dir / "ar"),
        RANLIB=str(bin_dir / "ranlib"),
        NM=str(bin_dir / "nm"),
        PATH=f"{bin_dir}{os.pathsep}{os.environ.get('PATH', os.defpath)}",
    )


def _absolute(compiler: str) -> str:
    """COMPILER as an absolute path, looked up on PATH if it is a bare name."""
    return os.path.abspath(shutil.which(compiler) or compiler)
