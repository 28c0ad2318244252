"""Issue 39's first figure: does a reward predict run time before anything is trained on it?

    .venv/bin/python -m tools.bench_speed_reward --programs lua5.4,zstd --rounds 20 \\
        --work data/speed-reward --json data/speed-reward/speed_reward.json

For each program (a Debian source package and a fixed workload, `tools/bench_regalloc`'s),
at -O2:
- the workload's profile: an instrumented build runs it once;
- the default build (clang's own eviction advisor) with that profile and its block
  address map (`block_costs.BLOCK_MAP_FLAGS`);
- one build per eviction policy, with the same profile, through `mlgo-cc` (strict): the
  shipped policy, copies of it with Gaussian noise of growing scale on every weight (the
  population an evolution strategy draws from, so the changes run from nothing to large)
  and its opposite;
- every program built before any is timed;
- each build's workload run once under callgrind: its instructions, and how often each
  of the program's instructions ran, so its blocks' costs (`block_costs.WorkloadCost`):
  llvm-mca's cycles, the 64-byte lines they span, and the two summed;
- for each (policy, program) pair: each reward's change against the default, and
  the measured change: CPU time of the workload in rounds that time every build of the
  program in turn, the order flipped each round, with the default timed twice per round
  as an A/A control; median and interquartile range of the per-round ratios. The outputs
  must match the default's. Beside it, the change of callgrind's instruction count;
- the same change with the code's place averaged out (--layouts N): where a program's code
  lies decides how its hot loops meet the cache lines and the branch predictor, and moves
  run time by a few percent with no instruction changed (lua linked by ld.bfd ran 4.6%
  faster than the same objects linked by lld). So each build's program is linked again N
  times by lld from the objects its build left (RELINK), its sections in a shuffled order,
  the same N orders for every build, and every build at every order is timed in each
  round; a round's change is the build's summed time over the orders against the
  default's.
Spearman's rank correlation between each reward's change and the measured median, over
all pairs, and per program. A rerun reuses the builds, each build's counts (by the
program's hash) and the timed rounds, if they cover the same builds and --rounds.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from collections.abc import Callable
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table

from mlgo.llvm.block_costs import BLOCK_MAP_FLAGS, workload_cost
from mlgo.llvm.profiles import INSTRUMENT_FLAGS, MERGED, use_flags
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.packages.recipes import load_recipe
from mlgo.problems.policy_files import load_policy, save_policy
from mlgo.programs.build import (
    Building,
    Variant,
    build_program,
    plain_compilers,
    policy_service,
    pristine_source,
)
from mlgo.programs.compare import variants
from mlgo.programs.measure import (
    executed,
    paired_change,
    run_workload,
    runs_in,
    timed_rounds,
    workload_output,
)
from mlgo.programs.pgo import profile_workload
from mlgo.runtime.commands import BuildError, run_logged
from mlgo.runtime.files import atomic_path, atomic_write_text
from tools.lab.workloads import FLAGS, PROGRAMS, prepare_workload, save_json

console = Console(width=160)
SHIPPED = Path(__file__).resolve().parent.parent / "policies" / "regalloc-eviction"
# noise on every weight, relative to the weights' own spread: from a step of the
# evolution strategy's size to a policy that keeps little of the shipped one
NOISE = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 3.0, 10.0)
# what each build is counted, under callgrind: its blocks' cycles, the lines they span, the
# two summed (`block_costs.WorkloadCost`), and its instructions
REWARDS = ("block_cycles", "fetch_lines", "cycles_and_lines", "instructions")
# the lines a block spans are those of the program as built: ranked against its own times
# only, the others against the times over shuffled layouts too
PLACE_FREE_REWARDS = ("block_cycles", "instructions")
CLOCKS = ("wall", "cpu", "user")  # what each timed run measures (`Run`)
# the measured changes the rewards are ranked against: CPU time, and its user part alone
# (the program's own code; the kernel's file I/O is a third of zstd's CPU and its noise)
MEASURED_CLOCKS = ("cpu", "user")
# Each program linked again from the objects its build left, with $LAYOUT after its own
# flags (the build's own link line, the objects in any order: they are shuffled anyway).
RELINK = {
    "lua5.4": '"$CC" -std=gnu99 -o src/lua src/lua.o src/liblua.a -lm -Wl,-E -ldl $LAYOUT',
    "zstd": '"$CC" -o programs/zstd programs/obj/conf_*/*.o -pthread -lz -llzma $LAYOUT',
    "sqlite3": '"$CC" -o speedtest1 speedtest1.o .libs/libsqlite3.a -lm -lpthread -ldl $LAYOUT',
}


def policy_population(out: Path, seed: int = 0) -> dict[str, Path]:
    """The shipped policy, its noisy copies, and its opposite (every score negated: it
    evicts what the shipped one keeps), written under OUT."""
    shipped = load_policy(SHIPPED)
    theta = shipped.flat()
    rng = np.random.default_rng(seed)
    policies = {"shipped": SHIPPED}
    for scale in NOISE:
        noisy = theta + scale * theta.std() * rng.standard_normal(theta.size)
        name = f"noise-{scale:g}"
        save_policy(shipped.with_flat(noisy.astype(np.float32)), out / name)
        policies[name] = out / name
    last = shipped.weights[-2:]  # the output layer's weights and bias
    opposite = replace(shipped, weights=[*shipped.weights[:-2], *(-w for w in last)])
    save_policy(opposite, out / "opposite")
    policies["opposite"] = out / "opposite"
    return policies


def build(prog_name: str, tc: Toolchain, work: Path, v: Variant, flags: list[str]) -> Path:
    """One build of the program with FLAGS at WORK/<variant>, its workload prepared;
    reused when its stamp says it finished."""
    prog = PROGRAMS[prog_name]
    stamp = work / f"{v.name}.done"
    if not stamp.exists():
        recipe = load_recipe(prog.recipe)
        pristine = pristine_source(recipe, work)
        with console.status(f"{prog_name}: building {v.name}"):
            build_program(recipe, pristine, work / v.name, tc, v, flags, Building(tests=False))
            prepare_workload(prog, tc, work, v, flags)
        stamp.write_text("")
    return work / v.name


def workload_profile(prog_name: str, tc: Toolchain, work: Path) -> Path:
    """WORK/default.profdata: the workload's profile, run once on an instrumented build."""
    if (merged := work / MERGED).exists():
        return merged
    instrumented = Variant("instrumented", plain_compilers(tc), {})
    tree = build(prog_name, tc, work, instrumented, [*FLAGS, *INSTRUMENT_FLAGS])
    with console.status(f"{prog_name}: the workload, instrumented"):
        return profile_workload(PROGRAMS[prog_name], tree, work, tc)


