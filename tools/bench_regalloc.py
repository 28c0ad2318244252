"""Benchmark of a regalloc eviction policy: held-out spill/reload cost, compile-time
overhead, and the throughput of real programs built with it.

    .venv/bin/python -m tools.bench_regalloc --policy policies/regalloc-eviction \\
        [--heldout data/heldout] [--overhead data/heldout --overhead-packages cjson,giflib] \\
        [--overhead-build lua5.4,zstd] [--programs sqlite3,zstd,lua5.4] [--repeats 9] \\
        [--min-seconds 1] [--backend native] [--json F]

Held-out: every module compiled with the policy and with clang's own eviction advisor;
frequency-weighted spill+reload cost (folded ones included) and copy cost.

Compile-time overhead, in CPU time (the compiler plus the policy server and the service)
and wall time: `--overhead-build` times whole packages' build steps, plain clang against
`mlgo-cc` (the native wrapper) and the native service, with plain clang built a second
time in each round as an A/A control (what noise alone makes); `--overhead` splits the cost on
corpus modules' cc1 commands into clang's ML mode, the policy server and the service.

Programs: each Debian source package is built twice with the same flags (`-O2 -g0`
appended), once with plain clang and once with `mlgo-cc` and the policy service
answering every eviction (strict: a policy failure fails the build instead of falling
back); the package's own tests must pass for both builds.
Then a fixed workload runs under `valgrind --tool=callgrind` (instruction counts,
deterministic) and, for time, `--repeats` rounds in which the two builds alternate in
order (ABBA) so machine noise hits both. Each timed sample loops the workload for about
`--min-seconds` of CPU; wall time and CPU time (user+sys of the workload's own processes,
from wait4's rusage: what other jobs take does not count) are reported as the median and
interquartile range of the paired ratios, policy over default in the same round.
"""

from __future__ import annotations

import hashlib
import json
import statistics
import subprocess
import tempfile
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from mlgo.corpus.format import load_corpus
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.packages.recipes import load_recipe
from mlgo.problems import get_problem
from mlgo.problems.policy_files import load_policy
from mlgo.programs.build import Building, Variant, build_program, policy_service, pristine_source
from mlgo.programs.compare import build_pair, variants
from mlgo.programs.measure import (
    AGAIN,
    Times,
    Workload,
    children_cpu,
    compare_workload,
    median_and_range,
    paired_change,
    round_order,
    spread,
    timed_rounds,
    tree_cpu_seconds,
)
from mlgo.runtime.commands import BuildError
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.workers import LocalPool
from mlgo.serve.client import Connection, request
from mlgo.serve.service import Service
from mlgo.train.evaluate import Evaluation, evaluate
from tools.lab.workloads import FLAGS, PROGRAMS, prepare_workload, save_json

console = Console(width=160)
VARIANTS = ("default", "policy")


def build_variants(
    prog: Workload,
    tc: Toolchain,
    work: Path,
    policy: Path,
    service_env: dict[str, str],
    tests: bool = True,
) -> dict:
    """Both builds from one pristine source, the package's tests on each, then the
    benchmark's own setup (compiled the same way); reused while the policy is unchanged."""
    key = hashlib.sha256((policy / "policy.npz").read_bytes()).hexdigest()
    stamp = work / "bench-builds.json"
    if stamp.exists() and json.loads(stamp.read_text())["policy"] == key:
        return json.loads(stamp.read_text())["builds"]
    pair = variants(tc, service_env, VARIANTS)
    with console.status(f"{prog.recipe}: building and testing both builds"):
        built = build_pair(load_recipe(prog.recipe), work, tc, pair, tests, FLAGS)
    for v in pair:
        prepare_workload(prog, tc, work, v, FLAGS)
    builds = {b.variant: b.to_json() for b in built}
    atomic_write_text(stamp, json.dumps({"policy": key, "builds": builds}))
    return builds


def bench_program(
    name: str,
    tc: Toolchain,
    work: Path,
    policy: Path,
    repeats: int,
    service_env: dict[str, str],
    tests: bool = True,
    callgrind: bool = True,
    min_seconds: float = 1.0,
) -> dict:
    """Instruction counts (if CALLGRIND) and REPEATS timed ABBA rounds (if any) of both
    builds, each sample about MIN_SECONDS of CPU; the two must print the same results."""
    pwork = work / name
    out: dict = build_variants(PROGRAMS[name], tc, pwork, policy, service_env, tests)
    with console.status(f"{name}: callgrind and {repeats} timed rounds of both builds"):
        measured = compare_workload(
            PROGRAMS[name], {v: pwork / v for v in VARIANTS}, repeats, min_seconds, callgrind
        )
    for v in VARIANTS:
        out[v].update(measured.pop(v))
    out.update(measured)
    return out


