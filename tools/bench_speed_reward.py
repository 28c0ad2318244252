"""Issue 39's first figure: does a reward predict run time before anything is trained on it?

    .venv/bin/python -m tools.bench_speed_reward --programs lua5.4,zstd --rounds 20 \\
        --no-callgrind --work data/speed-reward --json data/speed-reward/speed_reward.json

For each program (a Debian source package and a fixed workload, `tools/bench_regalloc`'s),
at -O2:
- the workload's profile: an instrumented build runs it once;
- the default build (clang's own eviction advisor) with that profile and its blocks' runs
  in the block address map (`block_costs.BLOCK_MAP_FLAGS`);
- one build per eviction policy, with the same profile, through `mlgo-cc` (strict): the
  shipped policy, copies of it with Gaussian noise of growing scale on every weight (the
  population an evolution strategy draws from, so the changes run from nothing to large)
  and its opposite;
- every program built before any is timed;
- for each (policy, program) pair: the reward's change against the default (the block
  cost, `block_costs.workload_cycles`), and the measured change: CPU time of the
  workload in rounds that time every build of the program in turn, the order flipped
  each round, with the default timed twice per round as an A/A control; median and
  interquartile range of the per-round ratios. The outputs must match the default's.
  Beside it, callgrind's instruction count of each build (--no-callgrind: not counted).
Spearman's rank correlation between each reward's change and the measured median, over
all pairs, and per program.
"""

from __future__ import annotations

import json
import shutil
from dataclasses import replace
from pathlib import Path
from typing import Annotated

import numpy as np
import typer
from rich.console import Console
from rich.table import Table
from scipy.stats import spearmanr

from mlgo.llvm.block_costs import BLOCK_MAP_FLAGS, workload_cycles
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.packages.build import PROFILE_USE_FLAGS
from mlgo.packages.recipes import load_recipe
from mlgo.problems.policy_files import load_policy, save_policy
from mlgo.programs.build import build_program, plain_compilers, policy_service, pristine_source
from mlgo.programs.compare import Variant, variants
from mlgo.programs.measure import (
    instructions,
    paired_change,
    run_workload,
    timed_rounds,
    workload_output,
)
from mlgo.runtime.commands import BuildError, run_logged
from mlgo.runtime.files import atomic_write_text
from tools.bench_regalloc import FLAGS, PROGRAMS, prepare_workload, save_json

console = Console(width=160)
SHIPPED = Path(__file__).resolve().parent.parent / "policies" / "regalloc-eviction"
# noise on every weight, relative to the weights' own spread: from a step of the
# evolution strategy's size to a policy that keeps little of the shipped one
NOISE = (0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 3.0, 10.0)


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
            build_program(
                recipe, pristine, work / v.name, tc, v.name, v.compilers, v.env, False, flags
            )
            prepare_workload(prog, tc, work, v, flags)
        stamp.write_text("")
    return work / v.name


def workload_profile(prog_name: str, tc: Toolchain, work: Path) -> Path:
    """WORK/workload.profdata: the workload's profile, run once on an instrumented build."""
    merged = work / "workload.profdata"
    if merged.exists():
        return merged
    instrumented = Variant("instrumented", plain_compilers(tc), {})
    tree = build(prog_name, tc, work, instrumented, [*FLAGS, "-fprofile-instr-generate"])
    raw = work / "profraw"
    shutil.rmtree(raw, ignore_errors=True)
    raw.mkdir()
    with console.status(f"{prog_name}: the workload, instrumented"):
        run_workload(PROGRAMS[prog_name], tree, ("env", f"LLVM_PROFILE_FILE={raw}/%p.profraw"))
    merge = [tc.tool("llvm-profdata"), "merge", "-o", str(merged), *map(str, raw.iterdir())]
    run_logged(merge, work, work / "profile.log", 600, what=f"{prog_name}: llvm-profdata merge")
    return merged


def build_all(name: str, tc: Toolchain, work: Path, policies: dict[str, Path]) -> dict[str, Path]:
    """The program's default build and one per policy, all with the workload's profile."""
    pwork = work / name
    pwork.mkdir(parents=True, exist_ok=True)
    profile = workload_profile(name, tc, pwork)
    flags = [*FLAGS, *BLOCK_MAP_FLAGS, f"-fprofile-instr-use={profile}", *PROFILE_USE_FLAGS]
    trees = {"default": build(name, tc, pwork, variants(tc, {}, ("default", ""))[0], flags)}
    for pname, policy in policies.items():
        with policy_service([policy], pwork / f"service-{pname}") as env:
            served = variants(tc, env, ("default", pname))[1]
            trees[pname] = build(name, tc, pwork, served, flags)
    return trees


