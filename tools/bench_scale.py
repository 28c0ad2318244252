"""Benchmark of the Ray backend: (a) its overhead against the local pool on this machine,
(b) a simulated scale-out over Ray worker nodes on loopback.

    .venv/bin/python -m tools.bench_scale --corpus data/corpus [--repeats 3] [--json F]

(a) Real collection (`mlgo.traces.collect.collect`, TFRecords included) of the same corpus with a
2-process local pool and with a 2-core Ray node (a head started like `ray start --head`),
passes interleaved with the order alternating per round; median and min..max modules/s.
The traces of the two backends are compared byte for byte.

(b) A Ray cluster grows node by node (1, 1, 2, 4, 8, 16 cores: 1 to 32 workers, each node
its own raylet and object store). Each task is one corpus module whose compilation is
modelled by sleeping for that module's compile time measured in (a) and returning a
trace of its real size (its decision count over the real feature specs), which the driver
writes as a TFRecord exactly as `collect` does. Throughput is the steady rate between the
10th and 90th percentile of completions. A run of zero-cost tasks gives the driver's
ceiling; the driver is the bottleneck past about ceiling x mean task time workers.
Ray's workers run at the local pool's CPU priority (RAY_worker_niceness=0; Ray's default
lowers it). Sleeping workers use no CPU, so 32 of them fit on 2 cores; the driver shares the cores
with the raylets, which a real cluster's driver would not.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from mlgo.corpus.format import Module, load_corpus
from mlgo.llvm.log_format import TensorSpec
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.problems import get_problem
from mlgo.programs.measure import median_and_range, paired_change
from mlgo.records import ModuleRun
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.workers import Failed, LocalPool, Workers
from mlgo.traces.collect import CollectTask, collect
from mlgo.traces.format import Manifest, trace_file, write_module_trace

console = Console()
PROBLEM = get_problem("inlining-size")
NODE_CORES = (1, 1, 2, 4, 8, 16)
SMALL_STORE = {"object_store_memory": 200 * 2**20, "include_dashboard": False}


def _cluster(head_cpus: int):
    from ray.cluster_utils import Cluster

    # Ray lowers its workers' CPU priority by default, which on a shared machine alone
    # slows their compiles; both backends run at the same priority here.
    os.environ["RAY_worker_niceness"] = "0"  # noqa: SIM112 (Ray spells it so)
    return Cluster(initialize_head=True, head_node_args={"num_cpus": head_cpus, **SMALL_STORE})


def _collect_pass(workers: Workers, corpus, tc: Toolchain, out: Path) -> tuple[float, Manifest]:
    start = time.monotonic()
    manifest = collect(PROBLEM, corpus, out, tc, workers)
    wall = time.monotonic() - start
    if manifest.failed:
        raise SystemExit(f"collection failed: {next(iter(manifest.failed.values()))}")
    return len(manifest.modules) / wall, manifest


def _same_traces(a: Path, b: Path, manifest: Manifest) -> bool:
    return all(
        (a / e["file"]).read_bytes() == (b / e["file"]).read_bytes()
        for e in manifest.modules.values()
    )


def overhead(corpus, tc: Toolchain, repeats: int, scratch: Path) -> dict:
    """(a): modules/s of real collection, local pool against a 2-core Ray node."""
    from mlgo.runtime.ray_workers import RayWorkers  # imports ray, as _cluster does

    cluster = _cluster(head_cpus=2)
    rates: dict[str, list[float]] = {"local": [], "ray": []}
    # Summed per-module compile seconds: slower compiles in the workers, as opposed to
    # scheduling or the driver, show here.
    work: dict[str, list[float]] = {"local": [], "ray": []}
    try:
        with LocalPool(2) as local, RayWorkers(cluster.address) as ray:
            backends = {"local": local, "ray": ray}
            for name, w in backends.items():  # start worker processes, fill the node cache
                _collect_pass(w, corpus.select([corpus.modules[0].package]), tc, scratch / name)
            for i in range(repeats):
                order = list(backends) if i % 2 == 0 else list(reversed(backends))
                for name in order:
                    out = scratch / f"{name}-{i}"
                    rate, manifest = _collect_pass(backends[name], corpus, tc, out)
                    rates[name].append(rate)
                    work[name].append(sum(e["seconds"] for e in manifest.modules.values()))
                console.print(
                    f"round {i + 1}: "
                    + ", ".join(
                        f"{k} {v[-1]:.2f} modules/s ({work[k][-1]:.0f} s of compiles)"
                        for k, v in rates.items()
                    )
                )
    finally:
        cluster.shutdown()
    last = repeats - 1
    ray_vs_local = paired_change(rates["ray"], rates["local"])
    return {
        "modules": len(corpus.modules),
        "local_modules_per_s": rates["local"],
        "ray_modules_per_s": rates["ray"],
        "local_compile_s": work["local"],
        "ray_compile_s": work["ray"],
        "ray_vs_local": ray_vs_local,
        "ray_vs_local_median": ray_vs_local["median"],
        "traces_identical": _same_traces(
            scratch / f"local-{last}", scratch / f"ray-{last}", manifest
        ),
        "manifest": manifest,
    }


@dataclass(frozen=True)
class SimulatedCompile:
    """A module's compilation as the driver sees it: it takes the module's measured time
    (times `scale`) and returns a trace of the module's real size; its metrics say when it
    ran (one clock: the nodes share this machine)."""

    cost: dict[str, tuple[float, int]]  # module -> (seconds, decisions)
    specs: tuple[TensorSpec, ...]
    scale: float = 1.0  # 0: the driver's ceiling

    def __call__(self, task: CollectTask) -> ModuleRun:
        seconds, n = self.cost[task.module.name]
        start = time.time()
        time.sleep(seconds * self.scale)
        zeros = np.zeros(n, np.int64)
        return ModuleRun(
            task.module.name,
            self.specs,
            [task.module.name] * n,
            {s.name: np.zeros((n, *s.shape), s.dtype) for s in self.specs},
            zeros,
            zeros,
            {"text_size": 0.0, "start": start, "end": time.time()},
            seconds,
        )


def _simulated_pass(
    workers: Workers, sim: SimulatedCompile, tasks: list, n_workers: int, out: Path
) -> tuple[float, float]:
    """Writes every trace, as `collect` does. Returns modules/s over the whole pass and
    the workers' busy fraction while there was work to hand out (from the start until
    the last task was submitted), which a heavy-tailed last task does not skew."""
    advice = PROBLEM.advice_name
    runs: list[ModuleRun] = []
    last_submit = len(tasks) - 2 * n_workers  # imap's window: one submit per result after it
    start = until = time.time()
    for i, (task, run) in enumerate(workers.imap(sim, tasks)):
        if isinstance(run, Failed):
            raise SystemExit(f"simulated task failed: {run.message}")
        write_module_trace(out / str(i) / trace_file(task.module.name), run, advice)
        runs.append(run)
        if i + 1 == last_submit:
            until = time.time()
    rate = len(runs) / (time.time() - start)
    spans = [(r.metrics["start"], r.metrics["end"]) for r in runs]
    return rate, busy_fraction(spans, start, until, n_workers)


def busy_fraction(
    spans: list[tuple[float, float]], start: float, until: float, n_workers: int
) -> float:
    """The share of N_WORKERS' time from START to UNTIL that the tasks' SPANS (each its
    start and end) filled; 0 for no time at all."""
    if until <= start:
        return 0.0
    busy = sum(max(0.0, min(end, until) - max(begin, start)) for begin, end in spans)
    return busy / (n_workers * (until - start))


def scale_out(
    modules: tuple[Module, ...],
    manifest: Manifest,
    tc: Toolchain,
    scratch: Path,
    max_workers: int,
    scales: list[float],
) -> dict:
    """(b): modules/s against the number of Ray workers, and the driver's ceiling."""
    specs = tuple(TensorSpec.from_json(s) for s in manifest.specs)
    cost = {n: (e["seconds"], e["decisions"]) for n, e in manifest.modules.items()}
    mean = statistics.fmean(s for s, _ in cost.values())
    rng = np.random.default_rng(0)
    by_name = {m.name: m for m in modules}
    names = sorted(cost)

    def tasks(n: int) -> list[CollectTask]:  # module costs drawn from the measured ones
        return [
            CollectTask(PROBLEM, by_name[names[i]], tc.clang) for i in rng.choice(len(names), n)
        ]

    rows = []
    from mlgo.runtime.ray_workers import RayWorkers  # imports ray, as _cluster does

    cluster = _cluster(head_cpus=0)
    try:
        workers_total = 0
        with RayWorkers(cluster.address) as ray:
            for cores in NODE_CORES:
                if workers_total + cores > max_workers:
                    break
                cluster.add_node(num_cpus=cores, **SMALL_STORE)
                cluster.wait_for_nodes()
                workers_total += cores
                w = workers_total
                warm = SimulatedCompile({k: (0.5, 1) for k in cost}, specs)
                _simulated_pass(ray, warm, tasks(2 * w), w, scratch / "warm")
                for scale in scales:
                    linear = w / (mean * scale)
                    n = math.ceil(10 * linear) + 2 * w  # about 10 s of work if linear
                    sim = SimulatedCompile(cost, specs, scale)
                    rate, busy = _simulated_pass(ray, sim, tasks(n), w, scratch / "s")
                    rows.append(
                        {
                            "workers": w,
                            "time_scale": scale,
                            "tasks": n,
                            "linear_modules_per_s": linear,
                            "busy": busy,
                            "modules_per_s": busy * linear,
                            "pass_modules_per_s": rate,
                        }
                    )
                    console.print(
                        f"{w:>3} workers, time x{scale:g}: {busy * linear:6.1f} modules/s "
                        f"(linear {linear:6.1f}, workers busy {busy:.0%}; whole pass "
                        f"{rate:.1f}/s)"
                    )
            ceiling, _ = _simulated_pass(
                ray, SimulatedCompile(cost, specs, 0.0), tasks(1500), w, scratch / "c"
            )
    finally:
        cluster.shutdown()
    console.print(f"driver ceiling (zero-cost tasks, {workers_total} workers): {ceiling:.0f}/s")
    return {
        "mean_task_s": mean,
        "points": rows,
        "driver_ceiling_modules_per_s": ceiling,
        "driver_bound_from_workers": ceiling * mean,
    }


