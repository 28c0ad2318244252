"""Issue 38's shipped link-time policy: trained on the train split's full-LTO links, chosen
on validation, evaluated once on test, every size as lld's LTO links each program.

  .venv/bin/mlgo corpus build --lto full PACKAGE... --out data/lto/train --work data/lto/build
  .venv/bin/mlgo corpus build --lto full --split validation --out data/lto/validation \
      --work data/lto/build
  .venv/bin/mlgo corpus build --lto full --split test --out data/lto/test --work data/lto/build
  .venv/bin/python -m tools.ship_link_policy --corpora data/lto --out data/lto/ship --minutes 30

BC-Max trains from the shipped per-file policy on CORPORA/train for --minutes (a rerun
resumes it, at the budget spent). The
candidates: that start, the trained policy, and the trained policy gated at each of
GATES. Each is judged on CORPORA/validation by `linked_evaluation` (lld's LTO of each
program's merged module with the candidate's plugin: the real link's `.text`, byte for
byte). The one kept has the smallest total with no validation package larger; if none
qualifies, nothing ships. It alone is then evaluated once on CORPORA/test, per package,
C and C++ apart (corpus/splits.toml). Writes OUT/chosen (the policy) and OUT/ship.json.

With --guard, every candidate is judged as served with MLGO_GUARD=size at the link: each
program the policy makes larger is lld's own (`Evaluation.guarded`), so the choice
is the smallest guarded total; test is reported guarded and, from the same links, as the
policy alone. Writes OUT/chosen-guard (its policy.json asks for the guard, so that it is
served guarded) and OUT/ship-guard.json.

A rerun takes the judgments OUT/ship*.json holds instead of linking every candidate again.
With --release DIR, the chosen policy is also written to DIR as it ships: its files, a TF
SavedModel and a model card drawn from these judgments (DIR = policies/inlining-size-link).
"""

from __future__ import annotations

import argparse
import json
from contextlib import closing
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.corpus.format import Corpus, load_corpus
from mlgo.corpus.lto import linked_texts
from mlgo.corpus.splits import load_splits
from mlgo.data import shipped_policy
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems import get_problem
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import save_policy
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.workers import make_workers
from mlgo.ship.plugin import inliner_plugin
from mlgo.ship.release import release
from mlgo.train.evaluate import Evaluation, linked_evaluation
from mlgo.train.run import UNTIL_BUDGET, TrainOptions, load_start, run

console = Console()
PROBLEM = "inlining-size-link"
# A merged module is a whole program: many compile for seconds, and each is searched.
MAX_MODULE_SECONDS = 60.0
# Departure thresholds tried: tune's, and higher ones, which depart less (on validation the
# first run's candidates grew fewer packages the higher the gate).
GATES = (0.6, 0.8, 0.95, 0.98, 0.99, 0.995, 0.999)


def judged(ev: Evaluation) -> dict:
    """An evaluation's total change, its packages made larger, and each language's total."""
    language = {p.name: p.language for s in load_splits().values() for p in s}
    m = ev.metric
    by_language: dict[str, list[float]] = {}
    for pkg, r in ev.per_package().items():
        sums = by_language.setdefault(language.get(pkg, "?"), [0.0, 0.0])
        sums[0] += r[m]
        sums[1] += r[f"default_{m}"]
    return {
        "change_pct": 100 * ev.totals()["delta"],
        "packages_larger": ev.packages_larger(),
        "packages_over_0.1pct": [p for p, r in ev.per_package().items() if r["delta"] > 0.001],
        "packages": {p: 100 * r["delta"] for p, r in sorted(ev.per_package().items())},
        "by_language_pct": {x: 100 * (a / b - 1) for x, (a, b) in sorted(by_language.items())},
    }


def _rows(judgment: dict) -> list[str]:
    """A judgment's total, each language's, and each package's, as model-card table rows."""
    rows = [f"| all | {judgment['change_pct']:+.3f}% |"]
    rows += [f"| all {x} | {v:+.3f}% |" for x, v in judgment["by_language_pct"].items()]
    return rows + [f"| {p} | {v:+.3f}% |" for p, v in judgment["packages"].items()]


