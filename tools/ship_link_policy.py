"""Issue 38's shipped link-time policy, each size as lld's LTO links each program. BC-Max
trains from the shipped per-file policy on CORPORA/train for --minutes (a rerun resumes it);
that start, the trained policy and it at each of LINK_GATES are the candidates of
`chain.linked_choice`: chosen on validation, tested once (--guard: judged as MLGO_GUARD=size
serves them). Writes OUT/chosen (--guard: OUT/chosen-guard, which asks for the guard) and
OUT/ship.json (OUT/ship-guard.json), whose judgements a rerun takes. --release DIR: it as it
ships, with its model card (`modelcard.chosen_card`), into DIR. The commands: REPRODUCE.
"""

from __future__ import annotations

import argparse
import json
from contextlib import closing
from dataclasses import replace
from pathlib import Path

import rich

from mlgo.corpus.format import Corpus, load_corpus
from mlgo.data import shipped_policy
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems import get_problem
from mlgo.problems.policy_files import save_policy
from mlgo.programs.chain import choice_table, linked_choice, outcome_line
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.workers import make_workers
from mlgo.ship.modelcard import chosen_card
from mlgo.ship.release import release
from mlgo.train.candidates import GATES, gated
from mlgo.train.run import UNTIL_BUDGET, TrainOptions, load_start, run

PROBLEM = "inlining-size-link"
TRAINER = {"max_module_seconds": 60.0}  # a merged module is a program: many take seconds
# tune's and higher ones: on validation, the higher the gate, the fewer packages grew
LINK_GATES = (*GATES, 0.98, 0.99, 0.995, 0.999)
HOW = (
    "BC-Max trained {spent:.0f} minutes from the per-file policy on the train split's "
    "full-LTO links (train change {train:+.3f}%). Every candidate below was judged on the "
    "validation split as lld's LTO links each program{guarded}; the smallest total with no "
    "package larger ships. Sizes are the `.text` sections of the linked programs and "
    "libraries against plain `-Oz -flto`."
)
BUILD = "mlgo corpus build --lto full {} --work data/lto/build"
REPRODUCE = (
    BUILD.format("{packages} --out data/lto/train"),
    BUILD.format("--split validation --out data/lto/validation"),
    BUILD.format("--split test --out data/lto/test"),
    "python -m tools.ship_link_policy --corpora data/lto --out data/lto/ship "
    "--minutes {minutes:g}{guard} --release policies/{problem}",
)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--corpora", type=Path, default=Path("data/lto"))
    parser.add_argument("--out", type=Path, default=Path("data/lto/ship"))
    parser.add_argument("--minutes", type=float, default=30.0, help="training budget")
    parser.add_argument("--guard", action="store_true", help="judge as MLGO_GUARD=size serves")
    parser.add_argument("--release", type=Path, help="write the chosen policy here as it ships")
    args = parser.parse_args()
    suffix, guard = ("-guard", " --guard") if args.guard else ("", "")
    problem, tc = get_problem(PROBLEM), find_toolchain()

    def corpus(split: str) -> Corpus:  # each read when its turn comes: a rerun resumes
        return load_corpus(args.corpora / split).require(problem)

    start_dir = shipped_policy(problem.starts_from or PROBLEM)
    start, budget = load_start(start_dir, problem), 60 * args.minutes
    opts = TrainOptions(steps=UNTIL_BUDGET, init=start_dir, max_seconds=budget, trainer=TRAINER)
    with closing(make_workers("local")) as pool:
        trained = run("bcmax", corpus("train"), problem, args.out / "train", tc, pool, opts,
                      start=start)  # fmt: skip
    candidates = {"shipped per-file policy": start}
    candidates |= {"trained": trained.policy, **gated(trained.policy, LINK_GATES)}
    record, chosen_dir = args.out / f"ship{suffix}.json", args.out / f"chosen{suffix}"
    seconds, train = trained.state.seconds, 100 * trained.evaluation.totals()["delta"]
    result = {"training": {"seconds": seconds}, "train_change_pct": train}
    held_out = (lambda: corpus("validation"), lambda: corpus("test"))
    result |= linked_choice(candidates, *held_out, tc, record, args.guard)
    if (chosen := result["chosen"]) is not None:
        # judged as the guard serves it, it is served guarded whatever MLGO_GUARD says
        kept = replace(candidates[chosen], guard="size") if args.guard else candidates[chosen]
        save_policy(kept, chosen_dir)
        if args.release:
            packages = " ".join(sorted(corpus("train").packages()))
            fields = {"packages": packages, "minutes": args.minutes, "guard": guard}
            how = {"spent": seconds / 60, "train": train, "guarded": guard and ", served guarded"}
            card = chosen_card(kept, result, HOW, REPRODUCE, problem=PROBLEM, **fields, **how)
            release(kept, args.release, card, aot=False)
    atomic_write_text(record, json.dumps(result, indent=1))
    title = "linked by lld's LTO" + (", guarded" if args.guard else "")
    for shown in (choice_table(result, title), outcome_line(result), f"wrote {record}"):
        if shown:
            rich.print(shown)


if __name__ == "__main__":
    main()
