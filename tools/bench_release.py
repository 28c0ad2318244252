"""Decisions tuned on one release, built on the next (issue 59's release-to-release figure).

    .venv/bin/python -m tools.bench_release OUT_A OUT_B [--work DIR]

OUT_A and OUT_B are finished `mlgo tune` runs (inlining-size, per file) of two releases of
one project, with the same --configure, --build and --test. Release B (OUT_B/pristine) is
built three ways by `build_program`, tests run on each: with plain clang at the tune's level,
from A's decisions (OUT_A/decisions/cc, told B's root), and from B's own decisions (a fresh
tune of B: the gain A's decisions are measured against). Reported: each build's `.text` over
every ELF file against plain, the ELF files made larger, the share of the fresh tune's gain
that A's decisions keep, and per file of A how many of its decisions still meet a call site
in B (`mlgo decisions check`'s exact count: each of B's compiles, as its build ran it with
the tune's flags, again with the recorder around clang's replay of A's file).
"""

from __future__ import annotations

import argparse
import json
import shutil
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.llvm.sizes import compare_trees, tree_totals
from mlgo.llvm.toolchain import find_toolchain
from mlgo.programs.build import Building, Variant, build_program, problem_flags
from mlgo.programs.decide import from_decisions
from mlgo.programs.tune_run import TuneDir
from mlgo.runtime.files import atomic_write_text
from mlgo.ship import decisions
from tools.lab.decisions_figure import still_matching_in, tuned_project

console = Console()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tuned", type=Path, help="OUT of the tune of release A")
    parser.add_argument("fresh", type=Path, help="OUT of the tune of release B")
    parser.add_argument("--work", type=Path, default=Path("data/bench-release"))
    args = parser.parse_args()
    tc = find_toolchain()
    recipe, problem = tuned_project(args.fresh)
    pristine, flags = args.fresh / "pristine", problem_flags(problem)
    trees, calls = {}, args.work.resolve() / "calls"
    shutil.rmtree(calls, ignore_errors=True)
    calls.mkdir(parents=True)
    for name, out in (("plain", None), ("A's decisions", args.tuned), ("B's own", args.fresh)):
        tree = args.work.resolve() / name.replace("'", "").replace(" ", "-")
        variant = from_decisions(tc, TuneDir(out).decisions, tree)[1] if out else None
        compilers = variant.compilers if variant else (tc.clang, tc.clangxx)
        env = variant.env if variant else {}
        logged = calls if out == args.tuned else None  # B's compiles, to recheck A's keys on
        build_program(
            recipe,
            pristine,
            tree,
            tc,
            Variant(name, compilers, env),
            flags,
            Building(log_dir=logged),
        )
        trees[name] = tree
    table = Table(title=f"release B ({recipe.name}) against plain clang {' '.join(flags)}")
    for column in ("build", ".text", "change", "ELF files larger"):
        table.add_column(column)
    result: dict = {"builds": {}}
    for name in ("A's decisions", "B's own"):
        rows = compare_trees(trees[name], trees["plain"])
        totals = tree_totals(rows)
        larger = [r.path for r in rows if r.build > r.baseline]
        result["builds"][name] = {**totals, "larger": larger}
        change = f"{totals['delta_pct']:+.2f}%"
        table.add_row(name, f"{totals['build']:,.0f}", change, ", ".join(larger) or "none")
    fresh_gain = result["builds"]["B's own"]["delta_pct"]
    kept = result["builds"]["A's decisions"]["delta_pct"] / fresh_gain if fresh_gain else None
    result["share_of_fresh_gain"] = kept
    artifact, tree = decisions.read(TuneDir(args.tuned).decisions), trees["A's decisions"]
    matching = still_matching_in(artifact, calls, tree, flags)
    result["matching"] = {n: {"matched": m, "decisions": t} for n, (m, t) in matching.items()}
    matched, total = (sum(v[i] for v in matching.values()) for i in (0, 1))
    console.print(table)
    share = f"{kept:.0%}" if kept is not None else "n/a (the fresh tune gained nothing)"
    console.print(f"A's decisions keep {share} of a fresh tune's gain on B")
    console.print(f"{matched} of {total} of A's decisions still meet a call site in B")
    for name, (m, t) in sorted(matching.items()):
        console.print(f"  {name}: {m} of {t}")
    args.work.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.work / "release.json", json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