def build_all(name: str, tc: Toolchain, work: Path, policies: dict[str, Path]) -> dict[str, Path]:
    """The program's default build and one per policy, all with the workload's profile."""
    pwork = work / name
    pwork.mkdir(parents=True, exist_ok=True)
    profile = workload_profile(name, tc, pwork)
    flags = [*FLAGS, *BLOCK_MAP_FLAGS, *use_flags(profile)]
    trees = {"default": build(name, tc, pwork, variants(tc, {}, ("default", ""))[0], flags)}
    for pname, policy in policies.items():
        with policy_service([policy], pwork / f"service-{pname}") as env:
            served = variants(tc, env, ("default", pname))[1]
            trees[pname] = build(name, tc, pwork, served, flags)
    return trees


def counted(prog_name: str, tree: Path, tc: Toolchain, known: dict, cache: Path) -> dict:
    """The build's instructions on its workload, under callgrind, and its block cost with
    the counts of that run; kept in CACHE by the program's hash."""
    prog = PROGRAMS[prog_name]
    binary = tree / prog.commands[0][0]
    key = hashlib.sha256(binary.read_bytes()).hexdigest()
    saved = json.loads(cache.read_text()) if cache.exists() else {}
    if set(REWARDS) - set(saved.get(key, {})):
        with console.status(f"{prog_name} ({tree.name}): its workload under callgrind"):
            ran = executed(prog, tree, by_address=True)
            cost = workload_cost(ran.by_object, tc, known)
        saved[key] = {
            "block_cycles": cost.cycles,
            "fetch_lines": cost.lines,
            "cycles_and_lines": cost.cycles_and_lines,
            "instructions": ran.instructions,
        }
        atomic_write_text(cache, json.dumps(saved))
    return saved[key]


def measured(times: dict, v: str) -> dict:
    """V's change against the default by each clock of TIMES (per-round series): the
    median and spread over all rounds, and the medians of the first and the second half
    of the rounds apart (how well the measure agrees with itself)."""
    out = {}
    for clock in MEASURED_CLOCKS:
        ours, base = times[clock][v], times[clock]["default"]
        half = len(base) // 2
        out[clock] = paired_change(ours, base) | {
            "halves": [
                paired_change(ours[:half], base[:half])["median"],
                paired_change(ours[half:], base[half:])["median"],
            ]
        }
    return out


