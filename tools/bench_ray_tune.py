"""`mlgo tune --workers` on a Ray cluster of 1 and 2 worker nodes: what spreads, what stays.

  .venv/bin/python -m tools.bench_ray_tune --source SRC --build 'make' --work data/bench-ray

For each cluster size (a loopback cluster on this machine: a head that runs no tasks and
N one-core worker nodes, each its own raylet and object store, as tests/test_ray.py starts),
and for the local pool beside them:

- the searches' compiles per second: BC-Max's search (`search_module`, the shipped policy,
  SEARCH_BUDGET compiles a module) of every module of the tune's recorded corpus, through
  `make_workers`, timed from the first task to the last result;
- the whole tune, `mlgo tune --workers ADDRESS` into WORK/<workers>, one training step:
  each stage's wall time from OUT/stages.json. Collect and train run on the workers; record,
  decisions, build and report stay on this machine, serial whatever the cluster's size.

A loopback cluster's nodes share this machine's cores (two here), so its rows measure what
Ray costs (task shipping, the object store, worker start-up), not a speed-up: on a real
cluster each node brings its own cores.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.corpus.format import load_corpus
from mlgo.data import shipped_policy
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems import get_problem
from mlgo.problems.policy_files import load_policy
from mlgo.runtime.workers import Failed, make_workers
from mlgo.train.bcmax import SearchConfig, SearchTask, search_module

PROBLEM = "inlining-size"
SEARCH_BUDGET = 48  # compiles a module, a tune's (`chain.OWN_CODE`)
STAGES = ("record", "collect", "train", "decisions", "build", "report")


def run_tune(args: argparse.Namespace, workers: str, out: Path) -> dict:
    """`mlgo tune` on ARGS's project with WORKERS into OUT: its stages' wall seconds."""
    command = [sys.executable, "-m", "mlgo.cli", "tune", "--source", str(args.source)]
    for line in args.build:
        command += ["--build", line]
    for line in args.test or ():
        command += ["--test", line]
    command += ["--minutes", "100", "--train-steps", "1", "--workers", workers, "--out", str(out)]
    subprocess.run(command, check=True, stdout=subprocess.DEVNULL)
    return json.loads((out / "stages.json").read_text())["seconds"]


def search_rate(corpus_dir: Path, workers: str) -> tuple[int, float]:
    """The compiles of BC-Max's search of every module in CORPUS_DIR on WORKERS, and their
    wall seconds."""
    problem = get_problem(PROBLEM)
    corpus = load_corpus(corpus_dir).require(problem)
    tc, policy = find_toolchain(), load_policy(shipped_policy(PROBLEM))
    cfg = SearchConfig(budget=SEARCH_BUDGET)
    tasks = [
        SearchTask(problem, m, tc.clang, policy, cfg, seed=i) for i, m in enumerate(corpus.modules)
    ]
    with make_workers(workers) as pool:
        began = time.monotonic()
        results = [r for _, r in pool.imap(search_module, tasks)]
        seconds = time.monotonic() - began
    failed = [r.message for r in results if isinstance(r, Failed)]
    if failed:
        raise SystemExit(f"a search failed: {failed[0]}")
    return sum(r.compiles for r in results), seconds


def measure(args: argparse.Namespace, workers: str, label: str) -> list[str]:
    """One row: the tune with WORKERS into WORK/LABEL, then the search timed there."""
    out = args.work / label
    stages = run_tune(args, workers, out)
    compiles, seconds = search_rate(out / "corpus", workers)
    return [
        label,
        str(compiles),
        f"{seconds:.1f}",
        f"{compiles / seconds:.1f}",
        *(f"{stages.get(s, 0.0):.1f}" for s in STAGES),
        f"{sum(stages.values()):.1f}",
    ]


def on_cluster(args: argparse.Namespace, nodes: int) -> list[str]:
    """MEASURE on a loopback cluster of NODES one-core worker nodes."""
    from ray.cluster_utils import Cluster

    small = {"object_store_memory": 80 * 2**20}
    head = {"num_cpus": 0, "include_dashboard": False, **small}
    cluster = Cluster(initialize_head=True, head_node_args=head)
    try:
        for _ in range(nodes):
            cluster.add_node(num_cpus=1, **small)
        cluster.wait_for_nodes()
        return measure(args, cluster.address, f"ray-{nodes}-nodes")
    finally:
        cluster.shutdown()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--source", type=Path, required=True, help="the project's source")
    parser.add_argument("--build", action="append", required=True, help="build shell line")
    parser.add_argument("--test", action="append", help="test shell line")
    parser.add_argument("--nodes", type=int, nargs="+", default=[1, 2], help="cluster sizes")
    parser.add_argument("--local", type=int, default=2, help="processes of the local row")
    parser.add_argument("--work", type=Path, default=Path("data/bench-ray"), help="OUTs here")
    args = parser.parse_args()
    args.work.mkdir(parents=True, exist_ok=True)
    table = Table(title=f"mlgo tune --workers: {args.source.name}, search budget {SEARCH_BUDGET}")
    for column in ("workers", "compiles", "search s", "compiles/s", *STAGES, "total s"):
        table.add_column(column, justify="right")
    table.add_row(*measure(args, str(args.local), f"local-{args.local}"))
    for nodes in args.nodes:
        table.add_row(*on_cluster(args, nodes))
    Console(width=200).print(table)  # every column whole in a log too


if __name__ == "__main__":
    main()
