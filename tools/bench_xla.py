"""Benchmark of the XLA GEMM cost model on held-out programs (the issue's figures).

Model quality and benefit come from the measured dataset (every config of every held-out
program was timed by `mlgo xla collect`); tuning cost is measured live here: lowering,
graph extraction, the model and the compilation of its pick, per program, against what
exhaustive autotuning spent (every config compiled and timed, from the dataset). The
model's own compilation happens once per process and is reported apart (model_warmup_s).
Three ways of tuning are timed: the model alone (tuned_jit default, prefix top1_), its
pick verified by timing it against the default on the spot (verify=True, top1v_), and its
top K verified likewise (top_k=K, topKv_); each pick is judged on the dataset's
independent measurement.
The ceiling of any picker is the exhaustive best (best_vs_default_*), and every call pays
jax's dispatch, measured here as the time of a trivial jitted call (dispatch_floor_us).
The benchmark runs pinned to the core the dataset's workers used (`--cpu`), so that the
verifying measurements and the dataset that judges them see the same XLA thread count.

    .venv/bin/python tools/bench_xla.py --data data/xla-runs --model policies/xla-gemm-tile \
        --json data/bench/xla.json --plot data/bench/xla.png
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
from scipy.stats import kendalltau

from mlgo.runtime.files import atomic_write_text
from mlgo.xla.dataset import load_dataset
from mlgo.xla.extract import lower
from mlgo.xla.measure import MeasureSpec, pin
from mlgo.xla.model import CostModel
from mlgo.xla.programs import example_inputs, load_corpus
from mlgo.xla.report import evaluate, plot, summary, to_json
from mlgo.xla.tune import choose


def tuning_seconds(
    corpus: Path, names: list[str], model: CostModel, top_k: int, verify: bool
) -> dict:
    """Wall time of the model's tuning per program, and the config it picked."""
    programs = {p.name: p for p in load_corpus(corpus)}
    out = {}
    for name in names:
        p = programs[name]
        start = time.perf_counter()
        choice, _ = choose(lower(p), model, top_k, tuple(example_inputs(p)), {}, verify)
        out[name] = {"seconds": time.perf_counter() - start, "config": choice.config}
    return out


def fixed_order_tau(train: list, held: list) -> float:
    """Median Kendall tau of one program-independent order of the configs (their mean log
    runtime over default on the training programs): the baseline a model must beat."""
    configs = [c for c in held[0].times() if all(c in r.times() for r in train)]

    def log_ratios(r) -> np.ndarray:
        t = r.times()
        return np.log([t.get(c, np.nan) / t["default"] for c in configs])

    order = np.nanmean([log_ratios(r) for r in train], axis=0)
    taus = []
    for r in held:
        x = log_ratios(r)
        ok = ~np.isnan(x)
        taus.append(kendalltau(order[ok], x[ok]).statistic)
    return float(np.median(taus))


def dispatch_floor_us(calls: int = 2000) -> float:
    """Median wall time of a jitted x + 1 on 4 floats: what every call costs at least."""
    import jax
    import jax.numpy as jnp

    f = jax.jit(lambda x: x + 1.0)
    x = jnp.zeros(4)
    f(x).block_until_ready()
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        f(x).block_until_ready()
        samples.append(time.perf_counter() - start)
    return float(np.median(samples)) * 1e6


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--data", type=Path, required=True)
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--programs", type=Path, default=Path("corpus/xla"))
    ap.add_argument("--top-k", type=int, default=3, help="K of the verified top-K tuning")
    ap.add_argument("--split", choices=("held-out", "train"), default="held-out",
                    help="train: check tuning on the training programs")  # fmt: skip
    ap.add_argument("--cpu", type=int, default=MeasureSpec.cpu, help="core to pin to")
    ap.add_argument("--json", type=Path)
    ap.add_argument("--plot", type=Path)
    args = ap.parse_args()
    pin(args.cpu)  # before jax starts its thread pool, which inherits the affinity

    ds = load_dataset(args.data)
    model = CostModel.load(args.model)
    fixed = model.info["best_fixed_config"]
    held = ds.split(held_out=args.split == "held-out")
    rows = evaluate(held, model, fixed)
    totals = summary(rows)
    totals["fixed_order_kendall_tau_median"] = fixed_order_tau(ds.split(held_out=False), held)
    names = [r.name for r in held]
    exhaustive = sum(r.exhaustive_seconds() for r in held)
    # A lower bound of any exhaustive search: every config compiled, none timed.
    compile_only = sum(run.get("compile_s", 0.0) for r in held for run in r.runs.values())
    by_name = {r.name: r for r in held}
    start = time.perf_counter()
    model.predict([held[0].graph])  # the model's own one-time compilation, per process
    totals["model_warmup_s"] = time.perf_counter() - start
    picks: dict[str, dict[str, str]] = {}
    for k, verify in ((1, False), (1, True), (args.top_k, True)):
        tuned = tuning_seconds(args.programs, names, model, k, verify)
        spent = sum(t["seconds"] for t in tuned.values())
        label = f"top{k}v" if verify else f"top{k}"
        picked = [by_name[n].times()["default"] / by_name[n].times()[t["config"]]
                  for n, t in tuned.items()]  # fmt: skip
        picks[label] = {n: t["config"] for n, t in tuned.items()}
        totals[f"{label}_tuning_s"] = spent
        totals[f"{label}_tuning_vs_exhaustive"] = spent / exhaustive
        totals[f"{label}_tuning_vs_exhaustive_compile_only"] = spent / compile_only
        totals[f"{label}_tuning_with_warmup_vs_exhaustive"] = (
            spent + totals["model_warmup_s"]
        ) / exhaustive
        totals[f"{label}_pick_vs_default_geomean"] = float(np.exp(np.mean(np.log(picked))))
        gemm = [x for x, r in zip(picked, rows, strict=True) if r.gemm_dominated]
        totals[f"{label}_pick_vs_default_geomean_gemm"] = float(np.exp(np.mean(np.log(gemm))))
        totals[f"{label}_worst_vs_default"] = min(picked)
        totals[f"{label}_slower_than_0.98"] = sum(x < 0.98 for x in picked)
    totals["exhaustive_s"] = exhaustive
    totals["exhaustive_compile_only_s"] = compile_only
    totals["dispatch_floor_us"] = dispatch_floor_us()
    totals["best_fixed_config"] = fixed
    for k, v in totals.items():
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    for r in rows:
        print(f"  {r.program:28s} {r.chosen:8s} vs default {r.vs_default:5.2f}x  "
              f"gap {r.top1_gap:+6.1%}  tau {r.kendall_tau:+.2f}  roofline tau "
              f"{r.roofline_tau:+.2f}  repeat tau {r.repeat_tau:+.2f}  ceiling "
              f"{r.default_us / r.best_us:.3f}x ({r.best}; default "
              f"{r.default_us:.1f} us)")  # fmt: skip
    if args.json:
        result = {"summary": totals, "rows": to_json(rows), "picks": picks}
        atomic_write_text(args.json, json.dumps(result, indent=1))
    if args.plot:
        plot(rows, args.plot)


if __name__ == "__main__":
    main()
