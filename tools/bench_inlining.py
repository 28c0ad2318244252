"""The inlining issue's figures for a policy, in one table and one JSON file.

  .venv/bin/python -m tools.bench_inlining --policy policies/inlining-size \
      --train-corpus data/corpus --heldout data/heldout --programs data/programs/build.json \
      --runs runs/bc,runs/es

- object .text against clang-22 -Oz on the training and the held-out corpus (fresh
  compiles of every module, both sides), total and per package;
- linked programs built from Debian sources with mlgo-cc, as `mlgo build` recorded them
  (run `mlgo build lua sqlite3 zstd` first; their own tests passed or it failed);
- training cost: wall time and compiles recorded by the runs that made the policy.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.corpus.format import load_corpus
from mlgo.data import shipped_policy
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import load_policy
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.workers import LocalPool
from mlgo.train.evaluate import Evaluation, evaluate

console = Console()


def corpus_figures(policy: MLPPolicy, corpus: Path) -> dict:
    ev = evaluate(policy, load_corpus(corpus), find_toolchain(), LocalPool(2), policy.problem)
    return evaluation_figures(ev)


def evaluation_figures(ev: Evaluation) -> dict:
    """An evaluation's change against -Oz, in total and per package, in percent."""
    packages = {name: row["delta"] * 100 for name, row in ev.per_package().items()}
    return {
        "total_delta_pct": ev.totals()["delta"] * 100,
        "default_text": ev.totals()[f"default_{ev.metric}"],
        "modules": len(ev.modules),
        "failed": len(ev.failed),
        "packages_delta_pct": packages,
    }


def program_figures(builds: list[dict]) -> dict:
    """Each linked program's .text with mlgo-cc against plain clang, from `mlgo build`'s
    build.json BUILDS, and the change over all of them."""
    plain = {b["package"]: b for b in builds if b["variant"] == "plain"}
    rows = {}
    for b in builds:
        if b["variant"] != "mlgo":
            continue
        base = plain[b["package"]]
        for prog, size in b["text"].items():
            rows[f"{b['package']}:{prog}"] = {
                "plain": base["text"][prog],
                "mlgo": size,
                "delta_pct": 100 * (size / base["text"][prog] - 1),
                "tests": f"{base['tests']}/{b['tests']}",
            }
    total_plain = sum(r["plain"] for r in rows.values())
    total_ml = sum(r["mlgo"] for r in rows.values())
    return {"programs": rows, "total_delta_pct": 100 * (total_ml / total_plain - 1)}


def training_cost(runs: list[Path]) -> dict:
    cost = {}
    for run in runs:
        state = json.loads((run / "state.json").read_text())
        cost[run.name] = {
            "algo": state["algo"],
            "seconds": state["seconds"],
            "compiles": state["compiles"],
            "steps": state["step"],
        }
    cost["total_hours"] = sum(c["seconds"] for c in cost.values()) / 3600
    return cost


def summary_rows(result: dict) -> list[tuple[str, str]]:
    """The table's rows, (figure, measured), of the figures in RESULT."""
    rows = []
    for split in ("train", "heldout"):
        r = result[split]
        worst = max(r["packages_delta_pct"].items(), key=lambda kv: kv[1])
        rows.append(
            (
                f"{split}: object .text vs -Oz ({r['modules']} modules)",
                f"{r['total_delta_pct']:+.2f}% (worst package {worst[0]} {worst[1]:+.2f}%)",
            )
        )
    for name, row in result.get("linked_programs", {}).get("programs", {}).items():
        rows.append((f"linked {name}", f"{row['delta_pct']:+.2f}% (tests {row['tests']})"))
    if "training_cost" in result:
        rows.append(("training cost", f"{result['training_cost']['total_hours']:.2f} h"))
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--policy", type=Path, default=shipped_policy("inlining-size"))
    ap.add_argument("--train-corpus", type=Path, default=Path("data/corpus"))
    ap.add_argument("--heldout", type=Path, default=Path("data/heldout"))
    ap.add_argument("--programs", type=Path, default=Path("data/programs/build.json"))
    ap.add_argument("--runs", default="", help="comma-separated run dirs that made the policy")
    ap.add_argument("--out", type=Path, default=Path("data/bench/inlining.json"))
    args = ap.parse_args()

    policy = load_policy(args.policy)
    result = {
        "policy": str(args.policy),
        "train": corpus_figures(policy, args.train_corpus),
        "heldout": corpus_figures(policy, args.heldout),
    }
    if args.programs.exists():
        result["linked_programs"] = program_figures(json.loads(args.programs.read_text())["builds"])
    if args.runs:
        result["training_cost"] = training_cost([Path(r) for r in args.runs.split(",")])

    table = Table("figure", "measured", title=f"inlining-size: {args.policy}")
    for row in summary_rows(result):
        table.add_row(*row)
    console.print(table)
    atomic_write_text(args.out, json.dumps(result, indent=1))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
