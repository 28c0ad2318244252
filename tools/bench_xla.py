"""Benchmark of `tuned_jit` against `jax.jit` on held-out programs (issue 23's figures).

Held-out programs: the five of `bench_programs()`, 1-4 ms per call on two cores, are in no
corpus file, so the cost model was never trained, cross-validated or selected on them:
attn_4x256x128, mlp_256x256x1024, gemm_512x512x512, gemm_bias_384x768x256 and
mlp2_512x256x512 (the corpus's own functions at shapes 4-64x larger than any in it).

Per program, in one process and one interleaved run: `jax.jit` (the baseline), a second,
separately compiled `jax.jit` (the A/A control: what the noise alone makes of a ratio),
`tuned_jit` with the model alone, with `verify=True` and with `top_k=3`, and every config of
the search space compiled directly (`Compiled` objects, as an exhaustive autotuner would
time them; their ratios are to the default compiled the same way). Each of `--rounds`
rounds times `--calls` calls of every variant after a warm-up call, the order alternating
from round to round; a variant's figure is the median over rounds of the per-round ratio
`jax.jit` time / its time (above 1: faster than jax.jit), with the interquartile range.
The exhaustive ceiling is the best config's figure (the maximum of 16 noisy medians, so
biased upwards by about the A/A spread).

Tuning cost: each tuned variant's first call (empty tuning cache) minus a fresh jax.jit's
first call, against exhaustive search (every config compiled, then all timed against the
default with the verification protocol). Every variant is a new function object, so no
compilation is shared between them through jax's caches. The model's one-time costs, its
load per process and its compilation per graph size, are reported apart.
Dispatch: per-call time of `x + 1` on 4 floats, tuned against jax.jit, in interleaved rounds.

By default the process runs as users run jax (every core, default flags); `--pin` runs it
on one core (pinned before jax starts its threads). With `--data` the cost model's
ranking quality is also reported from a measured dataset (`mlgo xla collect`).

    .venv/bin/python -m tools.bench_xla --model policies/xla-gemm-tile \
        --json data/bench/xla-jit.json
    .venv/bin/python -m tools.bench_xla --model policies/xla-gemm-tile --pin \
        --json data/bench/xla-jit-1core.json
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from mlgo.runtime.files import atomic_write_text
from mlgo.xla.measure import pin
from mlgo.xla.programs import Program, spec
from mlgo.xla.report import geomean

JIT, AA = "jax.jit", "jax.jit A/A"
TUNERS = {"tuned": {}, "tuned verify": {"verify": True}, "tuned top3": {"top_k": 3}}


def bench_programs(corpus: Path) -> list[Program]:
    """The held-out programs: the corpus's functions at shapes no corpus program has."""
    from mlgo.xla.programs import load_corpus

    fn = {p.name: p.fn for p in load_corpus(corpus)}
    d, f = 256, 1024
    return [
        Program("attn_4x256x128", "attention", fn["attn_1x64x64"],
                (spec((4, 256, 128)),) + (spec((128, 128)),) * 4, True),
        Program("mlp_256x256x1024", "mlp", fn["mlp_16x64x256"],
                (spec((256, d)), spec((d, f)), spec((f,)), spec((f, d)), spec((d,))), True),
        Program("gemm_512x512x512", "gemm", fn["gemm_64x64x64_float32"],
                (spec((512, 512)), spec((512, 512))), True),
        Program("gemm_bias_384x768x256", "gemm", fn["gemm_bias_32x128x32"],
                (spec((384, 768)), spec((768, 256)), spec((256,))), True),
        Program("mlp2_512x256x512", "mlp", fn["mlp2_32x64x64"],
                (spec((512, 256)), spec((256, 512)), spec((512, 256))), True),
    ]  # fmt: skip


