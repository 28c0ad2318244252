"""How fast a program runs, measured so that machine noise cancels: a fixed workload in a
build tree, timed in paired rounds in which the builds take turns run by run (ABBA: their
order flips every turn) with the CPU of the workload's own processes, and counted exactly
under callgrind.

CPU time is user+sys from each process's rusage as `wait4` reaps it, so what other jobs
on the machine spend does not count, it only slows the run; a variant's change is the
median and interquartile range of its per-round ratios against the first variant.
"""

from __future__ import annotations

import os
import re
import resource
import shlex
import shutil
import statistics
import subprocess
import tempfile
import time
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, NamedTuple

from mlgo.llvm.block_costs import CALLGRIND_OPTIONS, executions
from mlgo.packages.recipes import BENCH_TIMEOUT_S, NOTHING_VOLATILE, Recipe
from mlgo.runtime.commands import BuildError, run_grouped, run_logged

CLOCKS = ("wall", "cpu")


class Timing(NamedTuple):
    """How a workload's clock is read: ROUNDS paired rounds of about SECONDS of CPU a build
    each, as built and over LAYOUTS shuffled layouts of each build (0: as built only)."""

    rounds: int
    seconds: float
    layouts: int


@dataclass(frozen=True)
class Workload:
    """What runs in a program's build tree, and how its result is checked."""

    recipe: str
    prepare: tuple[str, ...]  # shell, in the build tree, after the recipe's build
    commands: tuple[tuple[str, ...], ...]  # argv lists, measured
    check: str = "true"  # shell, after the workload ran: its result is right
    volatile: str = NOTHING_VOLATILE  # what may differ between two builds' output (timings)
    timeout_s: float = BENCH_TIMEOUT_S  # a command's run, killed past it (`run_bounded`)


# How much slower a program runs under callgrind than on its own (valgrind's manual: 20 to
# 100 times): a counted run's timeout is this many of a timed run's.
CALLGRIND_SLOWDOWN = 100


def run_bounded(
    argv: Sequence[str], tree: Path, timeout_s: float, command: Sequence[str], **popen: Any
) -> tuple[int, resource.struct_rusage]:
    """ARGV, which runs the workload's COMMAND, run in TREE in a process group of its own
    (`run_grouped`: the group is killed once it ends, however it ends): its exit code and
    rusage. Past TIMEOUT_S it is a BuildError naming COMMAND."""
    returncode, usage = run_grouped(argv, tree, timeout_s, **popen)
    if returncode is None:
        raise BuildError(
            f"the workload `{shlex.join(command)}` did not finish in {timeout_s:g} s in {tree}; "
            "its processes were killed"
        )
    return returncode, usage


def children_cpu() -> float:
    """User + system seconds of this process's reaped children so far."""
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def live_children(pid: int) -> list[int]:
    """PID's live child processes, whichever of its threads started them (each thread
    lists only its own: a service's policy server is the child of a connection thread)."""
    return [
        int(kid)
        for t in Path(f"/proc/{pid}/task").glob("*/children")
        for kid in t.read_text().split()
    ]


def tree_cpu_seconds(pid: int, children: bool = True) -> float:
    """User + system seconds of PID and (if CHILDREN) its live children, all their threads:
    what a long-lived service such as `mlgo serve` and its policy server have spent so far."""
    kids = live_children(pid) if children else []
    total = 0
    for p in [pid, *kids]:
        fields = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        total += int(fields[11]) + int(fields[12])  # utime, stime
    return total / os.sysconf("SC_CLK_TCK")


class Run(NamedTuple):
    """One timed run of a workload: seconds of wall time, of CPU (user+sys), of user CPU
    alone (the program's own code: what a compiler changes, without the kernel's I/O), and
    the last loop's stderr."""

    wall: float
    cpu: float
    user: float
    stderr: str


