"""Which default is the XLA GEMM speedup measured against? relu(a @ b), f32, a few shapes.

Every baseline and tile runs in its own process (XLA_FLAGS are process-global, as they are
for a user), optionally pinned to one core, and prints the median call time per shape (median
of `--rounds` rounds, each the median of enough calls to last ~20 ms) and the rounds'
spread. Outputs are checked against numpy. Baselines: XLA's default path, the default with
XNNPACK off, with YNNPACK off (multi-threaded Eigen), single-threaded Eigen (`eigen`), and
tiles given the old way (XLA_FLAGS with YNNPACK left on) and the way mlgo selects them
(config.compiler_options, per compilation).

    flock LOCK nice -n -10 .venv/bin/python -m tools.bench_xla_baselines \
        --json data/bench/xla-baselines.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time
from pathlib import Path

from mlgo.runtime.files import atomic_write_text
from mlgo.xla.config import parse_config

SHAPES = [(128, 128, 128), (32, 2048, 512), (256, 256, 256), (64, 512, 512), (128, 1024, 128),
          (512, 128, 512), (16, 1024, 1024)]  # fmt: skip
NO_YNN = "--xla_cpu_experimental_ynn_fusion_type="
LEGACY = (
    "--xla_backend_extra_options="
    "xla_force_enable_experimental_llvm_ir_gemm,xla_llvm_ir_gemm_tile_size="
)
# name -> (XLA_FLAGS, mlgo config or "" for none)
BASELINES = {
    "default": ("", ""),
    "no_xnnpack": ("--xla_cpu_use_xnnpack=false", ""),
    "no_ynnpack": (NO_YNN, ""),
    "eigen": ("", "eigen"),
}


def run_one(flags: str, config: str, rounds: int) -> dict:
    """In this process: every shape compiled under (flags, config) and timed."""
    import jax
    import numpy as np

    from mlgo.xla.config import compiler_options

    out = {}
    rng = np.random.default_rng(0)
    for m, k, n in SHAPES:
        a = rng.standard_normal((m, k)).astype(np.float32)
        b = rng.standard_normal((k, n)).astype(np.float32)
        ja, jb = jax.numpy.asarray(a), jax.numpy.asarray(b)
        low = jax.jit(lambda x, y: jax.nn.relu(x @ y)).lower(ja, jb)
        start = time.perf_counter()
        fn = low.compile(compiler_options=compiler_options(config) if config else None)
        compile_s = time.perf_counter() - start
        ref = np.maximum(a @ b, 0)
        err = float(np.max(np.abs(np.asarray(fn(ja, jb)) - ref)) / np.max(np.abs(ref)))
        first = min(_time(fn, ja, jb) for _ in range(3))
        calls = max(3, min(500, int(0.02 / first)))
        per_round = []
        for _ in range(rounds):
            samples = sorted(_time(fn, ja, jb) for _ in range(calls))
            per_round.append(samples[len(samples) // 2])
        med = statistics.median(per_round)
        out[f"{m}x{k}x{n}"] = {
            "us": med * 1e6,
            "spread": (max(per_round) - min(per_round)) / med,
            "rel_error": err,
            "compile_s": compile_s,
        }
    return out


def _time(fn, a, b) -> float:
    start = time.perf_counter()
    fn(a, b).block_until_ready()
    return time.perf_counter() - start


def spawn(flags: str, config: str, cores: int, rounds: int) -> dict:
    env = dict(os.environ, XLA_FLAGS=flags)
    req = json.dumps({"flags": flags, "config": config, "cores": cores, "rounds": rounds})
    worker = [sys.executable, "-m", "tools.bench_xla_baselines", "--worker", req]
    proc = subprocess.run(worker, env=env, capture_output=True, text=True, timeout=300)
    if proc.returncode != 0:
        return {"error": (proc.stderr.strip().splitlines() or ["?"])[-1][:200]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def runs_for(tiles: list[str]) -> tuple[dict[str, tuple[str, str]], dict[str, str]]:
    """Every run, by name: the baselines, and each of TILES given three ways (XLA_FLAGS with
    YNNPACK on, the emitter alone, mlgo's config); and the runs whose tile is not a config
    mlgo takes, with why."""
    runs = dict(BASELINES)
    invalid: dict[str, str] = {}
    for t in tiles:
        runs[f"xla_flags:{t}"] = (LEGACY + t, "")
        runs[f"emitter:{t}"] = (f"{NO_YNN} --xla_cpu_multi_thread_eigen=false {LEGACY}{t}", "")
        runs[f"mlgo:{t}"] = ("", t)
        try:
            parse_config(t)
        except ValueError as e:
            invalid[f"mlgo:{t}"] = str(e)
    return runs, invalid


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--worker")
    ap.add_argument("--tiles", default="64:8:2,32:32:2,8:8:2,4:32:2,16:4:2")
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--repeats", type=int, default=2, help="processes per (config, cores)")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    if args.worker:
        req = json.loads(args.worker)
        if req["cores"] == 1:
            os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[-1]})
        resource.setrlimit(resource.RLIMIT_AS, (8 << 30, 8 << 30))
        print(json.dumps(run_one(req["flags"], req["config"], req["rounds"])))
        return
    runs, invalid = runs_for(args.tiles.split(","))
    results = []
    for rep in range(args.repeats):
        for cores in (1, 2):
            for name, (flags, config) in runs.items():
                if name in invalid:
                    results.append(
                        {"name": name, "cores": cores, "rep": rep, "error": invalid[name]}
                    )
                    continue
                res = spawn(flags, config, cores, args.rounds)
                results.append({"name": name, "cores": cores, "rep": rep, "shapes": res})
                print(name, cores, rep, json.dumps(res)[:400], flush=True)
    if args.json:
        atomic_write_text(args.json, json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
