"""`mlgo demo`'s loop on one recipe, after its corpus and traces are recorded: train briefly
from the shipped policy, keep whichever of the two is smaller on the corpus, build the
program twice (plain clang, and `mlgo-cc` with that policy), run its tests and its workload
on both, and report size and throughput side by side (report.json and a table)."""

from __future__ import annotations

import json
import shlex
import shutil
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from mlgo.corpus.extract import BuildError, Recipe, run_logged
from mlgo.corpus.format import load_corpus
from mlgo.llvm.sizes import compare_trees, tree_totals
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import get_problem
from mlgo.programs.compare import compare_programs
from mlgo.programs.measure import Workload, compare_workload
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.workers import make_workers

PROBLEM = "inlining-size"
ON_TRAINING_CODE = "measured on the modules it trained on, not on held-out code"


@dataclass(frozen=True)
class DemoOptions:
    train_steps: int = 10  # ES steps from the shipped policy; 0: the shipped policy as is
    bench_rounds: int = 10  # paired ABBA rounds of the workload
    bench_seconds: float = 1.0  # CPU seconds per timed sample (the workload loops to it)


def choose_policy(
    corpus_dir: Path, shipped: Path, out: Path, tc: Toolchain, steps: int
) -> tuple[Path, dict]:
    """Trains ES for STEPS steps from SHIPPED into OUT/train and evaluates both on the
    corpus; returns the one with the smaller total .text (the shipped one on a tie) and the
    per-policy change against -Oz."""
    from mlgo.problems.policy import MLPPolicy
    from mlgo.train import policy_dir
    from mlgo.train.evaluate import evaluate
    from mlgo.train.run import TrainOptions, run

    problem = get_problem(PROBLEM)
    corpus = load_corpus(corpus_dir).require_opt_level(problem.opt_level)
    with closing(make_workers("local")) as pool:
        start = MLPPolicy.load(policy_dir(shipped))
        deltas = {shipped: evaluate(start, corpus, tc, pool, problem).totals()["delta"]}
        if steps:
            opts = TrainOptions(steps=steps, init=shipped)
            trained = run("es", corpus, problem, out / "train", tc, pool, opts)
            deltas[out / "train" / "policy"] = trained.evaluation.totals()["delta"]
    chosen = min(deltas, key=lambda p: deltas[p])
    training = {
        "steps": steps,
        "chosen": "trained" if chosen != shipped else "shipped",
        "corpus_change_pct": {
            ("shipped" if p == shipped else "trained"): 100 * d for p, d in deltas.items()
        },
        "note": ON_TRAINING_CODE,
    }
    return chosen, training


def workload(recipe: Recipe) -> Workload:
    return Workload(
        recipe.name,
        recipe.bench_prepare,
        tuple(tuple(shlex.split(cmd)) for cmd in recipe.bench),
        recipe.bench_check,
    )


def measure_throughput(recipe: Recipe, trees: dict[str, Path], opts: DemoOptions) -> dict:
    """The recipe's workload on both trees (the baseline first): the paired change of its
    CPU time (median and IQR, in percent; positive is slower) and, where valgrind is
    installed, of callgrind's instruction count."""
    bench = workload(recipe)
    for name, tree in trees.items():
        for cmd in bench.prepare:
            log = tree.parent / f"{tree.name}.log"
            run_logged(
                cmd, tree, log, recipe.test_timeout_s, None, f"{recipe.name} ({name}): bench"
            )
    callgrind = shutil.which("valgrind") is not None
    m = compare_workload(bench, trees, opts.bench_rounds, opts.bench_seconds, callgrind)
    cpu = m["cpu_delta_paired"]
    result = {
        "change_pct": 100 * cpu["median"],
        "iqr_pct": [100 * cpu["q1"], 100 * cpu["q3"]],
        "measure": "CPU seconds of the workload, policy / baseline - 1 (positive: slower)",
        "workload": list(recipe.bench),
        "rounds": opts.bench_rounds,
        "loops": m["loops"],
    }
    if callgrind:
        result["instructions_change_pct"] = 100 * m["instructions_delta"]
    return result


