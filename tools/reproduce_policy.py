"""Runs a shipped policy's recipe (policies/NAME/recipe.toml, `tools.lab.recipe`): its
stages in turn into --out (the recipe's own unless given), each timed in OUT/recipe.json,
so that a rerun resumes; --release writes what it made as it ships, with its card, into the
recipe's release directory (or the one given).

  .venv/bin/python -m tools.reproduce_policy policies/inlining-size-guarded
  .venv/bin/python -m tools.reproduce_policy policies/inlining-size-link --minutes train=30
Per-stage changes: --minutes STAGE=M, --packages STAGE=c|all|NAME,NAME (empty: not run),
--guard STAGE=size|none, --corpus NAME=DIR, and --minutes-scale F for every training;
--card only rewrites the policy's MODEL_CARD.md "Reproduce" section from the recipe.
"""

from __future__ import annotations

import argparse
import json
import math
import signal
import sys
from collections.abc import Callable
from contextlib import closing
from pathlib import Path

import rich

from mlgo.errors import USER_ERRORS
from mlgo.llvm.toolchain import find_toolchain
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.workers import make_workers
from mlgo.train.modelcard import with_reproduce
from tools.lab.recipe import load_policy_recipe, overridden
from tools.lab.reproduce import choice_table, outcome_line, release_made, run_recipe, timed_stages


def pairs(convert: Callable[[str], object]) -> Callable[[str], tuple[str, object]]:
    """An option's NAME=VALUE, VALUE converted."""

    def parse(given: str) -> tuple[str, object]:
        name, sep, value = given.partition("=")
        if not sep or not name:
            raise argparse.ArgumentTypeError(f"{given!r}: give NAME=VALUE")
        return name, convert(value)

    return parse


def minutes(value: str) -> float:
    number = float(value)
    if not (math.isfinite(number) and 0 <= number <= 1e9):
        raise argparse.ArgumentTypeError(f"{value}: minutes are a number from 0")
    return number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("policy", type=Path, help="a policy's directory, holding recipe.toml")
    parser.add_argument("--out", type=Path, help="where the stages run (the recipe's own)")
    parser.add_argument("--minutes", type=pairs(minutes), action="append", default=[])
    parser.add_argument("--minutes-scale", type=minutes, default=1.0)
    parser.add_argument("--packages", type=pairs(str), action="append", default=[])
    parser.add_argument("--guard", type=pairs(str), action="append", default=[])
    parser.add_argument("--corpus", type=pairs(Path), action="append", default=[])
    parser.add_argument("--release", type=Path, nargs="?", const=True, help="release it")
    parser.add_argument("--card", action="store_true", help="only the card's Reproduce")
    args = parser.parse_args()
    changes = ("minutes", "packages", "guard", "corpus")
    flags = [
        w
        for o in changes
        for n, v in vars(args)[o]
        for w in (f"--{o}", f"{n}={v:g}" if isinstance(v, float) else f"{n}={v}")
    ]
    if args.minutes_scale != 1.0:
        flags += ["--minutes-scale", f"{args.minutes_scale:g}"]
    try:
        recipe = overridden(
            load_policy_recipe(args.policy),
            dict(args.minutes),
            args.minutes_scale,
            dict(args.packages),
            dict(args.corpus),
            dict(args.guard),
        )
        reproduce = recipe.reproduce_lines(flags)
        if args.card:
            card = args.policy / "MODEL_CARD.md"
            atomic_write_text(card, with_reproduce(card.read_text(), reproduce))
            print(f"wrote {card}")
            return
        out = args.out or recipe.out
        stages = timed_stages(recipe, out)
        # A stopped stage (a killed job, Ctrl-C) has its seconds counted before it ends.
        signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
        with closing(make_workers("local")) as pool:
            choice = run_recipe(recipe, stages, out, find_toolchain(), pool)
        if args.release:
            to = recipe.release if args.release is True else args.release
            if (released := release_made(recipe, out, to, reproduce, choice)) is not None:
                print(f"released {released}", file=sys.stderr)
    except USER_ERRORS as e:  # a package not in the corpus, a corpus not built, ...
        parser.exit(2, f"error: {e}\n")
    if choice is not None:
        title = "linked by lld's LTO" + (", guarded" if recipe.stages[-1].guard else "")
        for shown in (choice_table(choice, title), outcome_line(choice)):
            if shown:
                rich.print(shown, file=sys.stderr)
    print(json.dumps(stages.summary(), indent=1))


if __name__ == "__main__":
    main()
