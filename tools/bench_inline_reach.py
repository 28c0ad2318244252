"""How far inlining alone moves a program's speed at -O2: the reach a tune of the inliner for
speed (issue 39) can hope for, measured before one is trained.

  .venv/bin/python -m tools.bench_inline_reach cmark --thresholds 0 100 225 500 2000 \\
      --work data/bench-tune --json data/inline-reach-cmark.json

A project of `tools.bench_tune` built by plain clang -O2 (the baseline) and once more for
each inline threshold given (`-mllvm -inline-threshold=N`; -O2's own is 225), each with
the block address map (which changes no instruction) and its tests run. Each build is
costed on the project's workload by the reward a speed tune trains on (`block_costs.
workload_cost`: llvm-mca's cycles plus the lines fetched, on callgrind's counts), and timed
against the baseline in paired rounds run by run, with the A/A control beside
(`recipe_throughput`); with --layouts N, both also relinked at N shuffled function orders
each and timed over them (`programs.layouts`), so that a change that is only where the code
happened to lie shows as one. A threshold given on the command line is not quite -O2's own at
225: clang then drops the lower threshold of cold callees (-inlinecold-threshold), so 225
given is the control of that regime. A threshold moves every call site one way; a
per-call-site policy can do better than the best of them, so their best is a floor on the
ceiling, and the rank of the reward against the time over these builds checks it on
inlining's changes.

With --pgo, the same on top of profile-guided optimization, the build a performance
engineer makes anyway: the baseline is -O2 with the workload's profile (`programs.pgo`:
an instrumented build, the workload run once apart from the timed runs, the profile
merged), each threshold is built with that profile too, and plain -O2 without it is one
more row ("no profile"), so PGO's own change stands beside inlining's reach over it.
With a profile, clang's inliner gives the call sites it made hot their own threshold
(-hot-callsite-threshold, 3000) and the cold ones theirs (45): -inline-threshold moves
only the others. `--pgo --hot` moves the hot sites' threshold instead.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.errors import USER_ERRORS
from mlgo.llvm.block_costs import BLOCK_MAP_FLAGS, Code
from mlgo.llvm.profiles import MERGED, use_flags
from mlgo.llvm.sizes import compare_trees, linked_rows, tree_totals
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.packages.recipes import Recipe
from mlgo.programs.build import (
    Variant,
    build_program,
    level_flags,
    plain_compilers,
    pristine_source,
)
from mlgo.programs.layouts import layout_trees, layouts_throughput
from mlgo.programs.measure import AGAIN, recipe_throughput
from mlgo.programs.pgo import PROFILE, instrumented_profile
from mlgo.programs.report import throughput_change
from mlgo.programs.speed import tree_cost
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.messages import error_line
from tools.lab.projects import PROJECTS, RETIMED, project_recipe

console = Console()
LEVEL = "-O2"
BASELINE = "plain"
NO_PROFILE = "no profile"  # with --pgo: plain -O2, timed against the PGO build


def build_costed(
    recipe: Recipe, source: Path, tree: Path, tc: Toolchain, extra: list[str], known: dict
) -> dict:
    """RECIPE built from SOURCE into TREE at LEVEL with EXTRA flags and tested (once: a
    finished build is read back); its workload cost and instructions."""
    done = tree.parent / f"{tree.name}.json"
    if done.is_file():
        return json.loads(done.read_text())
    flags = [*level_flags(LEVEL), *BLOCK_MAP_FLAGS, *extra]
    built = build_program(
        recipe, source, tree, tc, Variant(tree.name, plain_compilers(tc), {}), flags
    )
    cost, instructions = tree_cost(recipe, tree, tc, known, tree.name)
    result = {"flags": extra, "cost": cost, "instructions": instructions, "tests": built.tests}
    atomic_write_text(done, json.dumps(result, indent=1))
    return result


def profile_flags(recipe: Recipe, source: Path, where: Path, tc: Toolchain) -> list[str]:
    """The flags that build RECIPE with its workload's profile, made once in WHERE/profile."""
    profile = where / PROFILE / MERGED
    if not profile.is_file():
        profile = instrumented_profile(recipe, source, where / PROFILE, tc, level_flags(LEVEL))
    return use_flags(profile)