def run_workload(
    workload: Workload, tree: Path, prefix: tuple[str, ...] = (), loops: int = 1
) -> Run:
    """Runs every workload command LOOPS times. CPU is user+sys of the workload's own
    processes (their rusage, reaped with wait4), so other jobs on the machine do not count
    in it, only slow it. Under callgrind (a PREFIX that runs valgrind), each run may take
    CALLGRIND_SLOWDOWN times the workload's timeout."""
    timeout_s = workload.timeout_s * (CALLGRIND_SLOWDOWN if prefix[:1] == ("valgrind",) else 1)
    wall = cpu = user = 0.0
    errors: list[str] = []
    for _ in range(loops):
        errors = []
        for argv in workload.commands:
            with tempfile.TemporaryFile() as err:
                start = time.perf_counter()
                returncode, usage = run_bounded(
                    [*prefix, *argv], tree, timeout_s, argv, stdout=subprocess.DEVNULL, stderr=err
                )
                wall += time.perf_counter() - start
                cpu += usage.ru_utime + usage.ru_stime
                user += usage.ru_utime
                err.seek(0)
                stderr = err.read().decode(errors="replace")
            if returncode != 0:
                raise BuildError(f"{shlex.join(argv)} failed in {tree}: {stderr.strip()[-200:]}")
            errors.append(stderr)
    quiet = {"stdout": subprocess.DEVNULL, "stderr": subprocess.DEVNULL}
    check = ["sh", "-c", workload.check]
    if run_bounded(check, tree, workload.timeout_s, check, **quiet)[0] != 0:
        raise BuildError(f"{workload.recipe}: the workload's result is wrong in {tree}")
    return Run(wall, cpu, user, "".join(errors))


@dataclass(frozen=True)
class Executed:
    instructions: int  # in every process the workload started
    by_object: dict[Path, Counter[int]]  # each instruction's runs, in each of the build's objects


def collected(logs: Path) -> list[int]:
    """The instruction count in each callgrind log under LOGS (`--log-file=LOGS/%p.log`)."""
    return [
        int(c)
        for log in logs.glob("*.log")
        for c in re.findall(r"Collected : (\d+)", log.read_text(errors="replace"))
    ]


def executed(workload: Workload, tree: Path, by_address: bool = False) -> Executed:
    """Instructions the workload executes, counted by callgrind (deterministic), in every
    process it starts: a workload that is a script counts the programs it runs. Each
    process's count goes to a log of its own, not to its stderr, which the workload may
    send away (`prog 2>/dev/null` would otherwise count only the shell). BY_ADDRESS: also
    how often each instruction ran in each program and library of the build TREE
    (`block_costs.executions`)."""
    with tempfile.TemporaryDirectory(prefix="mlgo-callgrind-") as logs:
        out = f"{logs}/%p.out" if by_address else "/dev/null"
        options = CALLGRIND_OPTIONS if by_address else ("--tool=callgrind",)
        callgrind = (
            *("valgrind", *options, "--trace-children=yes"),
            *(f"--callgrind-out-file={out}", f"--log-file={logs}/%p.log"),
        )
        run_workload(workload, tree, callgrind)
        counts = collected(Path(logs))
        ran = executions(Path(logs).glob("*.out"), tree) if by_address else {}
    if len(counts) < len(workload.commands):
        raise BuildError(f"{workload.recipe}: callgrind reported no instruction count")
    return Executed(sum(counts), ran)


def runs_in(workload: Workload, tree: Path, seconds: float) -> int:
    """How many runs of WORKLOAD in TREE take about SECONDS of CPU (at least one): the turns
    of a timed round."""
    return max(1, round(seconds / run_workload(workload, tree).cpu))


def instructions(workload: Workload, tree: Path) -> int:
    return executed(workload, tree).instructions


def spread(xs: list[float]) -> dict:
    """Median, quartiles and range of XS (all three the value itself for one sample)."""
    q1, median, q3 = statistics.quantiles(xs, n=4) if len(xs) > 1 else xs * 3
    return {"median": median, "q1": q1, "q3": q3, "min": min(xs), "max": max(xs), "runs": xs}


def paired_change(ours: list[float], base: list[float]) -> dict:
    """The spread of OURS / BASE - 1, round by round."""
    return spread([a / b - 1 for a, b in zip(ours, base, strict=True)])


def inverted(ratios_pct: list[float]) -> dict:
    """The baseline's change against a variant whose paired changes against it, round by
    round, are RATIOS_PCT, in percent (`in_percent`): each round's inverted, since with an
    even count the median of the inverses is not the inverse of the median."""
    return in_percent(spread([100 / (100 + r) - 1 for r in ratios_pct]))