def bench_heldout(corpus: Path, policy: Path, tc: Toolchain, out: Path) -> dict:
    loaded = load_policy(policy)
    ev = evaluate(loaded, load_corpus(corpus), tc, LocalPool(), loaded.problem)
    ev.save(out)
    return heldout_figures(ev)


def heldout_figures(ev: Evaluation) -> dict:
    """An evaluation's costs with the policy and the default, summed, and the spill+reload
    change per package."""
    rows = ev.modules.values()
    result: dict = {"modules": len(ev.modules), "failed": len(ev.failed)}
    for k in ("spill_reload_cost", "copies_cost", "regalloc_cost", "text_size"):
        pol, base = sum(r[k] for r in rows), sum(r[f"default_{k}"] for r in rows)
        result[k] = {"policy": pol, "default": base, "delta": pol / base - 1}
    packages: dict[str, dict] = {}
    for name, r in ev.modules.items():
        p = packages.setdefault(name.split("/", 1)[0], {"policy": 0.0, "default": 0.0})
        p["policy"] += r["spill_reload_cost"]
        p["default"] += r["default_spill_reload_cost"]
    result["spill_reload_by_package"] = {
        k: v["policy"] / v["default"] - 1 if v["default"] else 0.0 for k, v in packages.items()
    }
    return result


@contextmanager
def direct_server(policy: Path):
    """The service's own leases (`mlgo.serve.service.Service`) taken in this process, from
    the policy's native server: a fresh channel per compile, as mlgo-cc's lease gets, but no
    daemon, socket or control plane in between. Yields a function that compiles CMD under a
    lease, and the policy server's process id."""
    with tempfile.TemporaryDirectory() as d:
        service = Service([policy], "native", runtime=Path(d))

        def compile_under_lease(cmd: list[str]) -> None:
            lease = service.open_lease(notify=lambda event: None)  # held until end_lease
            try:
                subprocess.run([*cmd, *lease.flags], check=True, capture_output=True)
            finally:
                tally = service.end_lease(lease)
            if tally["errors"]:
                raise BuildError(f"policy server: {tally['errors'][0]}")

        try:
            yield compile_under_lease, service.policies[0].backend.pid
        finally:
            service.close()


