"""How much smaller could inlining make each module at -Oz, if its decisions were chosen by
looking at that module's own size? A reference for what any inlining policy can reach.

  .venv/bin/python -m tools.headroom_inlining --corpus data/corpus \
      --packages bzip2,libyaml,lua,lz4,zlib --policy policies/inlining-size \
      --json data/bench/headroom.json

The search is BC-Max's (mlgo/train/bcmax.py), here around the default heuristic alone:
each round compiles, from the best trajectory so far, every move of a callee's call sites to
one answer, and every single flip of "the k-th decision the compiler asks" (every other
answer is the default's), then all the helpful moves at once, or else adds them one at a
time best first, each kept only if a real compile of the whole set confirms it. Every size
reported was measured. A search that sees the module's size is not a policy (a policy sees
only features, and must work on modules it never saw), so what it finds is a ceiling for
what a policy can be expected to reach, though not a proof that nothing better exists.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Sequence
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

from mlgo.corpus.format import Module, load_corpus
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems import get_problem
from mlgo.problems.policy_files import load_policy
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.workers import Failed, LocalPool
from mlgo.train.bcmax import SearchConfig, SearchResult, SearchTask, search_module
from mlgo.train.evaluate import baseline, evaluate

PROBLEM = get_problem("inlining-size")
console = Console()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--packages", help="comma-separated; default: all of the corpus")
    ap.add_argument("--policy", type=Path, help="also evaluate this policy on the same modules")
    ap.add_argument("--passes", type=int, default=2, help="search rounds per module")
    ap.add_argument("--max-confirm", type=int, default=30, help="helpful moves combined per round")
    ap.add_argument("--budget", type=int, default=0, help="compiles per module (0: no limit)")
    ap.add_argument("--no-groups", action="store_true", help="single flips alone")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    corpus = load_corpus(args.corpus)
    corpus = corpus.select(args.packages.split(",") if args.packages else None)
    tc = find_toolchain()
    workers = LocalPool(args.workers)
    default_run = baseline(corpus, tc, workers, PROBLEM)
    base, metric = default_run.costs, PROBLEM.reward_metric
    cfg = SearchConfig(
        budget=args.budget,
        singles=0,
        groups=0,
        move_groups=not args.no_groups,
        max_confirm=args.max_confirm,
        rounds=args.passes,
    )
    tasks = [
        SearchTask(PROBLEM, m, tc.clang, None, cfg)
        for m in default_run.corpus.modules
        if m.name in base
    ]
    searched: dict[str, SearchResult] = {}
    with Progress(console=console) as bar:
        job = bar.add_task("searching", total=len(tasks))
        for task, r in workers.imap(search_module, tasks):
            bar.advance(job)
            if isinstance(r, Failed):  # left at the default's size, and said so
                console.print(f"[yellow]{task.module.name}: {r.message}")
            else:
                searched[task.module.name] = r

    policy_size: dict[str, float] = {}
    if args.policy:
        ev = evaluate(load_policy(args.policy), corpus, tc, workers, PROBLEM)
        policy_size = {name: r[metric] for name, r in ev.modules.items()}
    workers.close()

    default = {name: r[metric] for name, r in base.items()}
    found = {name: (r.best.cost, moves_kept(r)) for name, r in searched.items()}
    packages = package_sizes(corpus.modules, default, found, policy_size)
    total = {
        k: sum(r[k] for r in packages.values()) for k in ("default", "search", "policy", "moves")
    }
    table = Table(title=f"inlining headroom at -Oz: {metric} against the default heuristic")
    for col in ("package", "default bytes", "search", "moves kept", "policy"):
        table.add_column(col, justify="left" if col == "package" else "right")
    for name, row in [*packages.items(), ("total", total)]:
        table.add_row(
            name,
            f"{row['default']:,.0f}",
            f"{100 * (row['search'] / row['default'] - 1):+.2f}%",
            f"{row['moves']:,.0f}",
            f"{100 * (row['policy'] / row['default'] - 1):+.2f}%" if args.policy else "",
        )
    console.print(table)
    compiles = sum(r.compiles for r in searched.values())
    console.print(f"compiles: {compiles:,}")
    if args.json:
        report = {
            "corpus": str(args.corpus),
            "metric": metric,
            "passes": args.passes,
            "groups": not args.no_groups,
            "packages": packages,
            "total": total,
            "compiles": compiles,
            "modules": {
                name: {
                    "default": base[name][metric],
                    "search": r.best.cost,
                    "flips": sorted(r.best.answerer.flips),
                    "groups": sorted(r.best.answerer.groups),
                    "decisions": len(r.best.actions),
                }
                for name, r in searched.items()
            },
        }
        atomic_write_text(args.json, json.dumps(report, indent=1))


def package_sizes(
    modules: Sequence[Module],
    default: dict[str, float],
    found: dict[str, tuple[float, int]],
    policy: dict[str, float],
) -> dict[str, dict[str, float]]:
    """Per package of MODULES, summed: the DEFAULT's bytes, the search's (FOUND: a module's
    smallest size and the moves kept for it) and the POLICY's. A module the search or the
    policy has no size for counts at the default's, with no move; one with no default size
    (clang failed on it) is left out."""
    packages: dict[str, dict[str, float]] = {}
    for m in modules:
        if m.name not in default:
            continue
        row = packages.setdefault(m.package, {"default": 0, "search": 0, "policy": 0, "moves": 0})
        size, moves = found.get(m.name, (default[m.name], 0))
        row["default"] += default[m.name]
        row["search"] += size
        row["moves"] += moves
        row["policy"] += policy.get(m.name, default[m.name])
    return packages


def moves_kept(r: SearchResult) -> int:
    return len(r.best.answerer.flips) + len(r.best.answerer.groups)


if __name__ == "__main__":
    main()