def bench_program(
    name: str,
    tc: Toolchain,
    pwork: Path,
    trees: dict[str, Path],
    policies: dict[str, Path],
    rounds: int,
    seeds: range,
    layout_rounds: int,
) -> dict:
    """The rewards and the measured changes of the program's builds TREES, as built and
    with the layout averaged out over SEEDS (none: not measured)."""
    prog = PROGRAMS[name]
    expected = workload_output(prog, trees["default"])
    for pname in policies:
        if workload_output(prog, trees[pname]) != expected:
            raise BuildError(f"{name} built with {pname}: the workload's output differs")
    known: dict = {}  # most blocks are the same code in every build: costed once
    cache = pwork / "counted.json"
    counts = {v: counted(name, tree, tc, known, cache) for v, tree in trees.items()}
    counts["default again"] = counts["default"]
    timed = {**trees, "default again": trees["default"]}

    def rounds_as_built() -> dict:  # the builds take turns run by run, a second each a round
        loops = runs_in(prog, trees["default"], 1.0)

        def sample(v: str) -> tuple[float, ...]:
            return run_workload(prog, timed[v])[:3]

        times = timed_rounds(rounds, list(timed), sample, clocks=CLOCKS, turns=loops)
        return times | {"loops": loops}

    key = {"rounds": rounds, "builds": sorted(timed)}
    as_built = saved_rounds(pwork / "times.json", key, rounds_as_built)
    loops = as_built["loops"]
    averaged = (
        saved_rounds(
            pwork / "layout-times.json",
            key | {"seeds": list(seeds), "rounds": layout_rounds, "loops": loops},
            lambda: layout_averaged(name, trees, tc, seeds, layout_rounds, loops),
        )
        if seeds
        else {}
    )
    pairs = {}
    for v in [*policies, "default again"]:
        pairs[v] = {
            f"{reward}_change": counts[v][reward] / counts["default"][reward] - 1
            for reward in REWARDS
        }
        pairs[v]["measured"] = measured(as_built, v)
        if seeds:
            pairs[v]["measured, layouts averaged"] = measured(averaged, v)
        if v in policies:
            pairs[v]["policy"] = str(policies[v])
    return {"loops": loops, "counted": counts, "pairs": pairs}


def saved_rounds(path: Path, key: dict, measure: Callable[[], dict]) -> dict:
    """The timed rounds saved at PATH if they were taken as KEY says; else MEASURE's, saved."""
    saved = json.loads(path.read_text()) if path.exists() else {}
    if saved.get("key") != key:
        saved = {"key": key, "times": measure()}
        atomic_write_text(path, json.dumps(saved))
    return saved["times"]


def install(source: Path, target: Path) -> None:
    """SOURCE's bytes at TARGET, replaced whole: a program is never half there."""
    with atomic_path(target) as staged:
        shutil.copy2(source, staged)


def layouts(prog_name: str, tree: Path, tc: Toolchain, seeds: range) -> dict[int, Path]:
    """The build's program linked again by lld once per seed, its input sections in that
    seed's order, each kept beside the program (reused by a rerun); the program as built
    is left in place."""
    binary = tree / PROGRAMS[prog_name].commands[0][0]
    built = binary.with_name(binary.name + ".as-built")
    if not built.exists():
        shutil.copy2(binary, built)
    out = {}
    for seed in seeds:
        out[seed] = binary.with_name(f"{binary.name}.layout-{seed}")
        if not out[seed].exists():
            layout = f"-fuse-ld=lld -Wl,--shuffle-sections=.text*={seed}"
            env = dict(os.environ, CC=tc.clang, LAYOUT=layout)
            log = tree.parent / f"{tree.name}.relink.log"
            run_logged(RELINK[prog_name], tree, log, 600, env, f"{prog_name}: relinking")
            os.replace(binary, out[seed])
    install(built, binary)
    return out


def layout_averaged(
    prog_name: str, trees: dict[str, Path], tc: Toolchain, seeds: range, rounds: int, loops: int
) -> dict:
    """Each build's times with the code's place averaged out: in every round, every build
    at every layout, and the build's time summed over the layouts (by clock, by build)."""
    prog = PROGRAMS[prog_name]
    placed = {v: layouts(prog_name, tree, tc, seeds) for v, tree in trees.items()}
    placed["default again"] = placed["default"]
    binary = Path(prog.commands[0][0])

    def sample(key: str) -> tuple[float, ...]:
        v, seed = key.rsplit("@", 1)
        tree = trees["default" if v == "default again" else v]
        install(placed[v][int(seed)], tree / binary)
        return run_workload(prog, tree, loops=loops)[:3]

    keys = [f"{v}@{seed}" for v in placed for seed in seeds]
    try:
        with console.status(f"{prog_name}: {rounds} rounds of {len(keys)} builds and layouts"):
            times = timed_rounds(rounds, keys, sample, clocks=CLOCKS)
    finally:  # every program as built again
        for tree in trees.values():
            install(tree / binary.with_name(binary.name + ".as-built"), tree / binary)
    return {
        clock: {
            v: [sum(series[f"{v}@{seed}"][r] for seed in seeds) for r in range(rounds)]
            for v in placed
        }
        for clock, series in times.items()
    }


