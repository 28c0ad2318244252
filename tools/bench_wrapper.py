"""Per-compile CPU cost of this checkout's native mlgo-cc against another revision's.

    .venv/bin/python -m tools.bench_wrapper --baseline REV [--rounds 30]

Both wrappers, and a second copy of the baseline (the A/A control), compile the same small
real C files (tests/data) through one plugin service of the shipped policy; each round
runs the three in a shuffled order, file by file. A compile's CPU time is the wrapper's and
its children's (wait4's rusage), summed per round and wrapper. Reported: the median and
interquartile range over rounds of each wrapper's change against the baseline. Written for
issue 36's checks (a plugin's path checked on every compile, below 1%), usable for any
change to the wrapper.
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import subprocess
import tempfile
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.data import shipped_policy
from mlgo.programs.build import policy_service
from mlgo.programs.measure import paired_change
from mlgo.serve.native_wrapper import build_native_wrapper

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def compile_cpu_s(wrapper: Path, source: Path, out: Path, env: dict[str, str]) -> float:
    """CPU seconds of one compile through WRAPPER, wrapper and compiler together."""
    proc = subprocess.Popen(
        [str(wrapper), "-Oz", "-c", str(source), "-o", str(out)], env=env, stderr=subprocess.PIPE
    )
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    stderr = proc.stderr.read() if proc.stderr else b""
    if proc.returncode != 0 or stderr:
        raise RuntimeError(f"{wrapper} on {source}: exit {proc.returncode}: {stderr[:300]!r}")
    return usage.ru_utime + usage.ru_stime


def changes(rounds: list[dict[str, float]], name: str) -> tuple[float, float, float]:
    """Median, first and third quartile of NAME's per-round change against the baseline, %."""
    change = paired_change([r[name] for r in rounds], [r["baseline"] for r in rounds])
    return 100 * change["median"], 100 * change["q1"], 100 * change["q3"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--baseline", required=True, help="git revision of the wrapper to compare")
    ap.add_argument("--rounds", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    args = ap.parse_args()
    sources = sorted((DATA / "minipkg").glob("*.c"))
    with tempfile.TemporaryDirectory(prefix="bench-wrapper-") as d:
        work = Path(d)
        old_source = work / "baseline.c"
        git = ["git", "show", f"{args.baseline}:mlgo/serve/native/mlgo_cc.c"]
        old_source.write_bytes(subprocess.run(git, check=True, capture_output=True).stdout)
        wrappers = {}
        sources_by_name = {
            "baseline": old_source,
            "baseline A/A": old_source,
            "this checkout": None,
        }
        for i, (name, source) in enumerate(sources_by_name.items()):
            (work / str(i)).mkdir()
            wrappers[name] = work / str(i) / "mlgo-cc"  # the name it acts by
            build_native_wrapper(wrappers[name], **({"source": source} if source else {}))
        rng = random.Random(args.seed)
        rounds: list[dict[str, float]] = []
        with policy_service([shipped_policy("inlining-size")], work / "service") as service:
            env = dict(os.environ, MLGO_SOCKET=service["MLGO_SOCKET"])
            for wrapper in wrappers.values():  # warm-up, not counted: the service notes once
                cmd = [str(wrapper), "-Oz", "-c", str(sources[0]), "-o", str(work / "x.o")]
                subprocess.run(cmd, env=env, capture_output=True, check=True)  # another mlgo's
            for _ in range(args.rounds):
                order = list(wrappers)
                rng.shuffle(order)
                cpu = dict.fromkeys(wrappers, 0.0)
                for source in sources:
                    for name in order:
                        cpu[name] += compile_cpu_s(wrappers[name], source, work / "x.o", env)
                rounds.append(cpu)
    table = Table(title=f"mlgo-cc CPU per compile vs {args.baseline}, {args.rounds} rounds")
    for column in ("wrapper", "ms per compile (median)", "change (median)", "IQR"):
        table.add_column(column)
    for name in wrappers:
        per_compile = statistics.median(r[name] for r in rounds) / len(sources) * 1e3
        median, q1, q3 = changes(rounds, name)
        iqr = f"{q1:+.2f}..{q3:+.2f}%" if name != "baseline" else ""
        change = f"{median:+.2f}%" if name != "baseline" else ""
        table.add_row(name, f"{per_compile:.1f}", change, iqr)
    Console().print(table)


if __name__ == "__main__":
    main()