def size_report(pair, trees: dict[str, Path]) -> dict:
    """.text of every ELF file both builds produced (objects, libraries, programs), and of
    the recipe's linked programs alone."""
    plain, ml = pair
    rows = compare_trees(trees["mlgo"], trees["plain"])
    total = tree_totals(rows)
    programs = {
        p: {"baseline": b, "policy": ml.text[p], "change_pct": 100 * (ml.text[p] / b - 1)}
        for p, b in plain.text.items()
    }
    return {
        "baseline": total["baseline"],
        "policy": total["build"],
        "change_pct": total["delta_pct"],
        "counts": f"the .text of all {len(rows)} ELF files the build produced",
        "files": len(rows),
        "programs": programs,
    }


def run_demo(
    recipe: Recipe,
    corpus_dir: Path,
    shipped: Path,
    out: Path,
    tc: Toolchain,
    opts: DemoOptions,
    say: Callable[[str], None] = print,
) -> dict:
    """The loop after collection (see the module doc); writes and returns OUT/report.json.
    A failing build or test stops with its log."""
    from mlgo.ship.release import release

    say(f"training from {shipped} ({opts.train_steps} ES steps)")
    chosen, training = choose_policy(corpus_dir, shipped, out, tc, opts.train_steps)
    policy = release(chosen, out / "policy", aot=False).saved_model.parent
    say(f"building {recipe.name} twice (clang -Oz, and mlgo-cc with {policy}), with its tests")
    built = compare_programs([recipe], [policy], out / "programs", tc)
    if built.failed:
        raise BuildError(built.failed[recipe.name])
    pair = built.pairs[0]
    trees = {v: out / "programs" / recipe.name / v for v in ("plain", "mlgo")}
    report = {
        "package": recipe.name,
        "policy": str(policy),
        "training": training,
        "size": size_report(pair, trees),
        "tests": {"baseline": pair[0].tests, "policy": pair[1].tests},
    }
    if recipe.bench:
        say(f"measuring {recipe.name}'s workload on both builds ({opts.bench_rounds} rounds)")
        report["throughput"] = measure_throughput(recipe, trees, opts)
    atomic_write_text(out / "report.json", json.dumps(report, indent=1))
    return report


def slower_but_smaller(report: dict) -> bool:
    """A smaller program that runs measurably slower: its whole IQR above 0."""
    speed = report.get("throughput")
    return bool(speed) and report["size"]["change_pct"] < 0 and speed["iqr_pct"][0] > 0


def training_line(training: dict) -> str:
    """What training did, in one line, with the caveat that it is the training code."""
    changes = ", ".join(f"{k} {v:+.2f}%" for k, v in training["corpus_change_pct"].items())
    return f"corpus .text against -Oz: {changes}; kept {training['chosen']} ({training['note']})"


def report_table(report: dict) -> Table:
    """Size and throughput, baseline against policy, as the terminal shows them."""
    size = report["size"]
    title = f"{report['package']}: .text bytes, workload CPU time, tests"
    table = Table("", "clang -Oz", "mlgo-cc", "change", title=title)
    for prog, r in size["programs"].items():
        table.add_row(
            f"{prog} .text", f"{r['baseline']:,}", f"{r['policy']:,}", f"{r['change_pct']:+.2f}%"
        )
    table.add_row(
        f"{size['files']} ELF files",
        f"{size['baseline']:,}",
        f"{size['policy']:,}",
        f"{size['change_pct']:+.2f}%",
        style="bold",
    )
    if speed := report.get("throughput"):
        q1, q3 = speed["iqr_pct"]
        flag = " [red]smaller but slower" if slower_but_smaller(report) else ""
        change = f"{speed['change_pct']:+.2f}% (IQR {q1:+.2f}..{q3:+.2f}%){flag}"
        table.add_row("CPU time", "", "", change)
        if "instructions_change_pct" in speed:
            table.add_row("instructions", "", "", f"{speed['instructions_change_pct']:+.2f}%")
    tests = report["tests"]
    table.add_row("tests", tests["baseline"], tests["policy"], "")
    return table
