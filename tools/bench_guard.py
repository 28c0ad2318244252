"""What MLGO_GUARD=size buys and costs, on real Debian packages (issue 21, item 5).

  .venv/bin/python -m tools.bench_guard zstd lua --work data/bench-guard

Each package is built three times in one run from the same pristine source at -Oz: with
plain clang-22, with mlgo-cc (the policy alone) and with mlgo-cc under MLGO_GUARD=size,
the last two through one policy service (strict: every file really asked the policy).
Reported per package and in total: the object files' .text (every .o of the build, as
mlgo.llvm.sizes measures it) against plain, how many objects came out larger than plain's,
and the build's CPU time (user + system of every process it ran, the policy's included
when it runs inside clang). The packages' own tests are not run (the guard keeps objects
one of the other two builds made).
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.data import shipped_policy
from mlgo.llvm.sizes import text_size
from mlgo.llvm.toolchain import find_toolchain
from mlgo.packages.recipes import load_recipe
from mlgo.programs.build import Building, build_program, policy_service, pristine_source
from mlgo.programs.compare import variants
from mlgo.runtime.files import atomic_write_text

VARIANTS = ("plain", "policy", "guard")
# zstd names its object directories after a hash of $CC and the flags: alike in all builds.
HASHED_DIR = re.compile(r"/conf_[0-9a-f]{32}/")
console = Console()


def bench_package(name: str, work: Path, policy: Path) -> dict:
    """The three builds of one package and their object .text, per variant."""
    recipe, tc = load_recipe(name), find_toolchain()
    pristine = pristine_source(recipe, work / name)
    cpu = {}
    with policy_service([policy], work / name / "service") as env:
        plain, served = variants(tc, env, VARIANTS[:2])
        _, guarded = variants(tc, env, (VARIANTS[0], VARIANTS[2]), guard=True)
        for v in (plain, served, guarded):
            tree = work / name / v.name
            build = build_program(recipe, pristine, tree, tc, v, None, Building(tests=False))
            cpu[v.name] = build.build_cpu_seconds
    texts = {v: object_texts(work / name / v) for v in VARIANTS}
    common = sorted(set.intersection(*(set(t) for t in texts.values())))
    figures: dict = {"cpu_s": cpu, "objects": len(common)}
    for variant in VARIANTS:
        figures[f"{variant}_text"] = sum(texts[variant][o] for o in common)
    for variant in VARIANTS[1:]:
        larger = [o for o in common if texts[variant][o] > texts["plain"][o]]
        figures[f"{variant}_larger"] = len(larger)
    return figures


def object_texts(tree: Path) -> dict[str, int]:
    """The .text of every object file in TREE, by its path there (`object_key`)."""
    return {
        object_key(path.relative_to(tree)): text_size(path)
        for path in sorted(tree.rglob("*.o"))
        if path.is_file()
    }


def object_key(path: Path) -> str:
    """An object's path in its build tree, the same in all three builds."""
    return HASHED_DIR.sub("/conf/", f"/{path}")


def pct(new: float, old: float) -> str:
    return f"{100 * (new / old - 1):+.2f}%" if old else "n/a"


def summed(results: dict[str, dict]) -> dict:
    """The packages' RESULTS (`bench_package`'s) added up, CPU seconds per variant too."""
    total: dict = dict.fromkeys(("objects", "plain_text", "policy_text", "guard_text"), 0)
    total |= {"policy_larger": 0, "guard_larger": 0}
    for r in results.values():
        for key in total:
            total[key] += r[key]
    total["cpu_s"] = {v: sum(r["cpu_s"][v] for r in results.values()) for v in VARIANTS}
    return total


def table_row(name: str, r: dict) -> list[str]:
    """One package's (or the total's) figures R as the table shows them."""
    c = r["cpu_s"]
    return [
        name,
        str(r["objects"]),
        f"{r['plain_text']:,}",
        pct(r["policy_text"], r["plain_text"]),
        pct(r["guard_text"], r["plain_text"]),
        f"{r['policy_larger']} / {r['guard_larger']}",
        f"{c['plain']:.1f} / {c['policy']:.1f} / {c['guard']:.1f}",
        f"{pct(c['guard'], c['plain'])} / {pct(c['guard'], c['policy'])}",
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("packages", nargs="+", help="recipes in corpus/recipes")
    parser.add_argument("--work", type=Path, default=Path("data/bench-guard"))
    parser.add_argument("--policy", type=Path, default=shipped_policy("inlining-size"))
    args = parser.parse_args()
    work = args.work.resolve()
    results = {name: bench_package(name, work, args.policy) for name in args.packages}
    table = Table(
        "package", "objects", "plain .text", "policy", "guard", "larger (policy/guard)",
        "CPU s plain/policy/guard", "guard CPU vs plain / vs policy",
        title="MLGO_GUARD=size: object .text against clang-22 -Oz, and the build's CPU time",
    )  # fmt: skip
    for name, r in [*results.items(), ("total", summed(results))]:
        table.add_row(*table_row(name, r), style="bold" if name == "total" else None)
    console.print(table)
    atomic_write_text(args.work / "bench_guard.json", json.dumps(results, indent=1))
    console.print(f"wrote {args.work / 'bench_guard.json'}")


if __name__ == "__main__":
    main()