def reach(
    name: str,
    thresholds: list[int],
    work: Path,
    rounds: int,
    seconds: float,
    layouts: int = 0,
    pgo: bool = False,
    switch: str = "-inline-threshold",
) -> dict:
    """NAME's baseline and one build per threshold in WORK/NAME/inline-reach (with PGO:
    inline-reach-pgo, all with the workload's profile, and plain -O2 as one more row), each
    against the baseline: .text, the workload cost, instructions and CPU time, in percent
    (with LAYOUTS, over that many layouts too). SWITCH: the threshold each build moves."""
    recipe = project_recipe(name)
    source = pristine_source(recipe, work / name)
    tc = find_toolchain()
    where = work / name / ("inline-reach-pgo" if pgo else "inline-reach")
    known: dict[Code, float] = {}
    profiled = profile_flags(recipe, source, where, tc) if pgo else []
    base = build_costed(recipe, source, where / BASELINE, tc, profiled, known)

    def placed(variant: str, extra: list[str]) -> dict[int, Path]:  # its layouts, by seed
        plain = Variant(variant, plain_compilers(tc), {})
        flags = [*level_flags(LEVEL), *extra]
        return layout_trees(recipe, source, where / "layouts", tc, plain, flags, layouts)

    base_layouts = placed(BASELINE, profiled) if layouts else {}
    builds = {str(t): [*profiled, "-mllvm", f"{switch}={t}"] for t in thresholds}
    if pgo:
        builds[NO_PROFILE] = []
    rows = {}
    for label, extra in builds.items():
        tree = where / (f"threshold-{label}" if label != NO_PROFILE else "no-profile")
        built = build_costed(recipe, source, tree, tc, extra, known)
        timed = recipe_throughput(
            recipe, {BASELINE: where / BASELINE, tree.name: tree}, rounds, seconds
        )
        if layouts:
            both = {BASELINE: base_layouts, tree.name: placed(tree.name, extra)}
            over = layouts_throughput(recipe, both, rounds, seconds)
            control = over[BASELINE + AGAIN]
            timed["layouts"] = over[tree.name] | {
                f"control_{k}": control[k] for k in ("change_pct", "iqr_pct")
            }
        rows[label] = {
            **built,
            # every ELF file the build made: a project's recipe names no programs
            "text_pct": tree_totals(linked_rows(compare_trees(tree, where / BASELINE)))[
                "delta_pct"
            ],
            "cost_pct": 100 * (built["cost"] / base["cost"] - 1),
            "throughput": timed,
        }
        line = f"{name}: {label}: {throughput_change(timed)}"
        if layouts:
            line += f", over {layouts} layouts {throughput_change(timed['layouts'])}"
            line += f" (A/A {throughput_change(timed['layouts'], 'control_')})"
        console.print(line, highlight=False)
    costs = [r["cost_pct"] for r in rows.values()]
    times = [r["throughput"]["change_pct"] for r in rows.values()]
    from scipy.stats import spearmanr  # over a second to import: only where it ranks

    rho = spearmanr(costs, times).statistic if len(rows) >= 3 else None
    result = {"baseline": base, "thresholds": rows, "spearman_cost_vs_cpu": rho, "pgo": pgo}
    return result | {"switch": switch}


def table(name: str, result: dict) -> Table:
    against = (
        "clang -O2 with the workload's profile" if result.get("pgo") else f"plain clang {LEVEL}"
    )
    t = Table(title=f"{name}: inlining's reach at {LEVEL} (against {against})")
    switch = result.get("switch", "-inline-threshold")
    columns = [switch, ".text", "workload cost", "instructions", "CPU time", "A/A"]
    over = next((r["throughput"].get("layouts") for r in result["thresholds"].values()), None)
    if over:
        columns += [f"CPU time over {over['layouts']} layouts", "A/A over them"]
    for column in columns:
        t.add_column(column)
    for threshold, r in result["thresholds"].items():
        speed = r["throughput"]
        t.add_row(
            str(threshold),
            f"{r['text_pct']:+.2f}%",
            f"{r['cost_pct']:+.2f}%",
            f"{speed['instructions_change_pct']:+.2f}%" if "instructions" in speed else "n/a",
            throughput_change(speed),
            throughput_change(speed, "control_"),
            *(
                [
                    throughput_change(speed["layouts"]),
                    throughput_change(speed["layouts"], "control_"),
                ]
                if over
                else []
            ),
        )
    return t


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("projects", nargs="+", choices=sorted(PROJECTS))
    parser.add_argument("--thresholds", type=int, nargs="+", default=[0, 100, 225, 500, 2000])
    parser.add_argument("--work", type=Path, default=Path("data/bench-tune"))
    parser.add_argument("--rounds", type=int, default=RETIMED[0])
    parser.add_argument("--seconds", type=float, default=RETIMED[1], help="CPU s a build a round")
    parser.add_argument("--layouts", type=int, default=0, help="shuffled layouts also timed")
    parser.add_argument("--json", type=Path)
    parser.add_argument("--pgo", action="store_true", help="on top of the workload's PGO build")
    parser.add_argument(
        "--hot", action="store_true", help="move -hot-callsite-threshold (with --pgo; 3000)"
    )
    args = parser.parse_args()
    switch = "-hot-callsite-threshold" if args.hot else "-inline-threshold"
    results = {}
    for name in args.projects:
        try:
            timing = (args.rounds, args.seconds, args.layouts)
            results[name] = reach(name, args.thresholds, args.work, *timing, args.pgo, switch)
        except USER_ERRORS as e:
            console.print(f"[red]{name}: {error_line(e)}", highlight=False)
            continue
        console.print(table(name, results[name]))
        rho = results[name]["spearman_cost_vs_cpu"]
        if rho is not None:
            console.print(f"{name}: Spearman, workload cost against CPU time: {rho:+.2f}")
        if args.json:
            atomic_write_text(args.json, json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
