"""The yield curve of a tune's search: bytes found against compiles spent, as a share of the
ceiling, on a project's recorded corpus (a tune's OUT/corpus).

  .venv/bin/python -m tools.bench_yield --corpus OUT/corpus --json data/yield/NAME.json

Every module is searched twice at --budget compiles (24: the ceiling's), as BC-Max's first
iteration searches it in a tune (mlgo/train/bcmax.py `search_module`): from the start
policy (its greedy trajectory and the default's, its least sure decisions first: the
policy as the search's prior), and from the default heuristic alone with every decision in
order (tools/headroom_inlining.py's search). Each search's anytime curve, the best size
after each compile, read at 1, 2, 4, 8 and 16 compiles a module, says what a smaller budget
would have found; the ceiling is the better of the two searches at the full budget, per
module. Beside them, the same searches read as if a module stopped getting compiles once
it went PATIENCE of them finding nothing, its compiles given to the others at the same
compile CPU (`yield_curve.stalled_found`). Compiles are counted in build-equivalents (one
plain compile of every module: the compile CPU of one build), at the search compile's
measured cost against the plain one. With --sample, the ceiling's share comes with its
90% interval over bootstrap resamples of the sampled modules (`sampled_share_interval`).
With search-first decisions a tune ships what its search found for every file it
searched, so this curve, plus the fixed cost of its builds, is what a tune's budget buys.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.corpus.format import load_corpus
from mlgo.corpus.stats import corpus_stats
from mlgo.data import shipped_policy
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems import get_problem
from mlgo.problems.policy_files import load_policy
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.workers import Failed, LocalPool
from mlgo.train.bcmax import SearchConfig, SearchResult, SearchTask, search_module
from mlgo.train.evaluate import baseline
from tools.lab.yield_curve import (
    build_equivalents,
    sampled_share_interval,
    stalled_found,
    yield_curve,
)

PROBLEM = get_problem("inlining-size")
POINTS = (1, 2, 4, 8, 16)
PATIENCE = 4  # compiles without a find before a module stops getting compiles
console = Console()


def fitted(cfg: SearchConfig, starts: int = 2) -> SearchConfig:
    """CFG with rounds small enough that a budget of a few compiles a module still ends
    one, its helpful moves combined: a search finds most where it combines them, and one
    cut off while measuring its moves one at a time keeps only the best single move. Half
    of what the budget leaves after the STARTS and a round's samples goes to a round's
    moves, split between group moves and single flips, never more than CFG's."""
    if not cfg.budget:
        return cfg
    moves = max(2, (cfg.budget - starts - cfg.samples) // 2)
    groups = min(cfg.groups or moves, moves // 2)
    return replace(cfg, groups=groups, singles=min(cfg.singles or moves, moves - groups))


def timed_search(task: SearchTask) -> tuple[SearchResult, float]:
    """One module's search and the seconds it took (a pool's task runs on one core)."""
    began = time.monotonic()
    return search_module(task), time.monotonic() - began


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--policy", type=Path, help="the start policy (default: the shipped one)")
    ap.add_argument("--budget", type=int, default=24, help="compiles a module: the ceiling's")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path)
    ap.add_argument("--sample", type=int, default=0, help="search this many modules, at random")
    ap.add_argument("--seed", type=int, default=0, help="of the sample")
    ap.add_argument("--priors", default="policy,greedy,default", help="the searches to run")
    ap.add_argument(
        "--fitted",
        action="store_true",
        help="also search at 4, 8, 16 and the budget with rounds sized to each",
    )
    args = ap.parse_args()

    corpus = load_corpus(args.corpus).require(PROBLEM)
    tc = find_toolchain()
    workers = LocalPool(args.workers)
    policy = load_policy(args.policy or shipped_policy(PROBLEM.name))
    metric = PROBLEM.reward_metric
    base = {n: r[metric] for n, r in baseline(corpus, tc, workers, PROBLEM).costs.items()}
    stats, _ = corpus_stats(corpus, tc.describe(), tc.clang, workers)
    plain = {n: s.get("seconds", 0.0) for n, s in stats.items()}
    priors = {
        "policy": lambda i, m: SearchTask(
            PROBLEM, m, tc.clang, policy, SearchConfig(budget=args.budget), True, i
        ),
        "greedy": lambda i, m: SearchTask(
            PROBLEM, m, tc.clang, policy, SearchConfig(budget=args.budget, greedy=True), True, i
        ),
        "default": lambda i, m: SearchTask(
            PROBLEM, m, tc.clang, None, SearchConfig(budget=args.budget, singles=0, groups=0)
        ),
    }
    priors = {p: priors[p] for p in args.priors.split(",")}
    modules = [m for m in corpus.modules if m.name in base]
    if args.sample and args.sample < len(modules):  # a random sample, named in the table
        rng = random.Random(args.seed)
        modules = sorted(rng.sample(modules, args.sample), key=lambda m: m.name)
        base = {m.name: base[m.name] for m in modules}
    curves: dict[str, dict[str, list[float]]] = {}
    ratio: dict[str, float] = {}
    fitted_found = {}
    if args.fitted:  # one search a budget, its rounds sized to it (bcmax.fitted)
        for k in (4, 8, 16, args.budget):
            cfg = fitted(SearchConfig(budget=k))
            tasks = [
                SearchTask(PROBLEM, m, tc.clang, policy, cfg, True, i)
                for i, m in enumerate(modules)
            ]
            fitted_found[k] = sum(
                max(base[t.module.name] - r[0].best.cost, 0.0)
                for t, r in workers.imap(timed_search, tasks)
                if not isinstance(r, Failed)
            )
    began = time.monotonic()
    for prior, make in priors.items():
        curves[prior], seconds, compiles = {}, {}, {}
        tasks = [make(i, m) for i, m in enumerate(modules)]
        for task, r in workers.imap(timed_search, tasks):
            if isinstance(r, Failed):
                console.print(f"[yellow]{task.module.name}: {r.message}", markup=False)
                continue
            result, took = r
            name = task.module.name
            curves[prior][name], seconds[name], compiles[name] = result.curve, took, result.compiles
        ratio[prior] = build_equivalents(seconds, compiles, plain)
    workers.close()
    gains = {
        m: max(base[m] - min(c[m][-1] for c in curves.values() if m in c), 0.0)
        for m in base
        if any(m in c for c in curves.values())
    }
    ceiling, total = sum(gains.values()), sum(base.values())
    spread = sampled_share_interval(gains, base, seed=args.seed) if args.sample else None
    found = {p: yield_curve(base, c, (*POINTS, args.budget)) for p, c in curves.items()}
    one_build = sum(plain[m] for m in curves[next(iter(curves))] if m in plain)
    stalled = {
        k: stalled_found(base, curves[next(iter(curves))], plain, k * one_build, PATIENCE)
        for k in (*POINTS, args.budget)
    }

    sampled = f" (a sample of {len(modules)} of {len(corpus.modules)})" if args.sample else ""
    table = Table(
        title=f"{args.corpus}: {len(modules)} modules{sampled}, {total:,.0f} bytes of {metric}"
    )
    table.add_column("compiles a module", justify="right")
    for prior in priors:
        table.add_column(f"from the {prior}: share of ceiling", justify="right")
        table.add_column("build-equivalents", justify="right")
    table.add_column(
        f"from the policy, a module stops after {PATIENCE} compiles finding nothing",
        justify="right",
    )
    for k in (*POINTS, args.budget):
        cells = []
        for prior in priors:
            share = found[prior][k] / ceiling if ceiling else float("nan")
            cells += [f"{100 * share:.0f}%", f"{k * ratio[prior]:.1f}"]
        cells.append(f"{100 * stalled[k] / ceiling:.0f}%" if ceiling else "")
        table.add_row(str(k), *cells)
    console.print(table)
    for k, v in fitted_found.items():
        console.print(
            f"fitted rounds at {k} compiles a module: {100 * v / ceiling:.0f}% of the ceiling"
        )
    interval = (
        f", 90% interval {100 * spread[0]:.2f}..{100 * spread[1]:.2f}% over resamples of the "
        "sample's modules"
        if spread
        else ""
    )
    console.print(
        f"ceiling: {ceiling:,.0f} bytes, {100 * ceiling / total:.2f}% of the corpus{interval} "
        f"(the better search per module at {args.budget} compiles); "
        f"{time.monotonic() - began:.0f} s on {args.workers} workers"
    )
    if args.json:
        report = {
            "corpus": str(args.corpus),
            "modules": len(modules),
            "total": total,
            "ceiling": ceiling,
            "ceiling_pct": 100 * ceiling / total,
            **({"ceiling_pct_interval": [100 * x for x in spread]} if spread else {}),
            "per_module": {m: {"default": base[m], "ceiling_gain": gains.get(m)} for m in base},
            "found": {p: {str(k): v for k, v in f.items()} for p, f in found.items()},
            "search_compile_ratio": ratio,
            "stalled": {str(k): v for k, v in stalled.items()},
            "patience": PATIENCE,
            "fitted": {str(k): v for k, v in fitted_found.items()},
        }
        atomic_write_text(args.json, json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