def in_percent(change: dict) -> dict:
    """A `paired_change` as reports keep it: its median and IQR, in percent."""
    return {
        "change_pct": 100 * change["median"],
        "iqr_pct": [100 * change["q1"], 100 * change["q3"]],
    }


def median_and_range(change: dict) -> str:
    """A `paired_change` as a benchmark prints it: `+1.2% (+0.8%..+2.0%)`, median (min..max)."""
    return f"{change['median']:+.1%} ({change['min']:+.1%}..{change['max']:+.1%})"


def round_order(r: int, variants: Sequence[str]) -> Sequence[str]:
    """The variants in turn R's order: it flips every turn (ABBA), so that a drift of the
    machine's speed hits all of them alike; with more than two, each pair of turns also
    rotates them, so that over 2n turns each variant runs in each place alike (else the
    one in the middle, a policy between a build and its A/A control, would never run
    first or last)."""
    n = len(variants)
    shift = (r // 2) % n if n > 2 else 0
    order = [*variants[shift:], *variants[:shift]]
    return order if r % 2 == 0 else order[::-1]


Times = dict[str, dict[str, list[float]]]  # {clock: {variant: [seconds per round]}}


def timed_rounds(
    rounds: int,
    variants: Sequence[str],
    sample: Callable[[str], tuple[float, ...]],
    after_round: Callable[[int, Times], None] = lambda r, times: None,
    clocks: Sequence[str] = CLOCKS,
    turns: int = 1,
) -> Times:
    """SAMPLE(variant) -> its seconds by each of CLOCKS, of every variant in ROUNDS rounds.
    A round is TURNS turns, each sampling every variant once in ABBA order, and a variant's
    seconds in a round are the sum over its turns: the variants take turns run by run, not
    in blocks, because this machine's speed moves from one second to the next (a block of
    three seconds against the next: an A/A control 7 to 20 points wide; run by run, the
    same seconds: under 2)."""
    times: Times = {c: {v: [] for v in variants} for c in clocks}
    for r in range(rounds):
        summed = {v: [0.0] * len(clocks) for v in variants}
        for t in range(r * turns, (r + 1) * turns):
            for v in round_order(t, variants):
                for i, seconds in enumerate(sample(v)):
                    summed[v][i] += seconds
        for i, clock in enumerate(clocks):
            for v in variants:
                times[clock][v].append(summed[v][i])
        after_round(r, times)
    return times


def first_difference(base: str, other: str, runs: str = "the two builds") -> str:
    """Where two RUNS' workload output first differs, and what to do when that is only
    timings: the builds must print the same for their results to count as right."""
    a, b = base.splitlines(), other.splitlines()
    line = next(
        (i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b))
    )
    a.append("(end of output)")
    b.append("(end of output)")
    return (
        f"{runs} print different results (line {line + 1}: {a[line][:80]!r} against "
        f"{b[line][:80]!r}); a benchmark that prints timings should print them to stderr or "
        "/dev/null, or its result as a checksum"
    )


def workload_output(workload: Workload, tree: Path) -> str:
    """What the workload's first command prints in TREE, less what may differ (timings)."""
    argv = workload.commands[0]
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        returncode, _ = run_bounded(argv, tree, workload.timeout_s, argv, stdout=out, stderr=err)
        out.seek(0)
        err.seek(0)
        stdout, stderr = (f.read().decode(errors="replace") for f in (out, err))
    if returncode != 0:
        raise BuildError(f"{shlex.join(argv)} failed in {tree}: {stderr.strip()[-200:]}")
    return re.sub(workload.volatile, "", stdout)


AGAIN = " again"  # the A/A control's name: the baseline's own build, timed a second time


