"""Benchmark of the foundation: corpus size, collection throughput, channel overhead against
plain clang on the same modules in the same run, per-decision round trip, and replay fidelity.

    .venv/bin/python -m tools.bench_collect --corpus data/corpus [--repeats 3] [--json F]

Plain and channel passes alternate (plain, channel, plain, channel, ...) over the whole
corpus on a 2-process pool, so machine noise hits both; medians and min..max are reported.
"""

from __future__ import annotations

import io
import json
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from mlgo.corpus.compile import compile_module, compile_plain, replay_matches_default
from mlgo.corpus.format import Module, load_corpus
from mlgo.llvm.channel import fifo_pair, serve
from mlgo.llvm.log_format import Header, LogWriter, TensorSpec
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems import get_problem
from mlgo.programs.measure import median_and_range, paired_change
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.workers import Failed, LocalPool
from mlgo.traces.collect import collect
from tools.lab.responder import build_responder, compile_with_native_responder

console = Console()
PROBLEM = get_problem("inlining-size")


@dataclass(frozen=True)
class Task:
    module: Module
    clang: str
    mode: str  # plain | channel | native | replay
    responder: Path  # tools/default_responder.c built, for the native mode


def run_task(task: Task) -> dict:
    if task.mode == "plain":
        with tempfile.TemporaryDirectory() as d:
            return compile_plain(PROBLEM, task.module, task.clang, Path(d) / "o.o")
    if task.mode == "channel":
        run = compile_module(PROBLEM, task.module, task.clang)
        return {"decisions": run.num_decisions, "seconds": run.seconds, **run.metrics}
    if task.mode == "native":
        return compile_with_native_responder(PROBLEM, task.module, task.clang, task.responder)
    return {"match": replay_matches_default(PROBLEM, task.module, task.clang)}


def run_pass(
    pool: LocalPool, modules, clang: str, mode: str, responder: Path
) -> tuple[float, dict]:
    start = time.monotonic()
    results = {}
    tasks = [Task(m, clang, mode, responder) for m in modules]
    for task, result in pool.imap(run_task, tasks):
        if isinstance(result, Failed):
            raise SystemExit(f"{mode} pass failed: {result.message}")
        results[task.module.name] = result
    return time.monotonic() - start, results


def overheads(walls: dict[str, list[float]], work: dict[str, list[float]]) -> dict[str, dict]:
    """The native and channel modes' change against plain clang, round by round
    (`paired_change`): in a pass's wall time (WALLS: "pass native", "pass channel") and in
    the summed per-module compile time (WORK: "work native", "work channel")."""
    return {
        f"{clock} {mode}": paired_change(series[mode], series["plain"])
        for clock, series in (("pass", walls), ("work", work))
        for mode in ("native", "channel")
    }


def package_totals(
    modules: Sequence[Module], channel: dict[str, dict], plain: dict[str, dict]
) -> dict[str, dict[str, int]]:
    """Per package of MODULES: how many, their inlining decisions (CHANNEL: each module's
    channel compile) and their .text at -Oz (PLAIN: each module's plain compile)."""
    packages: dict[str, dict[str, int]] = {}
    for m in modules:
        row = packages.setdefault(m.package, {"modules": 0, "decisions": 0, "text_size": 0})
        row["modules"] += 1
        row["decisions"] += channel[m.name]["decisions"]
        row["text_size"] += int(plain[m.name]["text_size"])
    return packages


def _echo_compiler(base: str, n: int, result_path: str) -> None:
    """Plays the compiler's side of the channel and times each observation -> advice."""
    specs = tuple(TensorSpec(f, "int64_t", (1,)) for f in PROBLEM.feature_names)
    header = Header(
        specs + (TensorSpec("inlining_default", "int64_t", (1,)),),
        advice=TensorSpec("inlining_decision", "int64_t", (1,)),
    )
    prologue = io.BytesIO()
    LogWriter(prologue, header).context("")
    # Like the compiler, send pre-encoded bytes: time our side, not a Python peer's.
    observation = (
        b'{"observation": 0}\n' + np.ones(len(header.features), np.int64).tobytes() + b"\n"
    )
    times = []
    # The compiler's opening order: .in first, then .out.
    with (
        open(base + ".in", "rb", buffering=0) as advice_in,
        open(base + ".out", "wb", buffering=0) as out,
    ):
        out.write(prologue.getvalue())
        for _ in range(n):
            t0 = time.perf_counter()
            out.write(observation)
            got = advice_in.read(8)
            times.append(time.perf_counter() - t0)
            assert len(got) == 8
    Path(result_path).write_text(json.dumps(times))