def main(
    corpus: Annotated[Path, typer.Option(help="corpus directory")],
    packages: Annotated[str, typer.Option(help="comma-separated subset (default: all)")] = "",
    repeats: Annotated[int, typer.Option(help="rounds of local/Ray passes")] = 3,
    max_workers: Annotated[int, typer.Option(help="(b): the largest simulated cluster")] = 32,
    time_scales: Annotated[
        str, typer.Option(help="(b): task times x each of these (below 1: a faster compiler)")
    ] = "1,0.25",
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    tc = find_toolchain()
    selected = load_corpus(corpus).select([p for p in packages.split(",") if p])
    scales = [float(x) for x in time_scales.split(",")]
    console.print(f"{tc.describe()}, {len(selected.modules)} modules, {os.cpu_count()} cores")
    with tempfile.TemporaryDirectory(prefix="mlgo-bench-") as d:
        a = overhead(selected, tc, repeats, Path(d))
        manifest = a.pop("manifest")
        b = scale_out(selected.modules, manifest, tc, Path(d), max_workers, scales)
    figures = {"toolchain": tc.describe(), "overhead": a, "scale_out": b}

    console.print(
        f"(a) collection, {a['modules']} modules: local "
        f"{statistics.median(a['local_modules_per_s']):.2f} modules/s, Ray "
        f"{statistics.median(a['ray_modules_per_s']):.2f} modules/s; Ray vs local "
        f"{median_and_range(a['ray_vs_local'])}; traces identical: {a['traces_identical']}"
    )
    table = Table(
        "workers", "task time", "modules/s", "linear", "workers busy", title="(b) simulated"
    )
    for p in b["points"]:
        table.add_row(
            str(p["workers"]),
            f"x{p['time_scale']:g}",
            f"{p['modules_per_s']:.1f}",
            f"{p['linear_modules_per_s']:.1f}",
            f"{p['busy']:.0%}",
        )
    console.print(table)
    console.print(
        f"mean task {b['mean_task_s']:.3f} s; driver ceiling "
        f"{b['driver_ceiling_modules_per_s']:.0f} modules/s: the driver is the bottleneck "
        f"from about {b['driver_bound_from_workers']:.0f} workers at x1"
    )
    if json_out:
        atomic_write_text(json_out, json.dumps(figures, indent=1))


if __name__ == "__main__":
    typer.run(main)
