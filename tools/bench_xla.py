"""Benchmark of the XLA GEMM cost model on held-out programs (the issue's figures).

Model quality and benefit come from the measured dataset (every config of every held-out
program was timed by `mlgo xla collect`); tuning cost is measured live here: lowering,
graph extraction, the model and the compilation of its pick, per program, against what
exhaustive autotuning spent (every config compiled and timed, from the dataset). The
model's own compilation happens once per process and is reported apart (model_warmup_s).

    .venv/bin/python tools/bench_xla.py --data data/xla-runs --model policies/xla-gemm-tile \
        --json data/bench/xla.json --plot data/bench/xla.png
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from mlgo.fsutil import atomic_write_text
from mlgo.xla.dataset import load_dataset
from mlgo.xla.extract import lower
from mlgo.xla.model import CostModel
from mlgo.xla.programs import example_inputs, load_corpus
from mlgo.xla.report import evaluate, plot, summary, to_json
from mlgo.xla.tune import choose


def tuning_seconds(corpus: Path, names: list[str], model: CostModel, top_k: int) -> dict:
    """Wall time of the model's tuning per program, and the config it picked."""
    programs = {p.name: p for p in load_corpus(corpus)}
    out = {}
    for name in names:
        p = programs[name]
        start = time.perf_counter()
        choice, _ = choose(lower(p), model, top_k, tuple(example_inputs(p)), {})
        out[name] = {"seconds": time.perf_counter() - start, "config": choice.config}
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--programs", type=Path, default=Path("corpus/xla"))
    ap.add_argument("--top-k", type=int, default=3, help="also time tuning with measurement")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args()

    ds = load_dataset(args.data)
    model = CostModel.load(args.model)
    fixed = model.info["best_fixed_config"]
    held = ds.split(held_out=True)
    rows = evaluate(held, model, fixed)
    totals = summary(rows)
    names = [r.name for r in held]
    exhaustive = sum(r.exhaustive_seconds() for r in held)
    by_name = {r.name: r for r in held}
    start = time.perf_counter()
    model.predict([held[0].graph])  # the model's own one-time compilation, per process
    totals["model_warmup_s"] = time.perf_counter() - start
    for k in (1, args.top_k):
        tuned = tuning_seconds(args.programs, names, model, k)
        spent = sum(t["seconds"] for t in tuned.values())
        picked = [by_name[n].times()["default"] / by_name[n].times()[t["config"]]
                  for n, t in tuned.items()]  # fmt: skip
        totals[f"top{k}_tuning_s"] = spent
        totals[f"top{k}_tuning_vs_exhaustive"] = spent / exhaustive
        totals[f"top{k}_tuning_with_warmup_vs_exhaustive"] = (
            spent + totals["model_warmup_s"]
        ) / exhaustive
        totals[f"top{k}_pick_vs_default_geomean"] = float(np.exp(np.mean(np.log(picked))))
        totals[f"top{k}_worst_vs_default"] = min(picked)
    totals["exhaustive_s"] = exhaustive
    totals["best_fixed_config"] = fixed
    for k, v in totals.items():
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    for r in rows:
        print(f"  {r.program:28s} {r.chosen:8s} vs default {r.vs_default:5.2f}x  "
              f"gap {r.top1_gap:+6.1%}  tau {r.kendall_tau:+.2f}  roofline tau "
              f"{r.roofline_tau:+.2f}")  # fmt: skip
    if args.json:
        atomic_write_text(args.json, json.dumps({"summary": totals, "rows": to_json(rows)},
                                                indent=1))  # fmt: skip
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
