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

import argparse
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.llvm.replay import Decision
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.programs.measure import paired_change
from mlgo.ship import decisions

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


def compile_cpu_s(wrapper: Path, source: Path, out: Path) -> float:
    """CPU seconds of one compile through WRAPPER, wrapper and compiler together."""
    command = [str(wrapper), "-O2", "-c", source.name, "-o", str(out)]
    proc = subprocess.Popen(command, cwd=source.parent, stderr=subprocess.PIPE)
    _, status, usage = os.wait4(proc.pid, 0)
    stderr = proc.stderr.read() if proc.stderr else b""
    if os.waitstatus_to_exitcode(status) != 0 or stderr:
        raise RuntimeError(f"{wrapper} on {source}: {stderr[:300]!r}")
    return usage.ru_utime + usage.ru_stime


def rounds_of(wrappers: dict[str, Path], sources: list[Path], n: int, seed: int) -> list[dict]:
    """N rounds, each every source through every wrapper in a shuffled order: CPU seconds."""
    rng, out, rounds = random.Random(seed), sources[0].parent / "x.o", []
    for wrapper in wrappers.values():  # warm-up, not counted
        compile_cpu_s(wrapper, sources[0], out)
    for _ in range(n):
        order = list(wrappers)
        rng.shuffle(order)
        cpu = dict.fromkeys(wrappers, 0.0)
        for source in sources:
            for name in order:
                cpu[name] += compile_cpu_s(wrappers[name], source, out)
        rounds.append(cpu)
    return rounds


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", required=True, help="git revision of the wrapper to compare")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
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
        rounds = rounds_of(wrappers, sources, args.rounds, args.seed)
    title = f"decisions cc CPU per compile vs {args.baseline}, {args.rounds} rounds"
    table = Table(title=title)
    for column in ("wrapper", "ms per compile (median)", "change (median)", "IQR"):
        table.add_column(column)
    base = [r["baseline"] for r in rounds]
    for name in wrappers:
        per_compile = statistics.median(r[name] for r in rounds) / len(sources) * 1e3
        if name == "baseline":
            table.add_row(name, f"{per_compile:.1f}", "", "")
            continue
        change = paired_change([r[name] for r in rounds], base)
        median, q1, q3 = (100 * change[k] for k in ("median", "q1", "q3"))
        table.add_row(name, f"{per_compile:.1f}", f"{median:+.2f}%", f"{q1:+.2f}..{q3:+.2f}%")
    Console().print(table)


if __name__ == "__main__":
    main()