def round_trip_us(n: int = 20000) -> tuple[float, float]:
    import multiprocessing

    with fifo_pair() as base, tempfile.NamedTemporaryFile(suffix=".json") as res:
        peer = multiprocessing.get_context("spawn").Process(
            target=_echo_compiler, args=(base, n, res.name)
        )
        peer.start()
        serve(base, PROBLEM.default_advice, peer.is_alive, 30.0)
        peer.join(60)
        times = np.array(json.loads(Path(res.name).read_text())[n // 10 :]) * 1e6
    return float(np.median(times)), float(np.percentile(times, 99))


def main(
    corpus: Annotated[Path, typer.Option(help="corpus directory")],
    repeats: Annotated[int, typer.Option(help="plain/channel pass pairs")] = 3,
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    tc = find_toolchain()
    modules = load_corpus(corpus).modules
    pool = LocalPool(2)
    console.print(f"{tc.describe()}, {len(modules)} modules, {os.cpu_count()} cores")

    walls: dict[str, list[float]] = {"plain": [], "native": [], "channel": []}
    # Summed per-module compile times: what each mode costs in compile work, steadier than
    # a pass's wall time, which the one long module (sqlite3) dominates.
    work: dict[str, list[float]] = {mode: [] for mode in walls}
    results: dict[str, dict] = {}
    with tempfile.TemporaryDirectory(prefix="mlgo-bench-") as d:
        responder = build_responder(Path(d))
        for i in range(repeats):
            for mode in walls:  # interleaved, so drifting machine load hits all three
                wall, results[mode] = run_pass(pool, modules, tc.clang, mode, responder)
                walls[mode].append(wall)
                work[mode].append(sum(r["seconds"] for r in results[mode].values()))
            console.print(
                f"round {i + 1}: " + ", ".join(f"{k} {v[-1]:.1f} s" for k, v in walls.items())
            )
        start = time.monotonic()
        manifest = collect(PROBLEM, load_corpus(corpus), Path(d) / "traces", tc, pool)
        collect_s = time.monotonic() - start
        rt_median, rt_p99 = round_trip_us()
        _, replayed = run_pass(pool, modules, tc.clang, "replay", responder)
    o = overheads(walls, work)

    packages = package_totals(modules, results["channel"], results["plain"])
    decisions = sum(r["decisions"] for r in packages.values())
    figures = {
        "toolchain": tc.describe(),
        "packages": packages,
        "modules": len(modules),
        "decisions": decisions,
        "text_size_oz": sum(r["text_size"] for r in packages.values()),
        "plain_pass_s": walls["plain"],
        "channel_pass_s": walls["channel"],
        "native_pass_s": walls["native"],
        "native_overhead_median": o["pass native"]["median"],
        "work_s": work,
        "work_overhead_channel_median": o["work channel"]["median"],
        "work_overhead_native_median": o["work native"]["median"],
        "channel_overhead_median": o["pass channel"]["median"],
        "channel_overhead_min": o["pass channel"]["min"],
        "channel_overhead_max": o["pass channel"]["max"],
        "collect_s": collect_s,
        "collect_modules_per_s": len(manifest.modules) / collect_s,
        "collect_decisions_per_s": decisions / collect_s,
        "round_trip_us_median": rt_median,
        "round_trip_us_p99": rt_p99,
        "replay_match": sum(r["match"] for r in replayed.values()) / len(replayed),
    }

    table = Table("package", "modules", "inlining decisions", ".text at -Oz (bytes)")
    for pkg, r in sorted(packages.items()):
        table.add_row(pkg, str(r["modules"]), f"{r['decisions']:,}", f"{r['text_size']:,}")
    table.add_row("total", str(len(modules)), f"{decisions:,}", f"{figures['text_size_oz']:,}")
    console.print(table)
    f = figures
    console.print(
        f"pass wall time vs plain clang -Oz, median (min..max) of {repeats} rounds: "
        f"Python channel {median_and_range(o['pass channel'])}, "
        f"C responder {median_and_range(o['pass native'])}\n"
        f"summed per-module compile time vs plain: "
        f"Python channel {median_and_range(o['work channel'])}, "
        f"C responder {median_and_range(o['work native'])}\n"
        f"collect (with TFRecord writing): {f['collect_modules_per_s']:.2f} modules/s, "
        f"{f['collect_decisions_per_s']:.0f} decisions/s\n"
        f"channel round trip: median {rt_median:.1f} us, p99 {rt_p99:.1f} us\n"
        f"default replay byte-identical to plain: {f['replay_match']:.1%}"
    )
    if json_out:
        atomic_write_text(json_out, json.dumps(figures, indent=1))


if __name__ == "__main__":
    sys.exit(typer.run(main))