def bench_overhead(
    corpus: Path,
    packages: str,
    tc: Toolchain,
    policy: Path,
    service_env: dict[str, str],
    rounds: int,
) -> dict:
    """Where the advisor's compile time goes, on the cc1 commands of some corpus modules,
    one compile at a time, the variants' order alternating by round: plain clang; clang
    with the channel answered by a policy server of its own, leased in this process
    (`direct_server`: clang's ML mode plus the policy); and with a lease from the policy
    service as mlgo-cc takes it, over its socket (plus the service's control plane). CPU
    counts the compiler and the policy side (server, service), not this script; the service
    and server only work while their variant runs, so their CPU is taken per round."""
    problem = get_problem("regalloc-eviction")
    modules = load_corpus(corpus).select([p for p in packages.split(",") if p]).modules
    socket = Path(service_env["MLGO_SOCKET"])
    service_pid = request({"op": "status"}, path=socket)["pid"]
    variants = ("plain", "direct", "service")
    cpu: dict[str, list[float]] = {v: [] for v in variants}
    wall: dict[str, list[float]] = {v: [] for v in variants}
    clang_cpu: dict[str, list[float]] = {v: [] for v in variants}
    control = [0.0] * rounds  # the service's own CPU, its policy server's not included
    decisions = 0
    with tempfile.TemporaryDirectory() as d, direct_server(policy) as (direct, server_pid):
        obj = Path(d) / "o.o"
        for r in range(rounds):
            order = round_order(r, variants)
            seconds = dict.fromkeys(variants, 0.0)
            compiler = dict.fromkeys(variants, 0.0)
            server_start = tree_cpu_seconds(server_pid)
            service_start = tree_cpu_seconds(service_pid)
            control_start = tree_cpu_seconds(service_pid, children=False)
            for m in modules:
                cmd = m.compile_command(tc.clang, obj, problem.opt_level)
                for v in order:
                    start, cpu_start = time.perf_counter(), children_cpu()
                    if v == "plain":
                        subprocess.run(cmd, check=True, capture_output=True)
                    elif v == "direct":
                        direct(cmd)
                    else:
                        with Connection(socket, 10.0) as conn:
                            level, language = problem.opt_level, m.language
                            conn.send({"op": "compile", "level": level, "language": language})
                            flags = list(conn.receive()["flags"])
                            subprocess.run([*cmd, *flags], check=True, capture_output=True)
                            conn.send({"op": "done", "returncode": 0})
                            while "event" in (tally := conn.receive()):
                                pass
                        if tally["errors"]:
                            raise BuildError(f"{m.name}: {tally['errors'][0]}")
                        decisions += tally["decisions"] if r == 0 else 0
                    seconds[v] += time.perf_counter() - start
                    compiler[v] += children_cpu() - cpu_start
            server_cpu = tree_cpu_seconds(server_pid) - server_start
            service_cpu = tree_cpu_seconds(service_pid) - service_start
            control[r] = tree_cpu_seconds(service_pid, children=False) - control_start
            policy_side = {"plain": 0.0, "direct": server_cpu, "service": service_cpu}
            for v in variants:
                cpu[v].append(compiler[v] + policy_side[v])
                wall[v].append(seconds[v])
                clang_cpu[v].append(compiler[v])
            console.print(
                f"round {r + 1}: CPU s "
                + ", ".join(
                    f"{v} {cpu[v][-1]:.2f} (clang {clang_cpu[v][-1]:.2f})" for v in variants
                )
            )
        latency = request({"op": "status"}, path=socket)["policies"][0]["latency"]
    return {
        "modules": len(modules),
        "decisions": decisions,
        "rounds": rounds,
        **overhead_summary(cpu, clang_cpu, wall, control),
        "latency": latency,
    }


def overhead_summary(
    cpu: dict[str, list[float]],
    clang_cpu: dict[str, list[float]],
    wall: dict[str, list[float]],
    control: list[float],
) -> dict:
    """From each variant's seconds per round (CPU: its compiler's, CLANG_CPU, plus its
    policy side's; WALL) and the service's own CPU (CONTROL): their spread, the variants'
    change against plain, and the service variant's CPU overhead in parts."""
    others = [v for v in cpu if v != "plain"]

    def change(series: dict[str, list[float]], v: str) -> dict:
        return paired_change(series[v], series["plain"])

    def share(part: list[float]) -> float:
        return statistics.median(x / p for x, p in zip(part, cpu["plain"], strict=True))

    ml_mode = [a - b for a, b in zip(clang_cpu["service"], clang_cpu["plain"], strict=True)]
    server = [
        t - c - s for t, c, s in zip(cpu["service"], clang_cpu["service"], control, strict=True)
    ]
    return {
        "cpu_seconds": {v: spread(cpu[v]) for v in cpu},
        "clang_cpu_seconds": {v: spread(clang_cpu[v]) for v in cpu},
        "wall_seconds": {v: spread(wall[v]) for v in cpu},
        "cpu_overhead": {v: change(cpu, v) for v in others},
        "wall_overhead": {v: change(wall, v) for v in others},
        # the service variant's CPU overhead in parts, each a share of plain's CPU: the
        # compiler's extra work, and the policy side's own CPU measured per process (not
        # as a difference of two variants, which would carry the compiler's noise)
        "parts": {
            "clang ML mode": share(ml_mode),
            "policy server": share(server),
            "service (lease, control plane)": share(control),
        },
    }


def _timed_builds(
    name: str, tc: Toolchain, work: Path, pair: dict[str, Variant], service_pid: int, reps: int
) -> Times:
    """REPS ABBA rounds of NAME's build step with both variants, and the plain one again
    (the A/A control); a build's CPU counts everything it ran plus what the service and
    its policy server spent meanwhile."""
    recipe = load_recipe(PROGRAMS[name].recipe)
    pristine = pristine_source(recipe, work / name)

    def sample(v: str) -> tuple[float, float]:
        service_start = tree_cpu_seconds(service_pid)
        tree = work / name / "overhead"
        built = pair[v.removesuffix(AGAIN)]  # the A/A control builds plainly again
        b = build_program(
            recipe,
            pristine,
            tree,
            tc,
            Variant(v, built.compilers, built.env),
            FLAGS,
            Building(tests=False),
        )
        return b.build_seconds, b.build_cpu_seconds + tree_cpu_seconds(service_pid) - service_start

    def progress(r: int, t: Times) -> None:
        cpu = t["cpu"]
        console.print(
            f"{name} rep {r + 1}: CPU s default {cpu['default'][-1]:.2f}, "
            f"policy {cpu['policy'][-1]:.2f}"
        )

    return timed_rounds(reps, [*VARIANTS, VARIANTS[0] + AGAIN], sample, progress)