def compare_workload(
    workload: Workload,
    trees: dict[str, Path],
    repeats: int,
    min_seconds: float = 1.0,
    callgrind: bool = True,
) -> dict:
    """Both builds of a program (TREES: the baseline first; any further ones are timed
    beside them) run WORKLOAD: instruction counts (if CALLGRIND) and REPEATS timed rounds
    (if any) in which the builds take turns run by run, each build's round about
    MIN_SECONDS of CPU, with an A/A control: the baseline is timed twice a round, and the
    change between its two timings (`<clock>_control_paired`) is what this machine's noise
    alone shows. The builds must print the same results."""
    base, other, *_ = trees
    out: dict = {v: {} for v in trees}
    outputs = {}
    for v, tree in trees.items():  # run plainly first: one that never ends is killed sooner
        outputs[v] = workload_output(workload, tree)
        if callgrind:
            out[v]["instructions"] = instructions(workload, tree)
    for v in trees:
        if outputs[v] != outputs[base]:
            raise BuildError(f"{workload.recipe}: {first_difference(outputs[base], outputs[v])}")
    if callgrind:
        out["instructions_delta"] = out[other]["instructions"] / out[base]["instructions"] - 1
    if repeats:
        loops, times = rounds_against_control(workload, trees, repeats, min_seconds)
        out["loops"] = loops
        for clock, series in times.items():
            for v in trees:
                out[v][f"{clock}_seconds"] = spread(series[v])
            out[f"{clock}_delta_paired"] = paired_change(series[other], series[base])
            out[f"{clock}_control_paired"] = paired_change(series[base + AGAIN], series[base])
    return out


def rounds_against_control(
    workload: Workload, trees: dict[str, Path], rounds: int, min_seconds: float
) -> tuple[int, Times]:
    """WORKLOAD timed in ROUNDS rounds of `timed_rounds` on each of TREES (the baseline
    first) and on the baseline again (its A/A control, named with AGAIN), each about
    MIN_SECONDS of CPU a round: the runs a round takes, and the times."""
    base, base_tree = next(iter(trees.items()))
    loops = runs_in(workload, base_tree, min_seconds)
    timed = {**trees, base + AGAIN: base_tree}
    times = timed_rounds(
        rounds, list(timed), lambda v: run_workload(workload, timed[v])[:2], turns=loops
    )
    return loops, times


def recipe_workload(recipe: Recipe) -> Workload:
    """The workload a recipe's bench_prepare, bench and bench_check describe."""
    return Workload(
        recipe.name,
        recipe.bench_prepare,
        tuple(tuple(shlex.split(cmd)) for cmd in recipe.bench),
        recipe.bench_check,
        recipe.bench_volatile,
        recipe.bench_timeout_s,
    )


def prepare_workload(recipe: Recipe, tree: Path, what: str) -> None:
    """The recipe's bench_prepare lines run in TREE, logged beside it."""
    for cmd in recipe.bench_prepare:
        run_logged(cmd, tree, tree.parent / f"{tree.name}.log", recipe.test_timeout_s, None, what)


# exit statuses that say a command never did its work: it could not be executed (126), was
# not found or lacked a shared library (127), or crashed (128 + its signal); SIGPIPE is not
# among them, as 'yes | head' ends that way
DID_NOT_RUN = {126, 127, *(128 + s for s in (4, 6, 7, 8, 11))}


def check_pipeline_ran(argv: tuple[str, ...], tree: Path, timeout_s: float) -> None:
    """Every command of ARGV's last pipeline ran to an exit of its own, in TREE: the shell
    reports only a pipeline's last status, so 'prog | md5sum' with a PROG that cannot load
    its shared library would print the checksum of nothing, the same on both builds, and
    be measured as a workload. ARGV is a command, or a shell line as 'sh -c LINE'; it is
    killed past TIMEOUT_S."""
    line = argv[2] if len(argv) == 3 and argv[:2] == ("sh", "-c") else shlex.join(argv)
    with tempfile.TemporaryFile() as statuses:
        fd = statuses.fileno()
        run_bounded(
            ["bash", "-c", f'{line}\necho "${{PIPESTATUS[*]}}" >&{fd}'],
            tree,
            timeout_s,
            argv,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            pass_fds=(fd,),
        )
        statuses.seek(0)
        ended = statuses.read().decode().split()
    if bad := [int(s) for s in ended if s.isdigit() and int(s) in DID_NOT_RUN]:
        why = {126: "not executable", 127: "not found, or a shared library it needs is"}
        reason = why.get(bad[0], f"killed by signal {bad[0] - 128}")
        raise BuildError(
            f"a command of '{line}' exited {bad[0]} ({reason}) in {tree}, though the line's "
            "own status hid it: measured, it would count nothing; run it there by hand"
        )