def model_card(policy: MLPPolicy, result: dict, minutes: float, trained_on: list[str]) -> str:
    """The shipped link-time policy's card: what it is, why it was chosen (every candidate's
    validation, guarded as it is served), its one test evaluation, and how to rebuild it."""
    guarded = policy.guard == "size"
    lines = [
        f"# {policy.problem.name} policy",
        "",
        f"Decides {policy.problem.summary}.",
        "",
        policy.describe(),
        "",
        "## How it was chosen",
        "",
        f"BC-Max trained {result['training']['seconds'] / 60:.0f} minutes from the per-file "
        "policy on the train split's full-LTO links (train change "
        f"{result['train_change_pct']:+.3f}%). Every candidate below was judged on the "
        "validation split as lld's LTO links each program"
        + (", served guarded" if guarded else "")
        + "; the smallest total with no package larger ships. Sizes are the `.text` "
        "sections of the linked programs and libraries against plain `-Oz -flto`.",
        "",
        "| candidate | validation | packages larger |",
        "|---|---|---|",
    ]
    for name, v in result["validation"].items():
        kept = " (kept)" if name == result["chosen"] else ""
        larger = ", ".join(v["packages_larger"]) or "-"
        lines.append(f"| {name}{kept} | {v['change_pct']:+.3f}% | {larger} |")
    lines += ["", "## Test split, evaluated once", "", "| package | change |", "|---|---|"]
    lines += _rows(result["test"])
    alone = result.get("test, the policy alone")
    if alone:
        larger = ", ".join(alone["packages_larger"]) or "none"
        lines += [
            "",
            f"The same links without the guard: {alone['change_pct']:+.3f}%, larger: {larger}. "
            "So it ships guarded: each program or library it links is linked a second time "
            "with lld's own inliner and the one with less `.text` kept, which doubles the "
            "link's time.",
        ]
    lines += [
        "",
        "## Reproduce",
        "",
        "```sh",
        f"mlgo corpus build --lto full {' '.join(trained_on)} --out data/lto/train "
        "--work data/lto/build",
        "mlgo corpus build --lto full --split validation --out data/lto/validation "
        "--work data/lto/build",
        "mlgo corpus build --lto full --split test --out data/lto/test --work data/lto/build",
        f"python -m tools.ship_link_policy --corpora data/lto --out data/lto/ship "
        f"--minutes {minutes:g}{' --guard' if guarded else ''} "
        f"--release policies/{policy.problem.name}",
        "```",
        "",
    ]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", type=Path, default=Path("data/lto"))
    parser.add_argument("--out", type=Path, default=Path("data/lto/ship"))
    parser.add_argument("--minutes", type=float, default=30.0, help="training budget")
    parser.add_argument("--guard", action="store_true", help="judge as MLGO_GUARD=size serves")
    parser.add_argument("--release", type=Path, help="write the chosen policy here as it ships")
    args = parser.parse_args()
    serve = Evaluation.guarded if args.guard else (lambda ev: ev)
    suffix = "-guard" if args.guard else ""
    problem, tc = get_problem(PROBLEM), find_toolchain()

    def corpus(split: str) -> Corpus:  # each read when its turn comes: a rerun resumes
        return load_corpus(args.corpora / split).require(problem)

    start_dir = shipped_policy(problem.starts_from or PROBLEM)
    start = load_start(start_dir, problem)
    opts = TrainOptions(
        steps=UNTIL_BUDGET,
        init=start_dir,
        max_seconds=60 * args.minutes,
        trainer={"max_module_seconds": MAX_MODULE_SECONDS},
    )
    with closing(make_workers("local")) as pool:
        trained = run(
            "bcmax", corpus("train"), problem, args.out / "train", tc, pool, opts, start=start
        )
    candidates = {"shipped per-file policy": start, "trained": trained.policy}
    candidates |= {
        f"trained, gated at {t:g}": replace(trained.policy, departure_threshold=t)
        for t in GATES
        if trained.policy.can_gate
    }
    record = args.out / f"ship{suffix}.json"
    before = json.loads(record.read_text()) if record.exists() else {}
    validation = before.get("validation", {})
    if set(validation) != set(candidates):
        held_out = corpus("validation")
        plain = linked_texts(tc, held_out)
        validation = {
            name: judged(
                serve(linked_evaluation(problem, inliner_plugin(p, tc), held_out, tc, plain))
            )
            for name, p in candidates.items()
        }
    safe = {n: v["change_pct"] for n, v in validation.items() if not v["packages_larger"]}
    chosen = min(safe, key=lambda n: safe[n], default=None)
    if chosen is not None and safe[chosen] >= 0:
        chosen = None  # no smaller on validation: clang's own decisions stay
    result: dict = {
        "training": {"seconds": trained.state.seconds if trained.state else None},
        "train_change_pct": 100 * trained.evaluation.totals()["delta"],
        "validation": validation,
        "chosen": chosen,
    }
    if chosen is not None:
        # judged as the guard serves it, it is served guarded whatever MLGO_GUARD says
        kept = replace(candidates[chosen], guard="size") if args.guard else candidates[chosen]
        chosen_dir = args.out / f"chosen{suffix}"
        save_policy(kept, chosen_dir)
        if before.get("chosen") == chosen and "test" in before:  # test is evaluated once
            result |= {k: v for k, v in before.items() if k.startswith("test")}
        else:
            plugin = inliner_plugin(candidates[chosen], tc)
            test = linked_evaluation(problem, plugin, corpus("test"), tc)
            result["test"] = judged(serve(test))
            if args.guard:
                result["test, the policy alone"] = judged(test)
        if args.release:
            card = model_card(kept, result, args.minutes, sorted(corpus("train").packages()))
            release(kept, args.release, card, aot=False)
    atomic_write_text(record, json.dumps(result, indent=1))
    title = "linked by lld's LTO" + (", guarded" if args.guard else "")
    table = Table("candidate", "validation", "packages larger", title=title)
    for name, v in validation.items():
        larger = ", ".join(v["packages_larger"]) or "-"
        table.add_row(
            name + (" (kept)" if name == chosen else ""), f"{v['change_pct']:+.3f}%", larger
        )
    console.print(table)
    if "test" in result:
        t = result["test"]
        langs = ", ".join(f"{x} {v:+.3f}%" for x, v in t["by_language_pct"].items())
        larger = ", ".join(t["packages_larger"]) or "none"
        over = ", ".join(t["packages_over_0.1pct"]) or "none"
        console.print(f"test: {t['change_pct']:+.3f}% ({langs}); larger: {larger}; >0.1%: {over}")
    console.print(f"wrote {record}")


if __name__ == "__main__":
    main()
