"""Finding clang and its LLVM tools, and checking that its MLGO channels work."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from mlgo.errors import MlgoError

if TYPE_CHECKING:
    from mlgo.problems import Problem

MIN_LLVM_MAJOR = 22
SETUP_HINT = "run tools/setup.sh (installs Debian's clang-22 llvm-22 lld-22)"


class ToolchainError(MlgoError):
    """The compiler or one of its tools is missing, too old or lacks the MLGO hooks."""


@dataclass(frozen=True)
class Toolchain:
    clang: str
    version: tuple[int, int, int]
    bindir: str

    @property
    def major(self) -> int:
        return self.version[0]

    @property
    def clangxx(self) -> str:
        """The C++ driver beside clang (clang-22 -> clang++-22); clang itself otherwise."""
        name = Path(self.clang).name
        return self.clang.replace("clang", "clang++") if "clang" in name else self.clang

    def tool(self, name: str) -> str:
        """An LLVM tool of the same release as clang (llvm-objcopy, llvm-size, ...)."""
        for candidate in (os.path.join(self.bindir, name), shutil.which(f"{name}-{self.major}")):
            if candidate and os.access(candidate, os.X_OK):
                return candidate
        raise ToolchainError(f"{name} for LLVM {self.major} not found; {SETUP_HINT}")

    def describe(self) -> str:
        return f"clang {'.'.join(map(str, self.version))} ({self.clang})"


def _parse_version(text: str) -> tuple[int, int, int]:
    m = re.search(r"clang version (\d+)\.(\d+)\.(\d+)", text)
    if not m:
        raise ToolchainError(f"cannot read a clang version from {text.splitlines()[0]!r}")
    return int(m[1]), int(m[2]), int(m[3])


@cache
def find_toolchain(clang: str | None = None) -> Toolchain:
    """clang from the argument, $MLGO_CLANG, or clang-22 / clang on PATH."""
    names = (
        [clang]
        if clang
        else [os.environ.get("MLGO_CLANG") or "", f"clang-{MIN_LLVM_MAJOR}", "clang"]
    )
    path = next((p for n in names if n and (p := shutil.which(n))), None)
    if path is None:
        raise ToolchainError(
            f"no clang found (tried {', '.join(n for n in names if n)}); {SETUP_HINT}"
        )
    try:
        out = subprocess.run(
            [path, "--version"], capture_output=True, text=True, timeout=30, check=True
        ).stdout
    except (OSError, subprocess.SubprocessError) as e:
        raise ToolchainError(f"{path} --version failed: {e}") from e
    version = _parse_version(out)
    if version[0] < MIN_LLVM_MAJOR:
        raise ToolchainError(
            f"{path} is clang {version[0]}; mlgo needs LLVM {MIN_LLVM_MAJOR} or newer (LLVM 19 "
            f"writes the inliner's default decision into the wrong feature slot); {SETUP_HINT}"
        )
    return Toolchain(path, version, str(Path(os.path.realpath(path)).parent))


_PROBE_SOURCE = """
static int sq(int x) { return x * x; }
int sum(const int *p, int n) { int s = 0; for (int i = 0; i < n; i++) s += sq(p[i]); return s; }
"""


def probe(tc: Toolchain, problem: Problem) -> int:
    """Compiles a small C file through `problem`'s channel; returns the decision count.

    Raises ToolchainError naming the fix if the compiler lacks that interactive mode.
    """
    from mlgo.llvm.channel import ChannelError, compile_interactive
    from mlgo.llvm.log_format import tensor_of

    with tempfile.TemporaryDirectory(prefix="mlgo-probe-") as d:
        src = os.path.join(d, "probe.c")
        Path(src).write_text(_PROBE_SOURCE)
        cmd = [tc.clang, problem.opt_level, "-c", src, "-o", os.path.join(d, "probe.o")]
        try:
            result = compile_interactive(
                cmd,
                problem.default_advice,
                problem.channel_flags,
                timeout_s=60,
                validate=problem.validate,
            )
        except ChannelError as e:
            raise ToolchainError(
                f"{tc.describe()} failed the {problem.name} channel probe: {e}; "
                f"a clang with MLGO's interactive mode is needed "
                f"({SETUP_HINT})"
            ) from e
    if result.header is None:
        raise ToolchainError(
            f"{tc.describe()} never opened the {problem.name} channel; {SETUP_HINT}"
        )
    sent = {s.name for s in result.header.features}
    missing = {tensor_of(f) for f in problem.feature_names} - sent
    if missing:
        raise ToolchainError(
            f"{tc.describe()} does not send {problem.name} features {sorted(missing)}"
        )
    return len(result.decisions)