def check_repeatable(recipe: Recipe, tree: Path) -> None:
    """The recipe's workload, in one build TREE, runs every command of its pipelines and
    prints the same twice: else the two builds' outputs could never agree, and only timings
    can differ."""
    prepare_workload(recipe, tree, f"{recipe.name}: bench")
    bench = recipe_workload(recipe)
    for argv in bench.commands:
        try:
            check_pipeline_ran(argv, tree, bench.timeout_s)
        except BuildError as e:
            raise BuildError(f"{recipe.name}: --bench: {e}") from None
    first, second = (workload_output(bench, tree) for _ in range(2))
    if first != second:
        runs = "two runs of the same build"
        raise BuildError(f"{recipe.name}: --bench: {first_difference(first, second, runs)}")


# How far two instruction counts of one build's workload may differ: lua seeds its string
# hashes with addresses and time, and its counts differ by up to 0.1%.
FIXED_WORK = 0.01


def check_fixed_work(recipe: Recipe, tree: Path) -> None:
    """The recipe's workload does the same work on every run in TREE, as callgrind counts
    it twice: a benchmark that runs for a fixed time (yajl's perftest parses for three
    seconds) does more work on a faster build, so its CPU time cannot change and its
    count, run slower under callgrind, means nothing."""
    bench = recipe_workload(recipe)
    first, second = (instructions(bench, tree) for _ in range(2))
    if abs(second / first - 1) > FIXED_WORK:
        raise BuildError(
            f"{recipe.name}: --bench: two runs of the same build executed {first:,} and "
            f"{second:,} instructions ({second / first - 1:+.1%}); a workload must do the "
            "same work each run, not run for a fixed time or on random input"
        )


def recipe_throughput(
    recipe: Recipe, trees: dict[str, Path], rounds: int, seconds: float = 1.0
) -> dict:
    """The recipe's workload on both build trees (the baseline first), ROUNDS paired rounds
    of about SECONDS of CPU each: the change of its CPU time (median and IQR, in percent;
    positive is slower), the A/A control's beside it, and, where valgrind is installed, the
    change of callgrind's instruction count. A further tree (a PGO build) is timed in the
    same rounds, its change against the baseline under its name (`beside`)."""
    bench = recipe_workload(recipe)
    for name, tree in trees.items():
        prepare_workload(recipe, tree, f"{recipe.name} ({name}): bench")
    callgrind = shutil.which("valgrind") is not None
    m = compare_workload(bench, trees, rounds, seconds, callgrind)
    cpu, control = m["cpu_delta_paired"], m["cpu_control_paired"]
    result = {
        **in_percent(cpu),
        "ratios_pct": [100 * r for r in cpu["runs"]],  # one per paired round
        # the baseline against itself in the same rounds: the change noise alone makes
        **{f"control_{k}": v for k, v in in_percent(control).items()},
        "measure": "CPU seconds of the workload, policy / baseline - 1 (positive: slower)",
        "workload": list(recipe.bench),
        "rounds": rounds,
        "loops": m["loops"],
    }
    if callgrind:
        base, ours, *_ = (m[v]["instructions"] for v in trees)
        result["instructions"] = {"baseline": base, "policy": ours}
        result["instructions_change_pct"] = 100 * m["instructions_delta"]
    for name in list(trees)[2:]:
        result[name] = beside(m, name, next(iter(trees)))
    return result


def beside(measured: dict, name: str, base: str) -> dict:
    """The change of variant NAME against BASE, timed in the same rounds of a
    `compare_workload` (MEASURED), in percent: CPU time and instructions where counted."""
    runs = [measured[v]["cpu_seconds"]["runs"] for v in (name, base)]
    cpu = paired_change(*runs)
    change = {**in_percent(cpu), "ratios_pct": [100 * r for r in cpu["runs"]]}
    if "instructions" in measured[name]:
        counts = [measured[v]["instructions"] for v in (name, base)]
        change["instructions_change_pct"] = 100 * (counts[0] / counts[1] - 1)
    return change
