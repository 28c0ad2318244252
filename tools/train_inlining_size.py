"""Issue 40's training from scratch in one command, each stage timed: the per-file
inlining-size policy that ships guarded, trained on the train split, its gate chosen on
validation.

  .venv/bin/python -m tools.train_inlining_size --train data/corpus-train \
      --validation data/corpus-validation --out data/issue40/scratch

Its defaults are the recipe that did best on validation of those measured
(docs/inlining-size.md, "BC-Max given the time"): ES on FIRST_ES_PACKAGES for 30 minutes,
no mixed stage, BC-Max for 85.

1. BC: a clone of clang's own `-Oz` decisions on every training module.
2. ES from that clone on C packages of the train split alone (`--es-packages`: names,
   `c` for all of the split's C packages, or `all`), with no penalty for a package that
   grows: it learns where departing shrinks code. BC-Max started from a BC clone departs
   little on code it has not seen; started from such an ES policy, it departs well
   (docs/inlining-size.md, "BC-Max from a BC start").
3. With `--mix-packages`, ES again from that policy on those packages beside stage 2's,
   each package's loss counted twice (`--regression-penalty 1.0`): the second stage of
   the chain the shipped policy started from, which kept C++ from growing.
4. BC-Max from the last ES policy on the whole train split, rewarded by `text_once`.
5. Its departure threshold calibrated on validation as the size guard serves it.

Writes OUT/recipe.json: each stage's wall seconds, their total, the stages finished, and
the calibrated policy's guarded change of the validation split; the policy is OUT/policy.
No training stage is evaluated on the training corpus (`mlgo train` would): only the
calibration's judgement on validation is read, and the time goes to training. A finished
stage is not run again; one that was stopped resumes, as `mlgo train` does, and its
seconds are added up over the invocations that ran it (a stop by SIGTERM or Ctrl-C counts
its seconds; SIGKILL's are lost).
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from contextlib import closing
from pathlib import Path

from mlgo.corpus.format import Corpus, load_corpus
from mlgo.errors import MlgoError
from mlgo.llvm.toolchain import Toolchain, find_toolchain
from mlgo.problems import get_problem
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.workers import Workers, make_workers
from mlgo.train import policy_dir
from mlgo.train.calibrate import calibrate_policy, options
from mlgo.train.run import TrainOptions, load_start, run

PROBLEM = "inlining-size"
STAGES = ("bc", "es", "es-mix", "bcmax", "calibrate")
# The first ES stage's packages: the 9 C packages the shipped chain started from. Its pool
# reaches about -0.9% on them (zstd most of all); on all 45 C packages of the split, -0.37%.
FIRST_ES_PACKAGES = "bzip2,expat,libpng,libyaml,lua,lz4,sqlite3,zlib,zstd"


def c_packages(corpus: Corpus) -> list[str]:
    """The packages of CORPUS whose every module is C: what the ES stage trains on."""
    return sorted(p for p, ms in corpus.packages().items() if all(m.language == "c" for m in ms))


def es_packages(corpus: Corpus, given: str) -> list[str]:
    """`--es-packages`: `c` (the split's all-C packages), `all`, or names, comma-separated."""
    if given == "c":
        return c_packages(corpus)
    return sorted(corpus.packages()) if given == "all" else given.split(",")


def read_record(record: Path) -> tuple[dict[str, float], list[str]]:
    """OUT/recipe.json's seconds per stage and the stages finished (none if no record);
    a ValueError if it is not this tool's."""
    if not record.exists():
        return {}, []
    try:
        data = json.loads(record.read_text())
        seconds, finished = dict(data["seconds"]), list(data["finished"])
    except (KeyError, TypeError) as e:
        raise ValueError(repr(e)) from None
    if not set(finished) <= set(STAGES) or not all(
        isinstance(v, int | float) for v in seconds.values()
    ):
        raise ValueError("a stage or its seconds unknown")
    return seconds, finished


def summary(seconds: dict[str, float], finished: list[str], validation: dict | None) -> dict:
    """recipe.json: each stage's seconds, the total in minutes, the stages finished, and
    the kept threshold's judgement on validation (its change and the packages it made
    larger)."""
    return {
        "seconds": {s: round(seconds[s], 1) for s in STAGES if s in seconds},
        "total_minutes": round(sum(seconds.values()) / 60, 1),
        "finished": [s for s in STAGES if s in finished],
        "validation": validation,
    }


def kept(calibration: dict) -> dict:
    """The sweep's judgement of the kept threshold, for the languages it answers (one of
    the calibration's own `options`); where none was safe, the gate that never departs,
    which is clang's own object everywhere."""
    threshold, languages = calibration["threshold"], calibration["languages"]
    answers = tuple(languages) if languages else None
    never = {"change": 0.0, "packages_larger": []}
    judged = next(
        (j for t, x, j in options(calibration["sweep"]) if (t, x) == (threshold, answers)), never
    )
    return {
        "threshold": threshold,
        "languages": languages,
        "change_pct": 100 * judged["change"],
        "packages_larger": judged["packages_larger"],
    }


def stage_corpora(args: argparse.Namespace) -> dict[str, Corpus]:
    """The part of the train split each training stage runs on. Every package name is
    checked here, before any stage runs: one not in the corpus is a CorpusError."""
    train = load_corpus(args.train).require(get_problem(PROBLEM))
    es = es_packages(train, args.es_packages)
    mix = args.mix_packages.split(",") if args.mix_packages else []
    return {
        "bc": train,
        "es": train.select(es),
        "es-mix": train.select(sorted({*es, *mix})),
        "bcmax": train,
    }


def run_stage(
    stage: str, args: argparse.Namespace, corpora: dict[str, Corpus], tc: Toolchain, pool: Workers
) -> None:
    """STAGE, by the library calls `mlgo train` and `mlgo calibrate` make."""
    out = args.out
    if stage == "calibrate":
        validation = load_corpus(args.validation).require(get_problem(PROBLEM))
        policy = policy_dir(out / "bcmax")
        calibrate_policy(policy, validation, tc, pool, out / "policy", guard="size")
        return
    options = {
        "bc": TrainOptions(),
        "es": TrainOptions(init=out / "bc", max_seconds=60 * args.es_minutes),
        "es-mix": TrainOptions(
            init=out / "es", max_seconds=60 * args.mix_minutes, trainer={"regression_penalty": 1.0}
        ),
        "bcmax": TrainOptions(
            init=out / ("es-mix" if args.mix_packages else "es"),
            max_seconds=60 * args.bcmax_minutes,
        ),
    }
    algo = "es" if stage == "es-mix" else stage
    problem, opts = get_problem(PROBLEM), options[stage]
    start = load_start(opts.init, problem) if opts.init else None
    run(algo, corpora[stage], problem, out / stage, tc, pool, opts,
        evaluate_on_corpus=False, start=start)  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=Path, default=Path("data/corpus-train"))
    parser.add_argument("--validation", type=Path, default=Path("data/corpus-validation"))
    parser.add_argument("--out", type=Path, default=Path("data/issue40/scratch"))
    parser.add_argument("--es-minutes", type=float, default=30.0)
    parser.add_argument("--es-packages", default=FIRST_ES_PACKAGES, help="c, all, or names")
    parser.add_argument("--mix-packages", default="", help="names: the second ES stage's")
    parser.add_argument("--mix-minutes", type=float, default=20.0)
    parser.add_argument("--bcmax-minutes", type=float, default=85.0)
    args = parser.parse_args()
    record = args.out / "recipe.json"
    try:
        seconds, finished = read_record(record)
    except ValueError as e:  # JSONDecodeError too
        parser.error(f"{record}: not this tool's record ({e}); move it away to time afresh")
    try:
        corpora = stage_corpora(args)
    except MlgoError as e:  # a package not in the corpus, a corpus not built, ...
        parser.exit(1, f"error: {e}\n")
    # A stopped stage (a killed job, Ctrl-C) has its seconds counted before it ends.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    tc = find_toolchain()
    with closing(make_workers("local")) as pool:
        for stage in STAGES:
            if stage in finished or (stage == "es-mix" and not args.mix_packages):
                continue
            start = time.monotonic()
            try:
                run_stage(stage, args, corpora, tc, pool)
                finished.append(stage)
            except MlgoError as e:  # the validation split not built, ...
                parser.exit(1, f"error: {e}\n")
            finally:
                seconds[stage] = seconds.get(stage, 0.0) + time.monotonic() - start
                atomic_write_text(record, json.dumps(summary(seconds, finished, None), indent=1))
    calibration = json.loads((args.out / "policy" / "calibration.json").read_text())
    result = summary(seconds, finished, kept(calibration))
    atomic_write_text(record, json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
