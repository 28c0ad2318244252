"""How much smaller could inlining make each module at -Oz, if its decisions were chosen by
looking at that module's own size? A reference for what any inlining policy can reach.

  .venv/bin/python tools/headroom_inlining.py --corpus data/corpus \
      --packages bzip2,libyaml,lua,lz4,zlib --policy policies/inlining-size \
      --json data/bench/headroom.json

A greedy search per module over "flip the k-th decision the compiler asks" (every answer
is the default heuristic's, except at the flipped indices). Each pass compiles every single
flip from the current set; then the flips that helped are added one at a time, best
first, each kept only if a real compile of the whole set confirms it. Every size reported
was measured. A search that sees the module's size is not a policy (a policy sees only
features, and must work on modules it never saw), so what it finds is a ceiling for what
a policy can be expected to reach, though not a proof that nothing better exists.
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

from rich.console import Console
from rich.progress import Progress
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlgo.corpus.format import Module, load_corpus  # noqa: E402
from mlgo.llvm.log_format import Observation  # noqa: E402
from mlgo.llvm.toolchain import find_toolchain  # noqa: E402
from mlgo.problems import get_problem  # noqa: E402
from mlgo.problems.policy import MLPPolicy  # noqa: E402
from mlgo.runtime.files import atomic_write_text  # noqa: E402
from mlgo.runtime.workers import Failed, LocalPool, Workers  # noqa: E402
from mlgo.train.evaluate import EvalTask, baseline, eval_one, evaluate  # noqa: E402

PROBLEM = "inlining-size"
console = Console()


@dataclass(frozen=True)
class FlipPolicy:
    """The default heuristic's answers, flipped at the given decision indices."""

    flips: frozenset[int]

    def __call__(self, obs: Observation) -> int:
        default = get_problem(PROBLEM).default_advice(obs)
        return 1 - default if obs.index in self.flips else default


@dataclass
class Search:
    module: Module
    size: float  # the smallest .text measured so far, with `flips`
    decisions: int
    flips: frozenset[int] = frozenset()
    compiles: int = 0


def run_tasks(workers: Workers, tasks: list[EvalTask], label: str) -> list[tuple[EvalTask, dict]]:
    """All results; a compile that failed counts as no improvement (and is reported)."""
    out = []
    with Progress(console=console) as bar:
        job = bar.add_task(label, total=len(tasks))
        for task, r in workers.imap(eval_one, tasks):
            bar.advance(job)
            if isinstance(r, Failed):
                console.print(f"[yellow]{task.module.name}: {r.message}")
            else:
                out.append((task, r))
    return out


def search_pass(searches: list[Search], workers: Workers, clang: str, max_confirm: int) -> None:
    """One pass: every single flip from each module's current set, then the helpful
    ones added best first, each confirmed by compiling the whole set."""
    tasks = [
        EvalTask(PROBLEM, s.module, clang, FlipPolicy(s.flips ^ {i}), tag=n)
        for n, s in enumerate(searches)
        for i in range(s.decisions)
    ]
    gains: list[list[tuple[float, int]]] = [[] for _ in searches]
    for task, r in run_tasks(workers, tasks, "single flips"):
        s = searches[task.tag]
        s.compiles += 1
        if r["text_size"] < s.size:
            (index,) = task.policy.flips ^ s.flips
            gains[task.tag].append((r["text_size"], index))
    queues = [sorted(g)[:max_confirm] for g in gains]
    while any(queues):  # one candidate per module per round, all modules in parallel
        tasks = []
        for n, q in enumerate(queues):
            if q:
                _, index = q.pop(0)
                flips = searches[n].flips ^ {index}
                tasks.append(EvalTask(PROBLEM, searches[n].module, clang, FlipPolicy(flips), n))
        for task, r in run_tasks(workers, tasks, "confirming"):
            s = searches[task.tag]
            s.compiles += 1
            if r["text_size"] < s.size:
                s.size, s.flips, s.decisions = r["text_size"], task.policy.flips, r["decisions"]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--packages", help="comma-separated; default: all of the corpus")
    ap.add_argument("--policy", type=Path, help="also evaluate this policy on the same modules")
    ap.add_argument("--passes", type=int, default=2)
    ap.add_argument("--max-confirm", type=int, default=30, help="flips tried per module per pass")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()

    corpus = load_corpus(args.corpus)
    corpus = corpus.select(args.packages.split(",") if args.packages else None)
    tc = find_toolchain()
    workers = LocalPool(args.workers)
    base, _ = baseline(corpus, tc, workers, PROBLEM)
    probe = [EvalTask(PROBLEM, m, tc.clang, None) for m in corpus.modules if m.name in base]
    searches = [
        Search(task.module, base[task.module.name]["text_size"], int(r["decisions"]))
        for task, r in run_tasks(workers, probe, "default decisions")
        if r["decisions"] > 0
    ]
    for p in range(args.passes):
        search_pass(searches, workers, tc.clang, args.max_confirm)
        found = sum(base[s.module.name]["text_size"] - s.size for s in searches)
        console.print(f"pass {p + 1}: {found:,.0f} bytes smaller in total")

    policy_size: dict[str, float] = {}
    if args.policy:
        ev = evaluate(MLPPolicy.load(args.policy), corpus, tc, workers, PROBLEM)
        policy_size = {name: r["text_size"] for name, r in ev.modules.items()}
    workers.close()

    packages: dict[str, dict[str, float]] = {}
    searched = {s.module.name: s for s in searches}
    for m in corpus.modules:
        row = packages.setdefault(m.package, {"default": 0, "search": 0, "policy": 0, "flips": 0})
        default = base[m.name]["text_size"]
        row["default"] += default
        row["search"] += searched[m.name].size if m.name in searched else default
        row["flips"] += len(searched[m.name].flips) if m.name in searched else 0
        row["policy"] += policy_size.get(m.name, default)
    total = {
        k: sum(r[k] for r in packages.values()) for k in ("default", "search", "policy", "flips")
    }
    table = Table(title="inlining headroom at -Oz: object .text against the default heuristic")
    for col in ("package", "default bytes", "search", "flips kept", "policy"):
        table.add_column(col, justify="left" if col == "package" else "right")
    for name, row in [*packages.items(), ("total", total)]:
        table.add_row(
            name,
            f"{row['default']:,.0f}",
            f"{100 * (row['search'] / row['default'] - 1):+.2f}%",
            f"{row['flips']:,.0f}",
            f"{100 * (row['policy'] / row['default'] - 1):+.2f}%" if args.policy else "",
        )
    console.print(table)
    compiles = sum(s.compiles for s in searches)
    console.print(f"compiles: {compiles:,}")
    if args.json:
        report = {
            "corpus": str(args.corpus),
            "passes": args.passes,
            "packages": packages,
            "total": total,
            "compiles": compiles,
            "modules": {
                s.module.name: {
                    "default": base[s.module.name]["text_size"],
                    "search": s.size,
                    "flips": sorted(s.flips),
                    "decisions": s.decisions,
                }
                for s in searches
            },
        }
        atomic_write_text(args.json, json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
