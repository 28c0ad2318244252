"""How much of an objects-level .text change survives the linker: two build trees'
relocatable objects, summed three ways, each against the baseline.

  .venv/bin/python -m tools.linked_estimate BUILD BASELINE [--under DIR]

- objects: every object's .text, as the inlining reward counts it today;
- linked once: each COMDAT group (a C++ inline or template function's copy) counted once
  per tree, as a link of all the objects keeps it;
- 1/n: each group's bytes divided by the number of baseline objects that define it, an
  estimate that a per-module reward could use, since it sees one object at a time.

The linked programs' own figures are in `mlgo report --build-dir BUILD --baseline-dir
BASELINE`; this says why they differ from the objects'.
"""

from __future__ import annotations

import argparse
import sys
from collections import Counter
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.llvm.sizes import TextParts, text_parts


def objects(tree: Path, under: str) -> dict[str, TextParts]:
    return {str(p.relative_to(tree)): text_parts(p) for p in sorted((tree / under).rglob("*.o"))}


def totals(parts: dict[str, TextParts], defined_in: Counter[str]) -> dict[str, float]:
    """The three sums of the module doc over PARTS; DEFINED_IN: the baseline's count of
    objects defining each group."""
    once: dict[str, int] = {}
    for p in parts.values():
        for signature, size in p.shared.items():
            once.setdefault(signature, size)  # the first copy, in path order
    own = sum(p.own for p in parts.values())
    return {
        "objects": own + sum(sum(p.shared.values()) for p in parts.values()),
        "linked once": own + sum(once.values()),
        "1/n": own
        + sum(size / defined_in.get(s, 1) for p in parts.values() for s, size in p.shared.items()),
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("build", type=Path)
    ap.add_argument("baseline", type=Path)
    ap.add_argument("--under", default=".", help="only the objects below this directory")
    args = ap.parse_args()
    ours, theirs = objects(args.build, args.under), objects(args.baseline, args.under)
    common = sorted(ours.keys() & theirs.keys())
    if not common:
        sys.exit(f"error: no object is in both {args.build} and {args.baseline} under {args.under}")
    ours, theirs = {k: ours[k] for k in common}, {k: theirs[k] for k in common}
    defined_in = Counter(s for p in theirs.values() for s in p.shared)
    base, build = totals(theirs, defined_in), totals(ours, defined_in)
    table = Table(title=f"{len(common)} objects' .text, COMDAT groups counted three ways")
    for col in ("counted", "baseline", "build", "change"):
        table.add_column(col, justify="left" if col == "counted" else "right")
    for way in base:
        change = 100 * (build[way] / base[way] - 1) if base[way] else 0.0
        table.add_row(way, f"{base[way]:,.0f}", f"{build[way]:,.0f}", f"{change:+.2f}%")
    Console().print(table)


if __name__ == "__main__":
    main()