def rank(rows: list[tuple[float, float]]) -> float | None:
    """Spearman's rho of ROWS' (reward change, measured change); None below three pairs or
    when either side never moves (it is undefined then)."""
    rewards, measured = [r for r, _ in rows], [m for _, m in rows]
    if len(rows) < 3 or len(set(rewards)) < 2 or len(set(measured)) < 2:
        return None
    from scipy.stats import spearmanr  # over a second to import: only where it ranks

    return float(spearmanr(rewards, measured).statistic)


def main(
    programs: Annotated[str, typer.Option(help="comma-separated, of " + ",".join(PROGRAMS))] = (
        "lua5.4,zstd,sqlite3"
    ),
    rounds: Annotated[int, typer.Option(help="timed rounds")] = 10,
    work: Annotated[Path, typer.Option(help="where the builds go")] = Path("data/speed-reward"),
    layouts: Annotated[int, typer.Option(help="links of each build, its code shuffled")] = 4,
    layout_rounds: Annotated[int, typer.Option(help="timed rounds of every layout")] = 8,
    json_out: Annotated[Path | None, typer.Option("--json")] = None,
) -> None:
    tc = find_toolchain()
    work = work.resolve()
    names = [p for p in programs.split(",") if p]
    if unknown := set(names) - set(PROGRAMS):
        raise typer.BadParameter(f"unknown programs {sorted(unknown)}; have {sorted(PROGRAMS)}")
    if shutil.which("valgrind") is None:
        raise typer.BadParameter("valgrind is missing; run tools/setup.sh")
    policies = policy_population(work / "policies")
    result = {"toolchain": tc.describe(), "flags": [*FLAGS, *BLOCK_MAP_FLAGS], "rounds": rounds}
    seeds = range(1, layouts + 1)
    kinds = ["measured", *(["measured, layouts averaged"] if layouts else [])]
    columns = [(kind, clock) for kind in kinds for clock in MEASURED_CLOCKS]
    table = Table(
        "program", "policy", *REWARDS,
        *(f"{clock} time{kind.removeprefix('measured')}" for kind, clock in columns),
        title="rewards against run time: median change (IQR)",
    )  # fmt: skip
    # (x, y) rows ranked against each other: each reward's change and each measured change,
    # and each measure's first half of the rounds against its second half
    ranked: dict[str, list[tuple[float, float]]] = {}
    built = {name: build_all(name, tc, work, policies) for name in names}  # then, quieter:
    for name in names:
        r = result[name] = bench_program(
            name, tc, work / name, built[name], policies, rounds, seeds, layout_rounds
        )
        own: dict[str, list[tuple[float, float]]] = {}
        for v, pair in r["pairs"].items():
            changes = [pair[kind][clock] for kind, clock in columns]
            table.add_row(
                name, v, *(f"{pair[f'{reward}_change']:+.2%}" for reward in REWARDS),
                *(f"{c['median']:+.2%} ({c['q1']:+.2%}..{c['q3']:+.2%})" for c in changes),
            )  # fmt: skip
            if v == "default again":
                continue
            for (kind, clock), c in zip(columns, changes, strict=True):
                what = f"{clock} time{kind.removeprefix('measured')}"
                for reward in REWARDS if kind == "measured" else PLACE_FREE_REWARDS:
                    rows = own.setdefault(f"{reward} ~ {what}", [])
                    rows.append((pair[f"{reward}_change"], c["median"]))
                own.setdefault(f"{what}: first half ~ second half", []).append(tuple(c["halves"]))
        r["spearman"] = {k: rank(rows) for k, rows in own.items()}
        for k, rows in own.items():
            ranked.setdefault(k, []).extend(rows)
    result["spearman"] = {k: rank(rows) for k, rows in ranked.items()}
    result["pairs"] = len(policies) * len(names)
    console.print(table)
    for k, rho in result["spearman"].items():
        each = ", ".join(f"{n} {result[n]['spearman'][k]}" for n in names)
        console.print(f"Spearman, {k}: {rho} over {len(ranked[k])} pairs ({each})")
    if json_out:
        save_json(json_out, result, console)


if __name__ == "__main__":
    typer.run(main)
