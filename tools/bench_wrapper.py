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

import os
import subprocess
import tempfile
from pathlib import Path

from rich.console import Console

from mlgo.data import shipped_policy
from mlgo.programs.build import policy_service
from mlgo.serve.native_wrapper import build_native_wrapper
from tools.lab.wrappers import compile_cpu_s, cpu_rounds, wrapper_arguments, wrapper_table

DATA = Path(__file__).resolve().parent.parent / "tests" / "data"


def main() -> None:
    args = wrapper_arguments(__doc__)
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
        with policy_service([shipped_policy("inlining-size")], work / "service") as service:
            env = dict(os.environ, MLGO_SOCKET=service["MLGO_SOCKET"])

            def compile_one(wrapper: Path, source: Path, quiet: bool) -> float:
                command = [str(wrapper), "-Oz", "-c", str(source), "-o", str(work / "x.o")]
                return compile_cpu_s(command, env=env, quiet=quiet)

            rounds = cpu_rounds(wrappers, sources, args.rounds, args.seed, compile_one)
    title = f"mlgo-cc CPU per compile vs {args.baseline}, {args.rounds} rounds"
    table = wrapper_table(title, rounds, len(sources))
    Console().print(table)


if __name__ == "__main__":
    main()