def bench_program(
    name: str,
    tc: Toolchain,
    pwork: Path,
    trees: dict[str, Path],
    policies: dict[str, Path],
    rounds: int,
    callgrind: bool,
) -> dict:
    """The rewards and the measured changes of the program's builds TREES."""
    prog = PROGRAMS[name]
    expected = workload_output(prog, trees["default"])
    for pname in policies:
        if workload_output(prog, trees[pname]) != expected:
            raise BuildError(f"{name} built with {pname}: the workload's output differs")
    binary = Path(prog.commands[0][0])
    known: dict = {}  # most blocks are the same code in every build: costed once
    cycles = {v: workload_cycles(tree / binary, tc, known) for v, tree in trees.items()}
    counted = pwork / "instructions.json"
    executed = json.loads(counted.read_text()) if counted.exists() else {}
    for v, tree in trees.items() if callgrind else ():
        if v not in executed:
            with console.status(f"{name} ({v}): instructions, under callgrind"):
                executed[v] = instructions(prog, tree)
            atomic_write_text(counted, json.dumps(executed))
    loops = max(1, round(1.0 / run_workload(prog, trees["default"])[1]))
    timed = {**trees, "default again": trees["default"]}
    cycles["default again"] = cycles["default"]
    with console.status(f"{name}: {rounds} timed rounds of {len(timed)} builds"):
        times = timed_rounds(
            rounds, list(timed), lambda v: run_workload(prog, timed[v], loops=loops)[:2]
        )
    atomic_write_text(pwork / "times.json", json.dumps(times))
    cpu = times["cpu"]
    pairs = {
        v: {
            "block_cycles_change": cycles[v] / cycles["default"] - 1,
            "cpu_change": paired_change(cpu[v], cpu["default"]),
        }
        for v in [*policies, "default again"]
    }
    for v in policies:
        pairs[v]["policy"] = str(policies[v])
        if v in executed:
            pairs[v]["instructions_change"] = executed[v] / executed["default"] - 1
    return {"loops": loops, "block_cycles": cycles, "instructions": executed, "pairs": pairs}


def rank(rows: list[tuple[float, float]]) -> float | None:
    """Spearman's rho of ROWS' (reward change, measured change); None below three pairs or
    when either side never moves (it is undefined then)."""
    rewards, measured = [r for r, _ in rows], [m for _, m in rows]
    if len(rows) < 3 or len(set(rewards)) < 2 or len(set(measured)) < 2:
        return None
    return float(spearmanr(rewards, measured).statistic)


def main(
    programs: Annotated[str, typer.Option(help="comma-separated, of " + ",".join(PROGRAMS))] = (
        "lua5.4,zstd,sqlite3"
    ),
    rounds: Annotated[int, typer.Option(help="timed rounds")] = 10,
    work: Annotated[Path, typer.Option(help="where the builds go")] = Path("data/speed-reward"),
    callgrind: Annotated[bool, typer.Option(help="each build's instructions, beside")] = True,
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
    table = Table(
        "program", "policy", "block cycles", "instructions", "CPU time (IQR)",
        title="reward against run time",
    )  # fmt: skip
    every: list[tuple[float, float]] = []
    by_instructions: list[tuple[float, float]] = []
    built = {name: build_all(name, tc, work, policies) for name in names}  # then, quieter:
    for name in names:
        r = result[name] = bench_program(
            name, tc, work / name, built[name], policies, rounds, callgrind
        )
        own = []
        for v, pair in r["pairs"].items():
            cpu = pair["cpu_change"]
            executed = pair.get("instructions_change")
            table.add_row(
                name, v, f"{pair['block_cycles_change']:+.2%}",
                "" if executed is None else f"{executed:+.2%}",
                f"{cpu['median']:+.2%} ({cpu['q1']:+.2%}..{cpu['q3']:+.2%})",
            )  # fmt: skip
            if v != "default again":
                own.append((pair["block_cycles_change"], cpu["median"]))
            if executed is not None:
                by_instructions.append((executed, cpu["median"]))
        r["spearman"] = rank(own)
        every += own
    result["spearman"] = rank(every)
    result["spearman_instructions"] = rank(by_instructions)
    result["pairs"] = len(every)
    console.print(table)
    console.print(
        f"Spearman, block cycles against CPU time: {result['spearman']} over {len(every)} pairs; "
        + ", ".join(f"{n} {result[n]['spearman']}" for n in names)
        + f"; callgrind's instructions against CPU time: {result['spearman_instructions']}"
    )
    if json_out:
        save_json(json_out, result)


if __name__ == "__main__":
    typer.run(main)
