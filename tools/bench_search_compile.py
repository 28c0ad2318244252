"""What one compile of BC-Max's search costs against a plain `clang-22 -Oz -c` of the same
module, on the same core.

  .venv/bin/python -m tools.bench_search_compile --corpus C [--policy P] [--repeats 5] [--json F]

The whole run is pinned to one core (children inherit it). Per module, the variants run
interleaved, their order flipping every turn (`round_order`), REPEATS turns:

  plain      clang-22 -Oz -c of the module's bitcode with its recorded command line, no
             channel: compile_module's baseline (`compile_object`)
  responder  the channel answered by tools/default_responder.c: clang's ML mode by itself
  channel    `compile_module` answered through the channel by BC-Max's `Answerer` (the
             default's answers; with --policy, the policy's greedy answers, as a search's
             starting trajectory), the object's size measured
  plugin     the search's own path: the same trajectory answered inside clang by the
             plugin (`plugin_compile`), the object's size measured

Each is timed on three clocks: wall, clang's CPU (the children's rusage) and this
process's CPU (the Python side). The parts of a channel compile: clang's ML mode (responder
less plain, CPU), and this process's share, split by one profiled pass (cProfile on the CPU
clock, which inflates it) into process start, the channel's round trips (reads, writes),
the answers (the policy's evaluation), size measurement and the rest. Reported per module
(median of the turns, min..max of the ratio) and in total, each as a ratio to plain.
With --search-budget, each module is then searched whole as BC-Max searches it, through
the plugin and through the channel in turn, and each one's compiles a second and CPU
against as many plain compiles are reported (the search's own work between compiles
included), with whether the two found the same cost.
"""

from __future__ import annotations

import cProfile
import os
import pstats
import resource
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.table import Table

from mlgo.corpus.compile import compile_module, compile_object
from mlgo.corpus.format import Module, load_corpus
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems import get_problem
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import load_policy
from mlgo.programs.measure import round_order, spread
from mlgo.train.bcmax import Answerer, SearchConfig, SearchTask, search_module
from mlgo.train.plugin_compile import compile_in_plugin, search_plugin
from tools.lab.responder import build_responder, compile_with_native_responder
from tools.lab.workloads import save_json

console = Console(width=150)
PROBLEM = get_problem("inlining-size")
VARIANTS = ("plain", "responder", "channel", "plugin")
MEASURED = ("channel", "plugin", "responder")  # each against plain
CLOCKS = ("wall", "clang", "python")
# A part of this process's CPU in a search compile: the functions whose cumulative time
# it is, by (file name's end, function name); "rest" is what none of them holds.
PARTS: dict[str, tuple[tuple[str, str], ...]] = {
    "process start": (("subprocess.py", "__init__"),),
    "channel reads": (("log_format.py", "observations"), ("log_format.py", "__init__")),
    "channel writes": (("~", "<built-in method posix.write>"),),
    "answers": (("bcmax.py", "__call__"),),
    "size measurement": (("compile.py", "measure_object"),),
    "recording": (("log_format.py", "stack_features"), ("inlining_size.py", "default_advice")),
}


@dataclass
class Clocks:
    """Seconds of one compile on each clock: its wall time, clang's CPU (and any other
    child's), this process's CPU."""

    wall: float
    clang: float
    python: float

    @staticmethod
    def now() -> Clocks:
        c = resource.getrusage(resource.RUSAGE_CHILDREN)
        return Clocks(time.perf_counter(), c.ru_utime + c.ru_stime, time.process_time())

    def since(self, start: Clocks) -> Clocks:
        return Clocks(self.wall - start.wall, self.clang - start.clang, self.python - start.python)

    @property
    def cpu(self) -> float:
        return self.clang + self.python


def timed(run: Callable[..., object], *args: object) -> Clocks:
    start = Clocks.now()
    run(*args)
    return Clocks.now().since(start)


def ratios(ours: list[float], base: list[float]) -> dict:
    """The spread of OURS / BASE turn by turn, and the ratio of their medians."""
    return {**spread([a / b for a, b in zip(ours, base, strict=True)]),
            "of_medians": statistics.median(ours) / statistics.median(base)}  # fmt: skip


def module_figures(turns: dict[str, list[Clocks]]) -> dict:
    """One module's turns (TURNS: per variant, the clocks of each turn): each variant's
    median per clock, and search's and responder's ratios to plain, turn by turn (wall and
    CPU, clang's and this process's together)."""
    medians = {
        v: {k: statistics.median(getattr(c, k) for c in cs) for k in (*CLOCKS, "cpu")}
        for v, cs in turns.items()
    }
    plain = turns["plain"]
    return {
        "median_s": medians,
        "ratio": {
            f"{v} {clock}": ratios([getattr(c, clock) for c in turns[v]],
                                   [getattr(c, clock) for c in plain])
            for v in MEASURED
            for clock in ("wall", "cpu")
        },
    }  # fmt: skip