def interleaved(fns: dict[str, Callable], args: tuple, rounds: int, calls: int) -> dict:
    """Per variant, its median call time in each round (after one warm-up call; a median,
    so that a call preempted by another job does not count); the order of the variants
    alternates between rounds, so a drift hits all alike."""
    import jax

    times: dict[str, list[float]] = {name: [] for name in fns}
    order = list(fns)
    for r in range(rounds):
        for name in order if r % 2 == 0 else order[::-1]:
            fn = fns[name]
            jax.block_until_ready(fn(*args))
            samples = []
            for _ in range(calls):
                start = time.perf_counter()
                jax.block_until_ready(fn(*args))
                samples.append(time.perf_counter() - start)
            times[name].append(float(np.median(samples)))
    return times


def ratio(base: list[float], times: list[float]) -> dict[str, float]:
    """Median and interquartile range of the per-round ratios base / times."""
    r = np.asarray(base) / np.asarray(times)
    q25, median, q75 = np.percentile(r, [25, 50, 75])
    return {"median": float(median), "iqr": float(q75 - q25)}


def first_call(fn: Callable, args: tuple) -> float:
    import jax

    start = time.perf_counter()
    jax.block_until_ready(fn(*args))
    return time.perf_counter() - start


def bench_program(program: Program, model: Any, rounds: int, calls: int, cache: Path) -> dict:
    import jax

    from mlgo.xla.config import DEFAULT, SEARCH_SPACE, compiler_options
    from mlgo.xla.extract import extract_graph
    from mlgo.xla.programs import example_inputs
    from mlgo.xla.tune import measured_choice, tuned_jit

    args = tuple(example_inputs(program))

    def fresh() -> Callable:
        """The program as a new function object: nothing jax caches is shared with others."""
        return lambda *a: program.fn(*a)

    # The model's compilation for this program's graph size, once per process and size.
    start = time.perf_counter()
    model.predict([extract_graph(jax.jit(fresh()).lower(*args))])
    warmup_s = time.perf_counter() - start
    jit = jax.jit(fresh())
    fns: dict[str, Callable] = {JIT: jit, AA: jax.jit(fresh())}
    jit_first = first_call(jit, args)
    overhead, configs = {}, {}
    for name, kwargs in TUNERS.items():
        fns[name] = tuned_jit(fresh(), cost_model=model, cache_dir=cache / name, **kwargs)
        overhead[name] = first_call(fns[name], args) - jit_first
        (choice,) = fns[name].choices.values()
        configs[name] = choice.config
    start = time.perf_counter()
    lowered = jax.jit(fresh()).lower(*args)
    compiled = {c: lowered.compile(compiler_options=compiler_options(c)) for c in SEARCH_SPACE}
    exhaustive_pick = measured_choice(compiled, args, {})
    exhaustive_s = time.perf_counter() - start
    times = interleaved({**fns, **{f"config {c}": f for c, f in compiled.items()}}, args,
                        rounds, calls)  # fmt: skip
    vs_jit = {name: ratio(times[JIT], times[name]) for name in fns}
    per_config = {c: ratio(times[f"config {DEFAULT}"], times[f"config {c}"]) for c in compiled}
    best = max(per_config, key=lambda c: per_config[c]["median"])
    return {
        "program": program.name,
        "jit_ms": float(np.median(times[JIT])) * 1e3,
        "vs_jit": vs_jit,
        "configs": configs,
        "tuning_overhead_s": overhead,
        "model_warmup_s": warmup_s,
        "exhaustive_s": exhaustive_s,
        "exhaustive_pick": exhaustive_pick,
        "per_config": per_config,
        "best_config": best,
        "ceiling": per_config[best]["median"],
    }


def dispatch(model: Any, rounds: int, cache: Path) -> dict:
    """Per-call µs of a trivial jitted function: tuned_jit and the A/A against jax.jit."""
    import jax
    import jax.numpy as jnp

    from mlgo.xla.tune import tuned_jit

    def inc(x):
        return x + 1.0

    fns = {JIT: jax.jit(inc), AA: jax.jit(lambda x: inc(x)),
           "tuned": tuned_jit(inc, cost_model=model, cache_dir=cache)}  # fmt: skip
    times = interleaved(fns, (jnp.zeros(4),), rounds, 2000)
    med = {name: float(np.median(t)) * 1e6 for name, t in times.items()}
    return {"us": med, "tuned_minus_jit_us": med["tuned"] - med[JIT],
            "aa_minus_jit_us": med[AA] - med[JIT]}  # fmt: skip


