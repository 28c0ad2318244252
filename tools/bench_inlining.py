"""The inlining issue's figures for a policy, in one table and one JSON file.

  .venv/bin/python tools/bench_inlining.py --policy policies/inlining-size \
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
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlgo.corpus.format import load_corpus  # noqa: E402
from mlgo.llvm.toolchain import find_toolchain  # noqa: E402
from mlgo.problems.policy import MLPPolicy  # noqa: E402
from mlgo.runtime.files import atomic_write_text  # noqa: E402
from mlgo.runtime.workers import LocalPool  # noqa: E402
from mlgo.train.evaluate import evaluate  # noqa: E402

console = Console()


def corpus_figures(policy: MLPPolicy, corpus: Path) -> dict:
    ev = evaluate(policy, load_corpus(corpus), find_toolchain(), LocalPool(2))
    packages = {name: row["delta"] * 100 for name, row in ev.per_package().items()}
    return {
        "total_delta_pct": ev.totals()["delta"] * 100,
        "default_text": ev.totals()["default_text_size"],
        "modules": len(ev.modules),
        "failed": len(ev.failed),
        "packages_delta_pct": packages,
    }


def program_figures(build_json: Path) -> dict:
    builds = json.loads(build_json.read_text())["builds"]
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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--policy", type=Path, default=ROOT / "policies" / "inlining-size")
    ap.add_argument("--train-corpus", type=Path, default=ROOT / "data" / "corpus")
    ap.add_argument("--heldout", type=Path, default=ROOT / "data" / "heldout")
    ap.add_argument("--programs", type=Path, default=ROOT / "data" / "programs" / "build.json")
    ap.add_argument("--runs", default="", help="comma-separated run dirs that made the policy")
    ap.add_argument("--out", type=Path, default=ROOT / "data" / "bench" / "inlining.json")
    args = ap.parse_args()

    policy = MLPPolicy.load(args.policy)
    result = {
        "policy": str(args.policy),
        "train": corpus_figures(policy, args.train_corpus),
        "heldout": corpus_figures(policy, args.heldout),
    }
    if args.programs.exists():
        result["linked_programs"] = program_figures(args.programs)
    if args.runs:
        result["training_cost"] = training_cost([Path(r) for r in args.runs.split(",")])

    table = Table("figure", "measured", title=f"inlining-size: {args.policy}")
    for split in ("train", "heldout"):
        r = result[split]
        worst = max(r["packages_delta_pct"].items(), key=lambda kv: kv[1])
        table.add_row(
            f"{split}: object .text vs -Oz ({r['modules']} modules)",
            f"{r['total_delta_pct']:+.2f}% (worst package {worst[0]} {worst[1]:+.2f}%)",
        )
    for name, row in result.get("linked_programs", {}).get("programs", {}).items():
        table.add_row(f"linked {name}", f"{row['delta_pct']:+.2f}% (tests {row['tests']})")
    if "training_cost" in result:
        table.add_row("training cost", f"{result['training_cost']['total_hours']:.2f} h")
    console.print(table)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(args.out, json.dumps(result, indent=1))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
