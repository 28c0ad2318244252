"""Per-compile CPU cost of this checkout's decisions wrapper (`DIR/cc`) against another
revision's.

    .venv/bin/python -m tools.bench_decisions_wrapper --baseline REV [--rounds 30]

One decisions directory made on top of PGO (tests/data/minipkg's profile) holds a decisions
file for each of its C sources, so that every compile takes the wrapper's longest path: its
file checked and replayed, its source's cksum, the profile checked and used. In it sit this
checkout's `cc` and REV's (written by REV's own mlgo.ship.decisions, from `git archive`),
twice (the A/A control); each round compiles every source at -O2 through the three in a
shuffled order. A compile's CPU is the wrapper's and its children's (wait4's rusage), summed
per round and wrapper; reported: the median and interquartile range over rounds of each
one's change against REV's.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from rich.console import Console

from mlgo.llvm.replay import Decision
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.ship import decisions
from tools.lab.wrappers import compile_cpu_s, cpu_rounds, wrapper_arguments, wrapper_table

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data" / "minipkg"
WRITE_WRAPPER = """\
import sys
from pathlib import Path
from mlgo.ship.decisions import wrapper_text
Path(sys.argv[1]).write_text(wrapper_text(sys.argv[2], "..", [], profiled=True))
"""


def profiled_directory(tc: Toolchain, work: Path) -> tuple[Path, list[Path]]:
    """WORK/src (minipkg) and its decisions directory with the sources' profile, each source
    with a decisions file; the sources."""
    src = work / "src"
    shutil.copytree(DATA, src)
    sources = sorted(src.glob("*.c"))
    instrumented = [tc.clang, "-O2", "-fprofile-instr-generate", *map(str, sources)]
    subprocess.run([*instrumented, "-o", str(work / "i")], check=True)
    env = {**os.environ, "LLVM_PROFILE_FILE": str(work / "raw.profraw")}
    subprocess.run([str(work / "i")], input=b"a b a\n", env=env, capture_output=True)
    merged = work / "default.profdata"
    merge = [tc.tool("llvm-profdata"), "merge", "-o", str(merged), str(work / "raw.profraw")]
    subprocess.run(merge, check=True)
    unit = decisions.UnitDecisions
    files = {
        s.name: unit([Decision("mlgo_none", "mlgo_none:1:1", "x", False)], cksum=_cksum(s))
        for s in sources
    }
    return decisions.write(src / "decisions", src, files, {}, [], tc.major, profile=merged), sources


def _cksum(source: Path) -> str:
    return decisions.source_sums(source)[1]


def baseline_wrapper(rev: str, directory: Path, compiler: str, work: Path) -> Path:
    """REV's `cc` for DIRECTORY, written by REV's own code."""
    archive = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "mlgo"], check=True, capture_output=True
    ).stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(work / "baseline", filter="data")
    path = directory / "cc-baseline"
    env = {**os.environ, "PYTHONPATH": str(work / "baseline")}
    write = [sys.executable, "-c", WRITE_WRAPPER, str(path), compiler]
    subprocess.run(write, check=True, env=env, cwd=work)
    path.chmod(0o755)
    return path


def compile_one(wrapper: Path, source: Path, quiet: bool) -> float:
    """One compile of SOURCE, in its directory, through WRAPPER: CPU seconds."""
    command = [str(wrapper), "-O2", "-c", source.name, "-o", str(source.parent / "x.o")]
    return compile_cpu_s(command, cwd=source.parent, quiet=quiet)


def main() -> None:
    args = wrapper_arguments(__doc__)
    tc = find_toolchain()
    with tempfile.TemporaryDirectory(prefix="bench-decisions-wrapper-") as d:
        directory, sources = profiled_directory(tc, Path(d))
        old = baseline_wrapper(args.baseline, directory, f"clang-{tc.major}", Path(d))
        shutil.copy(old, directory / "cc-baseline-aa")
        wrappers = {
            "baseline": old,
            "baseline A/A": directory / "cc-baseline-aa",
            "this checkout": directory / "cc",
        }
        rounds = cpu_rounds(wrappers, sources, args.rounds, args.seed, compile_one)
    title = f"decisions cc CPU per compile vs {args.baseline}, {args.rounds} rounds"
    table = wrapper_table(title, rounds, len(sources))
    Console().print(table)


if __name__ == "__main__":
    main()