def totals(per_module: dict[str, dict]) -> dict:
    """Over all modules: each variant's summed medians per clock, and the ratios to plain of
    those sums, with the median and range of the per-module ratios."""
    sums = {
        v: {k: sum(m["median_s"][v][k] for m in per_module.values()) for k in (*CLOCKS, "cpu")}
        for v in VARIANTS
    }
    plain = sums["plain"]
    out: dict = {"sum_s": sums, "ratio_of_sums": {}, "per_module_ratio": {}}
    for v in MEASURED:
        for clock in ("wall", "cpu"):
            out["ratio_of_sums"][f"{v} {clock}"] = sums[v][clock] / plain[clock]
            out["per_module_ratio"][f"{v} {clock}"] = spread(
                [m["ratio"][f"{v} {clock}"]["median"] for m in per_module.values()]
            )
    return out


def parts(stats: pstats.Stats, compiles: int) -> dict[str, float]:
    """This process's CPU seconds per search compile in each of PARTS, from STATS (a
    profile of COMPILES compiles on the CPU clock); "rest" is the remainder of the total."""
    rows = stats.stats  # type: ignore[attr-defined]  # {(file, line, name): (cc, nc, tt, ct, _)}
    found = {
        part: sum(
            ct
            for (file, _, name), (_, _, _, ct, _) in rows.items()
            if any(file.endswith(f) and name == n for f, n in keys)
        )
        / compiles
        for part, keys in PARTS.items()
    }
    total = stats.total_tt / compiles  # type: ignore[attr-defined]
    return {**found, "rest": total - sum(found.values()), "total": total}


def answerer(policy: MLPPolicy | None) -> Answerer:
    """The search's answers: the default's, or POLICY's greedy ones (a starting trajectory)."""
    if policy is None:
        return Answerer(PROBLEM)
    return Answerer(PROBLEM, replace(policy, temperature=0.0))


def run_variant(variant: str, module: Module, clang: str, answers: Answerer, responder: Path):
    """One compile of MODULE as VARIANT; its object is thrown away."""
    if variant == "channel":
        return compile_module(PROBLEM, module, clang, answers)
    if variant == "plugin":
        plugin = search_plugin(PROBLEM, answers.policy, clang)
        if plugin is None:
            raise typer.BadParameter("the plugin cannot answer this policy's trajectories")
        return compile_in_plugin(module, clang, answers, plugin)
    if variant == "responder":
        return compile_with_native_responder(PROBLEM, module, clang, responder)
    with tempfile.TemporaryDirectory(prefix="mlgo-b-") as d:
        return compile_object(module, clang, Path(d) / "out.o", PROBLEM.opt_level)


def main(
    corpus: Annotated[Path, typer.Option(help="corpus directory (recorded at -Oz)")],
    packages: Annotated[str | None, typer.Option(help="comma-separated; default: all")] = None,
    policy: Annotated[Path | None, typer.Option(help="answer with this policy, greedy")] = None,
    repeats: Annotated[int, typer.Option(help="turns of each variant per module")] = 5,
    core: Annotated[int | None, typer.Option(help="the core to pin to; default: the last")] = None,
    search_budget: Annotated[
        int, typer.Option(help="then search each module with this budget (0: no search)")
    ] = 0,
    json_out: Annotated[Path | None, typer.Option("--json", help="write figures here")] = None,
) -> None:
    tc = find_toolchain()
    modules = load_corpus(corpus).select(packages.split(",") if packages else None).modules
    pinned = core if core is not None else max(os.sched_getaffinity(0))
    os.sched_setaffinity(0, {pinned})
    answers = answerer(load_policy(policy) if policy else None)
    load = os.getloadavg()
    console.print(f"{tc.describe()}, {len(modules)} modules, core {pinned}, load {load}")
    per_module: dict[str, dict] = {}
    decisions: dict[str, int] = {}
    profile = cProfile.Profile(time.process_time)
    with tempfile.TemporaryDirectory(prefix="mlgo-bench-") as d:
        responder = build_responder(Path(d))
        for i, m in enumerate(modules):
            turns: dict[str, list[Clocks]] = {v: [] for v in VARIANTS}
            for r in range(repeats):
                for v in round_order(i + r, VARIANTS):
                    turns[v].append(timed(run_variant, v, m, tc.clang, answers, responder))
            run = profile.runcall(compile_module, PROBLEM, m, tc.clang, answers)
            decisions[m.name] = run.num_decisions
            per_module[m.name] = {"decisions": run.num_decisions, **module_figures(turns)}
            med = per_module[m.name]["median_s"]
            console.print(
                f"{m.name}: {run.num_decisions} decisions, plain {med['plain']['wall']:.3f} s, "
                f"channel x{per_module[m.name]['ratio']['channel cpu']['median']:.2f} CPU, "
                f"plugin x{per_module[m.name]['ratio']['plugin cpu']['median']:.2f} CPU"
            )
    total = totals(per_module)
    python_parts = parts(pstats.Stats(profile), len(modules))
    searched = searches(modules, tc.clang, answers, search_budget, per_module)
    figures = {
        "toolchain": tc.describe(),
        "core": pinned,
        "load_before": load,
        "load_after": os.getloadavg(),
        "policy": str(policy) if policy else None,
        "repeats": repeats,
        "modules": per_module,
        "decisions": sum(decisions.values()),
        "total": total,
        "python_parts_s": python_parts,
        "search": searched,
    }
    report(figures)
    if json_out:
        save_json(json_out, figures, console)


