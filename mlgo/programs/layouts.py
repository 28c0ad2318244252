"""A build's code in several places: where a program's functions lie decides how its hot
loops meet cache lines and the branch predictor, and relinking the same objects in another
order moved run time by more than any decision measured here (minilzip 0.424-0.499 s over
six orders). A speed figure from one layout is a figure about that layout, so a speed
tune's clock and its report also time each build over shuffled layouts.

The layouts of a build are made apart from it, so that its sizes and its own timing stay
those of the build as the user makes it: a separate tree built with `-ffunction-sections`
(each function a section of its own, which a link may move; it changes `.text` by its
alignment padding), whose compiler calls are logged (`wrappers.write_wrapper`); then, for
each seed, a copy of that tree in which every link the build ran is run again by lld with
`--shuffle-sections=.text*=SEED` (the workload runs programs by their path in the tree).
A variant's change over layouts pools its paired per-round changes at every layout
(`over_layouts`): its IQR holds the spread from layout to layout, so that only a change
that holds at most layouts has its whole IQR below zero, as the keep rule asks.
"""

from __future__ import annotations

import os
import shutil
import statistics
from collections.abc import Sequence
from pathlib import Path

from mlgo.corpus.extract import Invocation, logged_invocations
from mlgo.corpus.lto import NOT_LINKS, PROBES, Link, replay_command
from mlgo.llvm.driver import link_output
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import Recipe
from mlgo.programs.build import Building, Variant, build_program
from mlgo.programs.measure import (
    AGAIN,
    Timing,
    first_difference,
    in_percent,
    prepare_workload,
    recipe_workload,
    run_workload,
    runs_in,
    spread,
    timed_rounds,
    workload_output,
)
from mlgo.runtime.commands import BuildError, run_logged

LAYOUTS = 4  # shuffled layouts a speed figure is timed over, by default (0: none)
SECTIONS_FLAGS = ["-ffunction-sections"]


def shuffle_flags(seed: int) -> list[str]:
    """What a relink adds: lld, its functions' sections in SEED's order (seed 0 would be a
    random one: seeds start at 1)."""
    return ["-fuse-ld=lld", f"-Wl,--shuffle-sections=.text*={seed}"]


def program_links(invocations: list[Invocation], tree: Path) -> list[Link]:
    """The calls among a build's logged INVOCATIONS that linked, in TREE, a program or a
    shared library still there, in the order of their last run (an output linked twice is
    the last link's); the build system's probes are none."""
    links: dict[Path, Link] = {}
    for call in invocations:
        args = call.argv[1:]
        output = Path(os.path.normpath(call.cwd / link_output(args)))
        if NOT_LINKS & set(args) or PROBES & set(output.parts) or not output.is_file():
            continue
        if output.is_relative_to(tree) and call.cwd.is_relative_to(tree):
            links.pop(output, None)
            links[output] = Link(call.cwd, call.argv, output)
    return list(links.values())


def sections_tree(work: Path, variant: str) -> Path:
    """Where VARIANT's build with function sections is made in WORK (`layout_trees`): the
    root a build from decisions is told it builds."""
    return work.resolve() / f"{variant}-sections"


def layout_trees(
    recipe: Recipe,
    pristine: Path,
    work: Path,
    tc: Toolchain,
    variant: Variant,
    flags: list[str],
    layouts: int,
) -> dict[int, Path]:
    """VARIANT's build of RECIPE with FLAGS and function sections in WORK/<variant>-sections,
    and LAYOUTS copies of it, WORK/<variant>-layout-SEED, in which every link the build ran
    was run again with `shuffle_flags(SEED)`, by seed. VARIANT's compilers must still answer
    (a served policy's service running): a link that also compiles runs them again."""
    work = work.resolve()  # the wrappers log from inside the tree
    sections, logs = sections_tree(work, variant.name), work / f".{variant.name}-calls"
    shutil.rmtree(logs, ignore_errors=True)
    logs.mkdir(parents=True)
    built = [*flags, *SECTIONS_FLAGS]
    name = f"{variant.name}, function sections"
    compilers, env = variant.compilers, variant.env
    build_program(
        recipe,
        pristine,
        sections,
        tc,
        Variant(name, compilers, env),
        built,
        Building(tests=False, log_dir=logs),
    )
    links = program_links(logged_invocations(logs), sections)
    if not links:
        raise BuildError(f"{recipe.name} ({name}): its build linked no program to relink")
    log = work / f"{variant.name}-layouts.log"
    trees = {}
    for seed in range(1, layouts + 1):
        copy = sections.with_name(f"{variant.name}-layout-{seed}")
        shutil.rmtree(copy, ignore_errors=True)
        shutil.copytree(sections, copy, symlinks=True)
        for link in links:
            output = copy / link.output.relative_to(sections)
            output.unlink()  # written anew, never through a link into another tree
            cwd = copy / link.cwd.relative_to(sections)
            cmd = replay_command(link, [*built, *shuffle_flags(seed)], output)
            what = f"{recipe.name} ({variant.name}): relinking {output.name} at layout {seed}"
            run_logged(cmd, cwd, log, recipe.build_timeout_s, dict(os.environ, **env), what)
        prepare_workload(recipe, copy, f"{recipe.name} ({variant.name}, layout {seed}): bench")
        trees[seed] = copy
    return trees


