"""What the default guarded mlgo-cc costs on a rebuild of unchanged sources (issue 59, item 4).

  .venv/bin/python -m tools.bench_guard_rebuild lua --rounds 5 --work data/bench-guard-rebuild
  .venv/bin/python -m tools.bench_guard_rebuild lua --lto full --rounds 5

With --lto full, every build is `-Oz -flto` linked by lld: the compiles write bitcode (no
per-file guard), and each program's link is the link-time policy's, guarded (linked twice,
the smaller kept; remembered, a relink of unchanged objects links once).

A Debian package built at -Oz in fresh trees, round by round (the order flips every
round): with plain clang-22, then rebuilt after cleaning (every .o, .a and program removed,
as `make clean` does), the A/A control; and with mlgo-cc through one service of the
policies served by default, under MLGO_GUARD=size: first in a fresh tree (the guard's
memory cold: its entries are named by the directory, among the rest), then rebuilt after
cleaning (warm). Reported: each build's CPU time (user + system of every process it ran,
the policy's included: it runs inside clang) against plain's, median and IQR over rounds,
and, in one more round with a clang that counts its runs, how many times clang ran.
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.data import default_policies
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.packages.recipes import Recipe, load_recipe
from mlgo.problems import get_problem
from mlgo.programs.build import (
    SIZE_FLAGS,
    Building,
    Variant,
    build_program,
    policy_service,
    pristine_source,
    problem_flags,
    rebuild_cpu_seconds,
)
from mlgo.programs.compare import variants
from mlgo.programs.measure import in_percent, paired_change
from mlgo.runtime.files import atomic_write_text

BUILDS = ("plain", "plain again", "guarded first", "guarded again")
console = Console()


def build_twice(
    recipe: Recipe, pristine: Path, tree: Path, tc: Toolchain, variant: Variant, flags: list[str]
) -> tuple[float, float]:
    """VARIANT's build with FLAGS of a fresh copy of PRISTINE at TREE and its rebuild: CPU
    seconds."""
    v = variant
    first = build_program(recipe, pristine, tree, tc, v, flags, Building(tests=False))
    return first.build_cpu_seconds, rebuild_cpu_seconds(recipe, tree, tc, variant, flags)


def counting(tc: Toolchain, directory: Path, variant: Variant) -> tuple[Variant, Path]:
    """VARIANT with MLGO_CC a clang that writes a line to the returned log at each run."""
    directory.mkdir(parents=True, exist_ok=True)
    log, clang = directory / "runs.log", directory / "clang"
    log.write_text("")
    clang.write_text(f'#!/bin/sh\necho x >> {log}\nexec {tc.clang} "$@"\n')
    clang.chmod(0o755)
    return Variant(variant.name, variant.compilers, dict(variant.env, MLGO_CC=str(clang))), log


def runs_in(log: Path) -> int:
    return len(log.read_text().split())


def bench(name: str, work: Path, policies: list[Path], rounds: int, flags: list[str]) -> dict:
    """The rounds of one package built with FLAGS, then the counted round: CPU seconds and
    clang's runs."""
    recipe, tc = load_recipe(name), find_toolchain()
    pristine = pristine_source(recipe, work)
    cpu: dict[str, list[float]] = {b: [] for b in BUILDS}
    stamp = time.strftime("%Y%m%d-%H%M%S")  # a fresh tree, so a cold memory, each run
    with policy_service(policies, work / "service") as service_env:
        plain, guarded = variants(tc, service_env, ("plain", "guarded"), guard=True)
        for r in range(rounds):
            order = (plain, guarded) if r % 2 == 0 else (guarded, plain)
            for v in order:
                tree = work / f"{stamp}-{v.name}-{r}"
                first, again = build_twice(recipe, pristine, tree, tc, v, flags)
                cpu[f"{v.name} first" if v is guarded else "plain"].append(first)
                cpu[f"{v.name} again" if v is guarded else "plain again"].append(again)
            console.print(f"round {r + 1}: " + ", ".join(f"{b} {cpu[b][-1]:.1f} s" for b in BUILDS))
        counted, log = counting(tc, work / f"{stamp}-count", guarded)
        tree = work / f"{stamp}-counted"
        compilers, env = counted.compilers, counted.env
        build_program(
            recipe,
            pristine,
            tree,
            tc,
            Variant("counted", compilers, env),
            flags,
            Building(tests=False),
        )
        first_runs = runs_in(log)
        rebuild_cpu_seconds(recipe, tree, tc, counted, flags)
    return {
        "cpu_s": cpu,
        "clang_runs": {"guarded first": first_runs, "guarded again": runs_in(log) - first_runs},
        "objects": len(list(tree.rglob("*.o"))),
        "against_plain": {b: in_percent(paired_change(cpu[b], cpu["plain"])) for b in BUILDS[1:]},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("package", help="a recipe in corpus/recipes")
    parser.add_argument("--work", type=Path, default=Path("data/bench-guard-rebuild"))
    parser.add_argument("--policy", type=Path, nargs="+", default=default_policies())
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--lto", choices=["full"], help="-Oz -flto, each link guarded")
    args = parser.parse_args()
    if args.rounds < 1:
        parser.error(f"--rounds {args.rounds}: at least 1 round is needed")
    work = args.work.resolve() / args.package
    flags = problem_flags(get_problem("inlining-size-link")) if args.lto else SIZE_FLAGS
    result = bench(args.package, work, args.policy, args.rounds, flags)
    table = Table("build", "CPU s (median)", "vs plain, median", "IQR", title=args.package)
    for b in BUILDS:
        change = result["against_plain"].get(b)
        table.add_row(
            b,
            f"{statistics.median(result['cpu_s'][b]):.2f}",
            f"{change['change_pct']:+.2f}%" if change else "",
            "{:+.2f}%..{:+.2f}%".format(*change["iqr_pct"]) if change else "",
        )
    console.print(table)
    console.print(f"clang runs, {result['objects']} objects: {result['clang_runs']}")
    out = work / f"bench_guard_rebuild{'-lto-full' if args.lto else ''}.json"
    atomic_write_text(out, json.dumps(result, indent=1))
    console.print(f"wrote {out}")


if __name__ == "__main__":
    main()
