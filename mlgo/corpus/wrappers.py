"""The compiler wrappers a build runs with: CC/CXX that add our flags after the build's own
(the recording flags, for a corpus), log each compile for `record`, and LLVM's binutils.

Both a recipe's build (`mlgo.packages.build`) and the user's own recorded build
(`record.py`) run under them, as do the throughput measurements' builds.
"""

from __future__ import annotations

import os
import shlex
from pathlib import Path

from mlgo.llvm.toolchain import Toolchain


def write_wrapper(path: Path, compiler: str, flags: list[str], log_dir: Path | None = None) -> Path:
    """A CC wrapper: the package's own flags, then ours (the last -O and -g win). With
    LOG_DIR, each call first leaves its directory and arguments in a file there (NUL after
    each: they are bytes, not necessarily UTF-8; read by `extract.logged_compiles`) while
    LOG_DIR exists, and fails if it cannot: a compile left out would be a corpus silently
    short. Once LOG_DIR is gone, a build configured under `record` still compiles with it."""
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
