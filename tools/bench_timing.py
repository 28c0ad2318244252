"""How much a timing of one build against itself moves (the A/A control), timed two ways in
the same rounds: in blocks (each build runs the workload for SECONDS of CPU, then the other),
and in turns (the builds alternate run by run, each summing SECONDS of CPU: what
`mlgo.programs.measure.timed_rounds` does). On a machine whose speed moves from one second
to the next, only the second cancels it.

    .venv/bin/mlgo build cmark --bench-rounds 0 --out data/programs     # its plain build
    .venv/bin/python -m tools.bench_timing --tree data/programs/cmark/plain --rounds 15 \\
        --seconds 6 --json data/bench-timing.json -- \\
        build/src/cmark test/spec.txt test/spec.txt test/spec.txt test/spec.txt

The methods alternate round by round, so both see the same machine; each reports the
median and IQR of its per-round ratios, second build over first, minus one.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.errors import MlgoError
from mlgo.programs.measure import Workload, run_workload, runs_in, spread, timed_rounds
from mlgo.runtime.files import atomic_write_text

console = Console()
BUILDS = ("first", "second")  # the same build tree, timed twice


def block(workload: Workload, tree: Path, loops: int) -> tuple[float, float]:
    """Wall and CPU seconds of LOOPS runs of WORKLOAD in TREE."""
    return run_workload(workload, tree, loops=loops)[:2]


def aa_rounds(workload: Workload, tree: Path, rounds: int, seconds: float) -> dict:
    """ROUNDS of each method, alternating, on WORKLOAD in TREE: the A/A change per method."""
    loops = runs_in(workload, tree, seconds)
    ratios: dict[str, list[float]] = {"blocks": [], "turns": []}
    for r in range(rounds):
        for method in ("blocks", "turns") if r % 2 == 0 else ("turns", "blocks"):
            order = BUILDS if r % 2 == 0 else BUILDS[::-1]
            if method == "blocks":  # one sample: the workload LOOPS times over
                times = timed_rounds(1, order, lambda v: block(workload, tree, loops))
            else:  # LOOPS turns of one run each
                times = timed_rounds(1, order, lambda v: block(workload, tree, 1), turns=loops)
            cpu = times["cpu"]
            ratios[method].append(cpu["second"][0] / cpu["first"][0] - 1)
    return {"loops": loops, "seconds": seconds, **{m: spread(xs) for m, xs in ratios.items()}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tree", type=Path, required=True, help="the build tree it runs in")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--seconds", type=float, default=6.0, help="CPU seconds a build a round")
    parser.add_argument("--json", type=Path)
    parser.add_argument("command", nargs="+", help="the workload, after --")
    args = parser.parse_args()
    if args.rounds < 2 or args.seconds <= 0:
        raise SystemExit("error: --rounds must be at least 2 and --seconds above 0")
    if not args.tree.is_dir():
        raise SystemExit(f"error: {args.tree}: no such build tree")
    workload = Workload("timing", (), (tuple(args.command),))
    try:
        result = aa_rounds(workload, args.tree.resolve(), args.rounds, args.seconds)
    except (MlgoError, OSError) as e:
        raise SystemExit(f"error: {e}") from None
    table = Table(
        "method", "A/A change, median", "IQR", "IQR width", "range",
        title=f"{args.rounds} rounds, {args.seconds:g} CPU s a build a round "
        f"({result['loops']} runs)",
    )  # fmt: skip
    for method in ("blocks", "turns"):
        c = result[method]
        table.add_row(
            method,
            f"{c['median']:+.2%}",
            f"{c['q1']:+.2%}..{c['q3']:+.2%}",
            f"{c['q3'] - c['q1']:.2%}",
            f"{c['min']:+.2%}..{c['max']:+.2%}",
        )
    console.print(table)
    if args.json:
        atomic_write_text(args.json, json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
