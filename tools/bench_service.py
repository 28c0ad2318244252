"""Benchmarks of the policy service (issue figures: round trip, build overhead, soak).

  .venv/bin/python -m tools.bench_service --parts rtt,build,soak [--policy DIR]

- rtt: per-decision round trip on recorded real features, measured by a C peer playing the
  compiler (tools/channel_driver.c): the native AOT backend, the Python backend and, as a
  floor, a C responder that answers without any policy. Medians over repeats.
- build: a real package built with plain clang-22 -Oz, with mlgo-cc and the plugin
  service (the policy inside clang; the default), with mlgo-cc and the native service (the
  AOT policy server on a channel), and with mlgo-cc passing straight through
  (MLGO_DISABLE=1, the wrapper's own cost), interleaved in each repeat; medians and spread
  of the build step's wall time and of its CPU time (build processes plus the services).
- soak: 2 x cores concurrent mlgo-cc compilations for N minutes through one backend;
  failures, FIFOs left, threads and RSS of the service and its policy server over time.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import tempfile
import threading
import time
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.corpus.compile import compile_module
from mlgo.corpus.format import load_corpus
from mlgo.data import shipped_policy
from mlgo.errors import MlgoError
from mlgo.llvm.channel import fifo_pair
from mlgo.llvm.log_format import Header, TensorSpec
from mlgo.llvm.toolchain import find_toolchain
from mlgo.packages.recipes import load_recipe
from mlgo.problems import Problem
from mlgo.problems.policy_files import load_policy
from mlgo.programs.build import (
    Building,
    Variant,
    build_program,
    mlgo_compilers,
    plain_compilers,
    policy_service,
    pristine_source,
)
from mlgo.programs.measure import live_children, paired_change, tree_cpu_seconds
from mlgo.records import ModuleRun
from mlgo.runtime.files import atomic_write_text
from mlgo.serve.client import request
from mlgo.train import policy_dir

console = Console(width=160)


def _compile_c(name: str, out: Path) -> Path:
    """tools/NAME.c built with the system's cc into OUT."""
    binary = out / name
    subprocess.run(["cc", "-O2", "-o", str(binary), str(Path(__file__).with_name(f"{name}.c"))],
                   check=True)  # fmt: skip
    return binary


def record_chunks(
    corpus: Path, package: str, modules: int, out: Path, problem: Problem
) -> tuple[Path, int]:
    """Real observations from real compilations, as the driver's chunk file."""
    tc = find_toolchain()
    chosen = load_corpus(corpus).select([package]).modules[:modules]
    runs = [r for m in chosen if (r := compile_module(problem, m, tc.clang)).num_decisions]
    path = out / "chunks.bin"
    path.write_bytes(chunk_file(runs, problem.advice_name))
    return path, sum(r.num_decisions for r in runs)


def chunk_file(runs: list[ModuleRun], advice_name: str) -> bytes:
    """What tools/channel_driver.c reads: the compiler's side of the channel for every
    decision of RUNS, as chunks (the header, then an observation per decision), each behind
    its 4-byte length, after a line with the advice's size (8 bytes) and the chunk count."""
    specs = runs[0].specs
    header = Header(specs, advice=TensorSpec(advice_name, "int64_t", (1,)))
    chunks = [json.dumps(header.to_json()).encode() + b"\n"]
    for run in runs:
        for i in range(run.num_decisions):
            block = b"".join(run.features[s.name][i].astype(s.dtype).tobytes() for s in specs)
            event = json.dumps({"observation": len(chunks) - 1}).encode()
            chunks.append(event + b"\n" + block + b"\n")
    framed = b"".join(len(c).to_bytes(4, "little") + c for c in chunks)
    return f"8 {len(chunks)}\n".encode() + framed


def _drive(driver: Path, base: str, chunks: Path, passes: int) -> list[int]:
    proc = subprocess.run(
        [str(driver), base, str(chunks), str(passes)], capture_output=True, text=True, timeout=600
    )
    if proc.returncode != 0:
        raise RuntimeError(f"channel_driver: {proc.stderr.strip()}")
    return [int(x) for x in proc.stdout.split()]