def searches(
    modules: list[Module], clang: str, answers: Answerer, budget: int, per_module: dict[str, dict]
) -> dict | None:
    """Each module searched whole (`search_module`, BUDGET compiles, from ANSWERS' policy
    or the default) through the plugin and through the channel, in turns whose order flips
    module by module: each path's compiles a second on this core and CPU against that many
    plain compiles of the module (PER_MODULE's medians), and the modules where the two
    found other costs; None with no budget."""
    if not budget:
        return None
    spent = {p: Clocks(0.0, 0.0, 0.0) for p in ("plugin", "channel")}
    compiles, plain_cpu = dict.fromkeys(spent, 0), dict.fromkeys(spent, 0.0)
    best: dict[str, dict[str, float]] = {p: {} for p in spent}
    for i, m in enumerate(modules):
        for path in round_order(i, tuple(spent)):
            cfg = SearchConfig(budget=budget, in_plugin=path == "plugin")
            task = SearchTask(PROBLEM, m, clang, answers.policy, cfg)
            start = Clocks.now()
            r = search_module(task)
            took, was = Clocks.now().since(start), spent[path]
            spent[path] = Clocks(was.wall + took.wall, was.clang + took.clang,
                                 was.python + took.python)  # fmt: skip
            compiles[path] += r.compiles
            plain_cpu[path] += r.compiles * per_module[m.name]["median_s"]["plain"]["cpu"]
            best[path][m.name] = r.best.cost
    return {
        "budget": budget,
        **{
            path: {
                "compiles": compiles[path],
                "compiles_per_s": compiles[path] / spent[path].wall,
                "clang_cpu_s": spent[path].clang,
                "python_cpu_s": spent[path].python,
                "cpu_to_plain": spent[path].cpu / plain_cpu[path],
            }
            for path in spent
        },
        "other_costs": sorted(m for m in best["plugin"] if best["plugin"][m] != best["channel"][m]),
    }


def report(f: dict) -> None:
    table = Table("module", "decisions", "plain s", "channel/plain CPU", "plugin/plain wall",
                  "plugin/plain CPU", "responder/plain CPU")  # fmt: skip
    for name, m in f["modules"].items():
        r = m["ratio"]
        table.add_row(
            name,
            str(m["decisions"]),
            f"{m['median_s']['plain']['wall']:.3f}",
            *(
                f"{r[k]['median']:.2f} ({r[k]['min']:.2f}..{r[k]['max']:.2f})"
                for k in ("channel cpu", "plugin wall", "plugin cpu", "responder cpu")
            ),
        )
    console.print(table)
    t, s = f["total"], f["total"]["sum_s"]
    n = len(f["modules"])
    console.print(
        f"total over {n} modules ({f['decisions']} decisions): "
        + ", ".join(f"{k} x{v:.3f}" for k, v in t["ratio_of_sums"].items())
        + "\nper module, median (min..max): "
        + ", ".join(
            f"{k} x{v['median']:.2f} ({v['min']:.2f}..{v['max']:.2f})"
            for k, v in t["per_module_ratio"].items()
        )
        + f"\nCPU per compile, ms: plain clang {1e3 * s['plain']['clang'] / n:.1f}; search "
        f"channel clang {1e3 * s['channel']['clang'] / n:.1f} + Python "
        f"{1e3 * s['channel']['python'] / n:.1f}; plugin clang {1e3 * s['plugin']['clang'] / n:.1f}"
        f" + Python {1e3 * s['plugin']['python'] / n:.1f}"
        "\nPython per channel compile, profiled (inflated), ms: "
        + ", ".join(f"{k} {1e3 * v:.2f}" for k, v in f["python_parts_s"].items())
        + "".join(
            f"\nwhole searches through the {p}: {x[p]['compiles']} compiles, "
            f"{x[p]['compiles_per_s']:.2f} a second, CPU x{x[p]['cpu_to_plain']:.3f} of as "
            "many plain compiles"
            for x in [f["search"]]
            if x
            for p in ("plugin", "channel")
        )
        + (f"\nmodules whose best cost differs: {x['other_costs']}" if (x := f["search"]) else "")
        + f"\nload average before {f['load_before']}, after {f['load_after']}"
    )


if __name__ == "__main__":
    sys.exit(typer.run(main))
