"""`mlgo demo`'s loop on one recipe, after its corpus and traces are recorded: train briefly
from the shipped policy, keep whichever of the two is smaller on the corpus, build the
program twice (plain clang, and `mlgo-cc` with that policy), run its tests and its workload
on both, and report size and throughput side by side (report.json, report.html with plots
and a table)."""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import closing
from dataclasses import dataclass
from pathlib import Path

from mlgo.corpus.extract import BuildError, Recipe
from mlgo.corpus.format import load_corpus
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import get_problem
from mlgo.programs.compare import compare_programs
from mlgo.programs.report import write_report
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
    curve: list[dict] = []
    with closing(make_workers("local")) as pool:
        start = MLPPolicy.load(policy_dir(shipped))
        deltas = {shipped: evaluate(start, corpus, tc, pool, problem).totals()["delta"]}
        if steps:
            opts = TrainOptions(steps=steps, init=shipped)
            trained = run("es", corpus, problem, out / "train", tc, pool, opts)
            deltas[out / "train" / "policy"] = trained.evaluation.totals()["delta"]
            curve = json.loads((out / "train" / "state.json").read_text())["history"]
    chosen = min(deltas, key=lambda p: deltas[p])
    training = {
        "steps": steps,
        "chosen": "trained" if chosen != shipped else "shipped",
        "corpus_change_pct": {
            ("shipped" if p == shipped else "trained"): 100 * d for p, d in deltas.items()
        },
        "note": ON_TRAINING_CODE,
        "curve": curve,  # the trainer's history: step, compiles and its rewards
    }
    return chosen, training


def run_demo(
    recipe: Recipe,
    corpus_dir: Path,
    shipped: Path,
    out: Path,
    tc: Toolchain,
    opts: DemoOptions,
    say: Callable[[str], None] = print,
) -> dict:
    """The loop after collection (see the module doc); writes OUT/report.json and
    report.html, and returns the report. A failing build or test stops with its log."""
    from mlgo.ship.release import release

    say(f"training from {shipped} ({opts.train_steps} ES steps)")
    chosen, training = choose_policy(corpus_dir, shipped, out, tc, opts.train_steps)
    policy = release(chosen, out / "policy", aot=False).saved_model.parent
    say(f"building {recipe.name} twice (clang -Oz, and mlgo-cc with {policy}), with its tests")
    if recipe.bench:
        say(f"then measuring its workload on both ({opts.bench_rounds} paired rounds)")
    built = compare_programs(
        [recipe],
        [policy],
        out / "programs",
        tc,
        bench_rounds=opts.bench_rounds,
        bench_seconds=opts.bench_seconds,
    )
    if built.failed:
        raise BuildError(built.failed[recipe.name])
    report = dict(built.reports[recipe.name], training=training)
    write_report(report, out)
    return report