def bench_build_overhead(
    names: list[str], tc: Toolchain, work: Path, service_env: dict[str, str], reps: int
) -> dict:
    """The build step of whole packages at FLAGS with plain clang and with `mlgo-cc` (the
    native wrapper) and the policy service, alternating (ABBA) over REPS; CPU counts
    everything the build ran plus what the service and its policy server spent."""
    socket = Path(service_env["MLGO_SOCKET"])
    service_pid = request({"op": "status"}, path=socket)["pid"]
    pair = dict(zip(VARIANTS, variants(tc, service_env, VARIANTS), strict=True))
    again = VARIANTS[0] + AGAIN
    out: dict = {}
    for name in names:
        counted = request({"op": "status"}, path=socket)
        times = _timed_builds(name, tc, work, pair, service_pid, reps)
        status = request({"op": "status"}, path=socket)
        out[name] = {
            "reps": reps,
            "compilations": (status["compilations"] - counted["compilations"]) // reps,
            "decisions": (status["decisions"] - counted["decisions"]) // reps,
            "cpu_seconds": {v: spread(times["cpu"][v]) for v in VARIANTS},
            "wall_seconds": {v: spread(times["wall"][v]) for v in VARIANTS},
            "cpu_overhead": paired_change(times["cpu"]["policy"], times["cpu"]["default"]),
            "wall_overhead": paired_change(times["wall"]["policy"], times["wall"]["default"]),
            # the plain build against itself in the same rounds: what noise alone makes
            "cpu_control": paired_change(times["cpu"][again], times["cpu"]["default"]),
        }
    return out


def _print_overhead(o: dict) -> None:
    table = Table(
        "variant",
        "CPU s, median",
        "CPU change (min..max)",
        "wall s, median",
        "wall change (min..max)",
        title=f"compile time of {o['modules']} modules ({o['decisions']:,} evictions), "
        f"{o['rounds']} rounds",
    )
    for v, c in o["cpu_seconds"].items():
        table.add_row(
            v,
            f"{c['median']:.2f}",
            median_and_range(o["cpu_overhead"][v]) if v in o["cpu_overhead"] else "",
            f"{o['wall_seconds'][v]['median']:.2f}",
            median_and_range(o["wall_overhead"][v]) if v in o["wall_overhead"] else "",
        )
    console.print(table)
    console.print(
        "CPU overhead by part: " + ", ".join(f"{k} {v:+.1%}" for k, v in o["parts"].items())
    )


def _print_build_overhead(o: dict) -> None:
    table = Table(
        "package",
        "reps",
        "compiles, evictions",
        "CPU s default / policy",
        "CPU change (min..max)",
        "CPU, A/A control (min..max)",
        "wall s default / policy",
        "wall change (min..max)",
        title="build step, plain clang vs mlgo-cc and the native policy service",
    )
    for name, r in o.items():
        c, w = r["cpu_seconds"], r["wall_seconds"]
        table.add_row(
            name,
            str(r["reps"]),
            f"{r['compilations']}, {r['decisions']:,}",
            f"{c['default']['median']:.2f} / {c['policy']['median']:.2f}",
            median_and_range(r["cpu_overhead"]),
            median_and_range(r["cpu_control"]) if "cpu_control" in r else "",
            f"{w['default']['median']:.2f} / {w['policy']['median']:.2f}",
            median_and_range(r["wall_overhead"]),
        )
    console.print(table)