def bench_rtt(args, work: Path) -> dict:
    problem = load_policy(args.policy).problem  # what the served policy is sent
    chunks, decisions = record_chunks(args.corpus, args.package, args.modules, work, problem)
    driver = _compile_c("channel_driver", work)
    responder = _compile_c("default_responder", work)
    results: dict[str, list[list[int]]] = {"native": [], "python": [], "c-floor": []}
    with (
        policy_service([args.policy], work / "svc-native", "native") as native_env,
        policy_service([args.policy], work / "svc-python", "python") as python_env,
    ):
        sockets = {"native": native_env["MLGO_SOCKET"], "python": python_env["MLGO_SOCKET"]}
        for _ in range(args.reps):
            for name, sock in sockets.items():
                passes = args.passes if name == "native" else max(1, args.passes // 10)
                base = request({"op": "channel"}, path=Path(sock))["base"]
                results[name].append(_drive(driver, base, chunks, passes))
            with fifo_pair() as base:
                peer = subprocess.Popen([str(responder), base])
                results["c-floor"].append(_drive(driver, base, chunks, args.passes))
                peer.wait(60)
    summary = {name: rtt_summary(reps) for name, reps in results.items()}
    table = Table("backend", "p50 µs", "p90 µs", "p99 µs", "p50 range over repeats")
    for name, s in summary.items():
        lo, hi = s["p50_us_range"]
        table.add_row(
            name,
            f"{s['p50_us']:.1f}",
            f"{s['p90_us']:.1f}",
            f"{s['p99_us']:.1f}",
            f"{lo:.1f}–{hi:.1f}",
        )
    console.print(table)
    return {"recorded_decisions": decisions, "reps": args.reps, "backends": summary}


def rtt_summary(reps: list[list[int]]) -> dict:
    """One backend's round trips over repeats, each as channel_driver prints it (decisions,
    then the p50, p90 and p99 in ns): the median of each percentile in µs, and the p50's range."""
    p50s = [r[1] / 1e3 for r in reps]
    return {
        "decisions_per_rep": reps[0][0],
        "p50_us": statistics.median(p50s),
        "p90_us": statistics.median(r[2] for r in reps) / 1e3,
        "p99_us": statistics.median(r[3] for r in reps) / 1e3,
        "p50_us_range": [min(p50s), max(p50s)],
    }


def bench_build(args, work: Path) -> dict:
    tc = find_toolchain()
    recipe = load_recipe(args.build_package)
    pristine = pristine_source(recipe, args.work / recipe.name)
    names = ("plain", "mlgo-cc (plugin)", "mlgo-cc (native)", "mlgo-cc (disabled)")
    times: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    with (
        policy_service([args.policy], work / "svc-plugin", "plugin") as plugin_env,
        policy_service([args.policy], work / "svc-build", "native") as native_env,
    ):
        envs = {
            "plugin": dict(plugin_env, MLGO_CC=tc.clang),
            "native": dict(native_env, MLGO_CC=tc.clang),
        }
        service_pids = [
            request({"op": "status"}, path=Path(env["MLGO_SOCKET"]))["pid"] for env in envs.values()
        ]
        variants = {
            "plain": (plain_compilers(tc), {}),
            "mlgo-cc (plugin)": (mlgo_compilers(), envs["plugin"]),
            "mlgo-cc (native)": (mlgo_compilers(), envs["native"]),
            "mlgo-cc (disabled)": (mlgo_compilers(), dict(envs["native"], MLGO_DISABLE="1")),
        }
        for rep in range(args.reps):
            order = list(variants)
            random.Random(rep).shuffle(order)  # no variant always runs first
            for name in order:
                compilers, extra = variants[name]
                services_before = sum(tree_cpu_seconds(pid) for pid in service_pids)
                b = build_program(
                    recipe,
                    pristine,
                    work / "tree",
                    tc,
                    Variant(name, compilers, extra),
                    None,
                    Building(tests=False),
                )
                times[name].append(b.build_seconds)
                # The build's own processes, plus what the services and the policy server spent.
                services = sum(tree_cpu_seconds(pid) for pid in service_pids) - services_before
                cpu[name].append(b.build_cpu_seconds + services)
                console.print(
                    f"rep {rep + 1}: {name} {b.build_seconds:.1f} s wall, {cpu[name][-1]:.1f} s cpu"
                )
        socket = Path(envs["native"]["MLGO_SOCKET"])
        decisions = request({"op": "status"}, path=socket)["decisions"]
    summary = build_summary(times, cpu)
    table = Table(
        "build",
        "wall s, median (range)",
        "wall overhead",
        "CPU s, median (range)",
        "CPU overhead",
        "paired CPU overhead, median (IQR)",
    )
    for name, b in summary.items():
        ts, cs, paired = b["seconds"], b["cpu_seconds"], b["paired_cpu_overhead_pct"]
        table.add_row(
            name,
            f"{b['median_s']:.2f} ({min(ts):.2f}–{max(ts):.2f})",
            f"{b['overhead_pct']:+.1f}%",
            f"{b['cpu_median_s']:.2f} ({min(cs):.2f}–{max(cs):.2f})",
            f"{b['cpu_overhead_pct']:+.1f}%",
            f"{paired['median']:+.1f}% ({paired['q1']:+.1f}..{paired['q3']:+.1f})",
        )
    console.print(table)
    return {"package": recipe.name, "reps": args.reps, "decisions": decisions, "builds": summary}


def build_summary(times: dict[str, list[float]], cpu: dict[str, list[float]]) -> dict:
    """Per build variant, from its wall TIMES and CPU seconds over the repeats: the medians
    and their change against plain's, and the CPU change paired within each repeat, in %."""
    plain, plain_cpu = statistics.median(times["plain"]), statistics.median(cpu["plain"])
    summary = {}
    for name, ts in times.items():
        med, cpu_med = statistics.median(ts), statistics.median(cpu[name])
        # Each repeat builds every variant back to back: the ratio within a repeat cancels
        # what drifts between repeats (other load, frequency), so it is the steadier figure.
        paired = paired_change(cpu[name], cpu["plain"])
        summary[name] = {
            "seconds": ts,
            "cpu_seconds": cpu[name],
            "median_s": med,
            "overhead_pct": 100 * (med / plain - 1),
            "cpu_median_s": cpu_med,
            "cpu_overhead_pct": 100 * (cpu_med / plain_cpu - 1),
            "paired_cpu_overhead_pct": {k: 100 * paired[k] for k in ("median", "q1", "q3")},
        }
    return summary


def _proc_stats(pid: int) -> dict[str, int]:
    """Process PID's resident memory, threads and open file descriptors."""
    stats = memory_and_threads(Path(f"/proc/{pid}/status").read_text())
    return {**stats, "fds": len(os.listdir(f"/proc/{pid}/fd"))}


def memory_and_threads(status: str) -> dict[str, int]:
    """The resident memory (kB) and thread count in a /proc/PID/status text."""
    fields = dict(line.split(":", 1) for line in status.splitlines() if ":" in line)
    return {"rss_kb": int(fields["VmRSS"].split()[0]), "threads": int(fields["Threads"])}


def bench_soak(args, work: Path) -> dict:
    recipe = load_recipe(args.soak_package)
    pristine = pristine_source(recipe, args.work / recipe.name)
    sources = sorted(p for p in pristine.rglob("*.c") if "test" not in str(p.relative_to(pristine)))
    sources = [
        s
        for s in sources
        if subprocess.run(
            ["clang-22", "-fsyntax-only", "-I", str(s.parent), str(s)], capture_output=True
        ).returncode
        == 0
    ][:40]
    cc = mlgo_compilers()[0]
    stop = time.monotonic() + args.soak_minutes * 60
    counts = {"ok": 0, "failed": 0}
    failures: list[str] = []
    lock = threading.Lock()
    samples: list[dict] = []
    with policy_service([args.policy], work / "svc-soak", args.soak_backend) as env:
        sock = Path(env["MLGO_SOCKET"])
        service_pid = request({"op": "status"}, path=sock)["pid"]
        channels = sock.parent / "channels"

        def worker(seed: int) -> None:
            rng = random.Random(seed)
            out = work / f"soak-{seed}.o"
            while time.monotonic() < stop:
                src = rng.choice(sources)
                r = subprocess.run(
                    [cc, "-Oz", "-c", "-I", str(src.parent), str(src), "-o", str(out)],
                    env=dict(os.environ, **env),
                    capture_output=True,
                    text=True,
                )
                with lock:
                    if r.returncode == 0 and "mlgo" not in r.stderr:  # no warning either
                        counts["ok"] += 1
                    else:
                        counts["failed"] += 1
                        failures.append(r.stderr.strip()[-200:])

        threads = [threading.Thread(target=worker, args=(i,)) for i in range(2 * os.cpu_count())]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            server = next(
                (
                    c
                    for c in live_children(service_pid)
                    if Path(f"/proc/{c}/exe").resolve().name == "policy_server"
                ),
                None,
            )
            sample = {
                "t_s": round(args.soak_minutes * 60 - (stop - time.monotonic())),
                "service": _proc_stats(service_pid),
                "fifos": len(list(channels.iterdir())),
                "compilations": counts["ok"] + counts["failed"],
            }
            if server:
                sample["policy_server"] = _proc_stats(server)
            samples.append(sample)
            time.sleep(args.sample_s)
        for t in threads:
            t.join()
        time.sleep(1)
        final = {"service": _proc_stats(service_pid), "fifos": len(list(channels.iterdir()))}
        status = request({"op": "status"}, path=sock)
    console.print(
        f"soak: {counts['ok']} compilations ok, {counts['failed']} failed; "
        f"service RSS {samples[1]['service']['rss_kb']} -> {final['service']['rss_kb']} kB, "
        f"threads {samples[1]['service']['threads']} -> {final['service']['threads']}, "
        f"FIFOs left {final['fifos']}"
    )
    return {
        "backend": args.soak_backend,
        "minutes": args.soak_minutes,
        "concurrency": 2 * os.cpu_count(),
        **counts,
        "failures": failures[:5],
        "samples": samples,
        "final": final,
        "decisions": status["decisions"],
        "latency": status["policies"][0]["latency"],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("--parts", default="rtt,build,soak")
    ap.add_argument(
        "--policy", type=Path, default=shipped_policy("inlining-size"), help="the policy served"
    )
    ap.add_argument("--corpus", type=Path, default=Path("data/corpus"))
    ap.add_argument("--package", default="zlib", help="rtt: corpus package to record from")
    ap.add_argument("--modules", type=int, default=8, help="rtt: modules to record")
    ap.add_argument("--passes", type=int, default=20, help="rtt: passes over the records")
    ap.add_argument("--build-package", default="lua", help="build: recipe to build")
    ap.add_argument("--soak-package", default="zlib", help="soak: recipe whose sources to compile")
    ap.add_argument("--soak-backend", default="native", help="soak: plugin or native")
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--soak-minutes", type=float, default=10.0)
    ap.add_argument("--sample-s", type=float, default=10.0)
    ap.add_argument("--work", type=Path, default=Path("data/bench/service"))
    ap.add_argument("--out", type=Path, default=Path("data/bench/service.json"))
    args = ap.parse_args()
    if args.reps < 1:
        raise SystemExit(f"error: --reps {args.reps}: at least 1 repeat is needed")
    args.policy = policy_dir(args.policy)  # a run directory serves its policy/
    try:
        load_policy(args.policy)  # what is wrong with it, in one line, before any build
    except MlgoError as e:
        raise SystemExit(f"error: {e}") from None
    args.work.mkdir(parents=True, exist_ok=True)
    results = json.loads(args.out.read_text()) if args.out.exists() else {}
    parts = {"rtt": bench_rtt, "build": bench_build, "soak": bench_soak}
    with tempfile.TemporaryDirectory(dir=args.work) as tmp:
        for part in args.parts.split(","):
            keys = {"build": f"build-{args.build_package}", "soak": f"soak-{args.soak_backend}"}
            key = keys.get(part, part)
            results[key] = parts[part](args, Path(tmp))
            results[key]["finished"] = time.strftime("%Y-%m-%d %H:%M:%S")
            atomic_write_text(args.out, json.dumps(results, indent=1))
    console.print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