def over_layouts(
    times: dict[str, list[float]], variant: str, base: str, seeds: Sequence[int]
) -> dict:
    """VARIANT's change against BASE over layouts, from TIMES by `<variant>@<seed>`: the
    median and IQR (in percent) of the paired per-round changes pooled over SEEDS, each
    seed's pair in the same round; each layout's own median beside it. Pooled, not the
    median of the per-layout medians: the IQR then holds the layouts' spread, not only the
    machine's noise, which the A/A control (the same build at the same layout) shows."""
    changes = {
        s: [a / b - 1 for a, b in zip(times[f"{variant}@{s}"], times[f"{base}@{s}"], strict=True)]
        for s in seeds
    }
    pooled = spread([c for s in seeds for c in changes[s]])
    return {
        **in_percent(pooled),
        "ratios_pct": [100 * c for c in pooled["runs"]],
        "layouts": len(seeds),
        "per_layout_pct": [100 * statistics.median(changes[s]) for s in seeds],
    }


def layouts_throughput(
    recipe: Recipe, placed: dict[str, dict[int, Path]], rounds: int, seconds: float = 1.0
) -> dict[str, dict]:
    """Every variant of PLACED (the baseline first; each one's layout trees by seed) timed
    at each layout on the recipe's workload, in ROUNDS rounds of `timed_rounds` with the
    baseline's layouts timed twice (the A/A control), each of them about SECONDS of CPU a
    round: each other variant's change over layouts (`over_layouts`), and the control's,
    named with AGAIN. Every layout (its workload prepared) must print what the baseline's
    first prints."""
    bench = recipe_workload(recipe)
    trees = {f"{v}@{s}": tree for v, layouts in placed.items() for s, tree in layouts.items()}
    base = next(iter(placed))
    seeds = list(placed[base])
    expected = workload_output(bench, trees[f"{base}@{seeds[0]}"])
    for key, tree in trees.items():
        if (printed := workload_output(bench, tree)) != expected:
            runs = f"the layouts {base}@{seeds[0]} and {key}"
            raise BuildError(f"{recipe.name}: {first_difference(expected, printed, runs)}")
    timed = {**trees, **{f"{base}{AGAIN}@{s}": trees[f"{base}@{s}"] for s in seeds}}
    loops = runs_in(bench, trees[f"{base}@{seeds[0]}"], seconds)
    times = timed_rounds(
        rounds, list(timed), lambda k: run_workload(bench, timed[k])[:2], turns=loops
    )
    others = [*list(placed)[1:], base + AGAIN]
    return {v: over_layouts(times["cpu"], v, base, seeds) | {"loops": loops} for v in others}


def policy_over_layouts(
    recipe: Recipe,
    pristine: Path,
    work: Path,
    tc: Toolchain,
    builds: Sequence[tuple[Variant, list[str]]],
    timing: Timing,
) -> dict:
    """A report's `throughput.layouts`: BUILDS (the baseline, the policy and any beside
    them, each a variant at its flags) of RECIPE from PRISTINE, at TIMING's layouts each in
    WORK (`layout_trees`) and timed there in its rounds (`layouts_throughput`): the
    policy's change over layouts, the A/A control's, and each one beside's change under
    its name (a PGO build)."""
    base, policy = builds[0][0], builds[1][0]
    placed = {
        v.name: layout_trees(recipe, pristine, work, tc, v, flags, timing.layouts)
        for v, flags in builds
    }
    changes = layouts_throughput(recipe, placed, timing.rounds, timing.seconds)
    control = changes[base.name + AGAIN]
    extra = {v.name: changes[v.name] for v, _ in builds[2:]}
    return (
        changes[policy.name]
        | {
            "control_change_pct": control["change_pct"],
            "control_iqr_pct": control["iqr_pct"],
            "rounds": timing.rounds,
        }
        | extra
    )
