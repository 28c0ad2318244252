"""tools/default_responder.c, the cheapest policy process: built, and one compile's channel
answered by it (clang's ML mode with no Python on the other end)."""

from __future__ import annotations

import subprocess
import tempfile
import time
from pathlib import Path

from mlgo.corpus.format import Module
from mlgo.llvm.channel import fifo_pair
from mlgo.problems import Problem

SOURCE = Path(__file__).resolve().parents[1] / "default_responder.c"


def build_responder(directory: Path) -> Path:
    """tools/default_responder.c built with the system's cc into DIRECTORY."""
    binary = directory / "default_responder"
    subprocess.run(["cc", "-O2", "-o", str(binary), str(SOURCE)], check=True)
    return binary


def compile_with_native_responder(
    problem: Problem, module: Module, clang: str, responder: Path
) -> dict:
    """The channel answered by a C process: what the compiler's ML mode costs by itself."""
    with tempfile.TemporaryDirectory() as d, fifo_pair() as base:
        cmd = module.compile_command(
            clang, Path(d) / "o.o", problem.opt_level, problem.channel_flags(base)
        )
        start = time.monotonic()
        compiler = subprocess.Popen(cmd, stdin=subprocess.DEVNULL)
        peer = subprocess.Popen([str(responder), base])
        if compiler.wait(timeout=600) or peer.wait(timeout=60):
            raise RuntimeError(f"{module.name}: native responder run failed")
        return {"seconds": time.monotonic() - start}