def _print_programs(result: dict, names: list[str]) -> None:
    table = Table(
        "program",
        "instructions default",
        "policy",
        "change",
        "loops",
        "wall s default / policy",
        "wall change, paired median (IQR)",
        "CPU s default / policy",
        "CPU change, paired median (IQR)",
        "build s default / policy",
        title="throughput (negative = faster)",
    )
    for name in names:
        r = result[name]
        d, p = r["default"], r["policy"]
        row = [name] + [""] * 8
        if "instructions_delta" in r:
            row[1:4] = [
                f"{d['instructions']:,}",
                f"{p['instructions']:,}",
                f"{r['instructions_delta']:+.3%}",
            ]
        if "loops" in r:
            row[4] = str(r["loops"])
            for i, clock in ((5, "wall"), (7, "cpu")):
                pr, key = r[f"{clock}_delta_paired"], f"{clock}_seconds"
                row[i : i + 2] = [
                    f"{d[key]['median']:.3f} / {p[key]['median']:.3f}",
                    f"{pr['median']:+.2%} ({pr['q1']:+.2%}..{pr['q3']:+.2%})",
                ]
        table.add_row(*row, f"{d['build_seconds']:.0f} / {p['build_seconds']:.0f}")
    console.print(table)


def main(
    policy: Annotated[Path, typer.Option(help="regalloc policy directory")],
    heldout: Annotated[Path | None, typer.Option(help="held-out corpus")] = None,
    programs: Annotated[str, typer.Option(help="comma-separated, of " + ",".join(PROGRAMS))] = "",
    work: Annotated[Path, typer.Option(help="where the programs are built")] = Path(
        "data/bench-regalloc"
    ),
    repeats: Annotated[int, typer.Option(help="timed rounds per program (0: none)")] = 9,
    min_seconds: Annotated[
        float, typer.Option(help="CPU seconds of one timed sample (the workload loops)")
    ] = 1.0,
    tests: Annotated[bool, typer.Option(help="run each package's own tests on both")] = True,
    callgrind: Annotated[bool, typer.Option(help="count the programs' instructions")] = True,
    backend: Annotated[str, typer.Option(help="policy service: native or python")] = "native",
    overhead: Annotated[
        Path | None, typer.Option(help="corpus whose compile time is compared")
    ] = None,
    overhead_packages: Annotated[str, typer.Option(help="its packages to compile")] = "",
    overhead_rounds: Annotated[int, typer.Option(help="rounds over those modules")] = 3,
    overhead_build: Annotated[
        str, typer.Option(help="programs whose whole build step is timed, e.g. lua5.4,zstd")
    ] = "",
    build_reps: Annotated[int, typer.Option(help="repeats of each timed build")] = 5,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    tc = find_toolchain()
    work = work.resolve()
    result: dict = {
        "toolchain": tc.describe(),
        "policy": str(policy),
        "flags": FLAGS,
        "backend": backend,
    }
    if heldout is not None:
        with console.status(f"held-out evaluation on {heldout}"):
            result["heldout"] = h = bench_heldout(heldout, policy, tc, work / "eval-heldout")
        table = Table("held-out", "default", "policy", "change", title=str(heldout))
        for k in ("spill_reload_cost", "copies_cost", "regalloc_cost", "text_size"):
            r = h[k]
            table.add_row(k, f"{r['default']:,.1f}", f"{r['policy']:,.1f}", f"{r['delta']:+.2%}")
        console.print(table)
        console.print(
            "spill+reload by package: "
            + ", ".join(f"{k} {v:+.2%}" for k, v in sorted(h["spill_reload_by_package"].items()))
        )
    names = [p for p in programs.split(",") if p]
    builds = [p for p in overhead_build.split(",") if p]
    unknown = set(names + builds) - set(PROGRAMS)
    if unknown:
        raise typer.BadParameter(f"unknown programs {sorted(unknown)}; have {sorted(PROGRAMS)}")
    if overhead or names or builds:
        with policy_service([policy], work / "service", backend) as service_env:
            if overhead:
                result["overhead"] = bench_overhead(
                    overhead, overhead_packages, tc, policy, service_env, overhead_rounds
                )
                _print_overhead(result["overhead"])
            if builds:
                result["build_overhead"] = bench_build_overhead(
                    builds, tc, work, service_env, build_reps
                )
                _print_build_overhead(result["build_overhead"])
            for name in names:
                result[name] = bench_program(
                    name, tc, work, policy, repeats, service_env, tests, callgrind, min_seconds
                )
        if names:
            _print_programs(result, names)
    if json_out:
        save_json(json_out, result, console)


if __name__ == "__main__":
    typer.run(main)
