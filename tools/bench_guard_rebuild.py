"""What the default guarded mlgo-cc costs a user: a package's first build and its rebuild.

  .venv/bin/python -m tools.bench_guard_rebuild popt libsodium libmaxminddb --rounds 3
  .venv/bin/python -m tools.bench_guard_rebuild lua --lto full --rounds 3

A package is a recipe of corpus/recipes or any Debian source package by name, built as its
tree says (`./configure && make`, after `autoreconf -fi` where only configure.ac is shipped,
or CMake; tools.lab.rebuilds). Each round builds it three ways in fresh trees, in an
order that flips and turns round by round: plain clang-22, plain again (the A/A control),
and mlgo-cc through one service of the policies served by default (the shipped per-file
policy guards itself: the memory of what it kept is cold in a fresh tree). Each is built
(configure and build), then cleaned as a user cleans it (`make clean`, CMake's clean target;
a recipe's tree: every object, archive and program removed) and rebuilt in the same tree.
Reported: wall time, and CPU of the build's processes plus the service's (from /proc: it
runs beside the build), median and IQR of the paired changes against plain; and, in one
more build and rebuild, how often clang ran with the plugin and without it.

With --lto full, every build is `-Oz -flto` linked by lld: the compiles write bitcode (no
per-file guard), and each program's link is the link-time policy's, guarded.
"""

from __future__ import annotations

import argparse
import json
import statistics
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.data import default_policies
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems import get_problem
from mlgo.programs.build import SIZE_FLAGS, problem_flags
from mlgo.runtime.files import atomic_write_text
from tools.lab.rebuilds import BUILDS, STEPS, bench, load_now

console = Console()


def report(result: dict) -> Table:
    """RESULT's medians and changes against plain, a row per step and build."""
    table = Table("step", "build", "wall s", "vs plain (IQR)", "CPU s", "vs plain (IQR)")
    table.title = result["package"]
    for step in STEPS:
        for b in BUILDS:
            cells = []
            for clock in ("wall", "cpu"):
                change = result["against_plain"][step][clock].get(b)
                cells += [
                    f"{statistics.median(result['seconds'][step][clock][b]):.2f}",
                    "{:+.1f}% ({:+.1f}..{:+.1f})".format(change["change_pct"], *change["iqr_pct"])
                    if change
                    else "",
                ]
            table.add_row(step, b, *cells)
    return table


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", help="recipes or Debian source packages")
    parser.add_argument("--work", type=Path, default=Path("data/bench-guard-rebuild"))
    parser.add_argument("--policy", type=Path, nargs="+", default=default_policies())
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--lto", choices=["full"], help="-Oz -flto, each link guarded")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1 round is needed")
    flags = problem_flags(get_problem("inlining-size-link")) if args.lto else SIZE_FLAGS
    tc = find_toolchain()
    for name in args.packages:
        work = args.work.resolve() / name
        console.print(f"{name}: load before {load_now()}")
        result = bench(name, work, args.policy, args.rounds, flags, tc)
        console.print(report(result))
        console.print(
            f"clang runs: {result['clang_runs']}; load after each round: "
            + ", ".join(result["load_after_rounds"])
        )
        out = work / f"bench_guard_rebuild{'-lto-full' if args.lto else ''}.json"
        atomic_write_text(out, json.dumps(result, indent=1))
        console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