def summary(rows: list[dict]) -> dict[str, float]:
    """Over the programs' ROWS (`bench_program`'s): the A/A's and each tuner's geomean and
    worst ratio to jax.jit, each tuner's tuning time against exhaustive search's, and the
    exhaustive ceiling's geomean."""
    out = {}
    for name in (AA, *TUNERS):
        xs = [r["vs_jit"][name]["median"] for r in rows]
        out[f"{name} geomean"], out[f"{name} worst"] = geomean(xs), min(xs)
        if name in TUNERS:
            spent = sum(r["tuning_overhead_s"][name] for r in rows)
            out[f"{name} tuning vs exhaustive"] = spent / sum(r["exhaustive_s"] for r in rows)
    out["ceiling geomean"] = geomean([r["ceiling"] for r in rows])
    return out


def dataset_figures(data: Path, model_dir: Path) -> dict:
    """The model's ranking quality on the dataset's held-out programs (mlgo xla report's)."""
    from mlgo.xla.dataset import load_dataset
    from mlgo.xla.model import CostModel
    from mlgo.xla.report import evaluate, summary

    model = CostModel.load(model_dir)
    ds = load_dataset(data)
    return summary(evaluate(ds.split(held_out=True), model, model.info["best_fixed_config"]))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", type=Path, required=True)
    ap.add_argument("--programs", type=Path, default=Path("corpus/xla"),
                    help="corpus whose functions the held-out programs use")  # fmt: skip
    ap.add_argument("--rounds", type=int, default=21)
    ap.add_argument("--calls", type=int, default=15, help="calls per round and variant")
    ap.add_argument("--only", default="", help="comma-separated program names")
    ap.add_argument("--pin", action="store_true", help="run on one core (the last)")
    ap.add_argument("--data", type=Path, help="also report ranking quality on this dataset")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.pin:
        pin(-1)  # before jax starts its thread pool, which inherits the affinity
    from mlgo.xla.tune import load_model

    start = time.perf_counter()
    model = load_model(args.model.resolve())  # once per process, reported apart
    load_s = time.perf_counter() - start
    programs = bench_programs(args.programs)
    if args.only:
        programs = [p for p in programs if p.name in args.only.split(",")]
    with tempfile.TemporaryDirectory(prefix="mlgo-bench-xla-") as tmp:
        rows = []
        for p in programs:
            rows.append(bench_program(p, model, args.rounds, args.calls, Path(tmp)))
            print(f"measured {p.name}", file=sys.stderr, flush=True)
        calls = dispatch(model, args.rounds, Path(tmp) / "dispatch")
    totals: dict[str, Any] = {"cores": len(os.sched_getaffinity(0)), "model_load_s": load_s}
    totals |= summary(rows)
    totals["dispatch"] = calls
    if args.data:
        totals["dataset"] = dataset_figures(args.data, args.model)
    print(f"{'program':24s} {'jit ms':>7s} " + " ".join(f"{n:>14s}" for n in (AA, *TUNERS))
          + "   ceiling (config)  picks")  # fmt: skip
    for r in rows:
        cells = " ".join(
            f"{r['vs_jit'][n]['median']:6.3f}x ±{r['vs_jit'][n]['iqr']:.3f}" for n in (AA, *TUNERS)
        )
        picks = f"{r['configs']} exhaustive: {r['exhaustive_pick']}"
        print(f"{r['program']:24s} {r['jit_ms']:7.2f} {cells}   {r['ceiling']:.3f}x "
              f"({r['best_config']})  {picks}")  # fmt: skip
    for k, v in totals.items():
        print(f"{k}: {v:.4g}" if isinstance(v, float) else f"{k}: {v}")
    if args.json:
        atomic_write_text(args.json, json.dumps({"summary": totals, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
