"""Issue 40's training from scratch in one command, each stage timed: the per-file
inlining-size policy that ships guarded, trained on the train split, gated on validation.

  .venv/bin/python -m tools.train_inlining_size --out data/issue40/scratch
The recipe is TRAINING, each stage from the one before, then calibration; its defaults did
best on validation (docs/records/inlining-size.md, "BC-Max given the time"): BC, a clone of clang's
`-Oz`; ES for 30 minutes on FIRST_ES_PACKAGES (`--es-packages`: names, `c` for the split's
C packages, or `all`), where departing shrinks code (BC-Max departs little from a BC clone);
with `--mix-packages`, ES again beside them, a package's loss counted twice; BC-Max for 85
on the whole split; the gate calibrated on validation as the size guard serves it.
Writes OUT/policy and OUT/recipe.json (`Stages.timed`: each stage's seconds, a stopped
one's too, those finished, the gate's guarded change of validation); a rerun resumes.
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from contextlib import closing
from pathlib import Path

from mlgo.corpus.format import Corpus, load_corpus
from mlgo.errors import MlgoError
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems import get_problem
from mlgo.runtime.inputs import read_json
from mlgo.runtime.workers import make_workers
from mlgo.train.calibrate import kept
from mlgo.train.stages import Calibrating, Stages, Training, run_in_turn

PROBLEM = "inlining-size"
# The first ES stage's packages: the 9 C packages the shipped chain started from. Its pool
# reaches about -0.9% on them (zstd most of all); on all 45 C packages of the split, -0.37%.
FIRST_ES_PACKAGES = "bzip2,expat,libpng,libyaml,lua,lz4,sqlite3,zlib,zstd"
# Each training stage: its trainer, its packages, its minutes (`--NAME-minutes`), its options.
TRAINING = {
    "bc": ("bc", "all", None, {}),
    "es": ("es", "es", ("es", 30.0), {}),
    "es-mix": ("es", "mix", ("mix", 20.0), {"regression_penalty": 1.0}),
    "bcmax": ("bcmax", "all", ("bcmax", 85.0), {}),
}
STAGES = (*TRAINING, "calibrate")


def es_packages(corpus: Corpus, given: str) -> list[str]:
    """`--es-packages`: `c` (the split's packages whose every module is C), `all`, or names."""
    every = corpus.packages()
    if given == "c":
        return sorted(p for p, ms in every.items() if all(m.language == "c" for m in ms))
    return sorted(every) if given == "all" else given.split(",")


def recipe(args: argparse.Namespace) -> dict[str, Training | Calibrating]:
    """TRAINING on the parts of the train split ARGS name, then calibration; every package
    name checked before any stage runs: one not in the corpus is a CorpusError."""
    train = load_corpus(args.train).require(get_problem(PROBLEM))
    es = es_packages(train, args.es_packages)
    mix = sorted({*es, *args.mix_packages.split(",")}) if args.mix_packages else None
    corpora = {"all": train, "es": train.select(es), "mix": mix and train.select(mix)}
    training = {
        name: Training(algo, corpora[part], vars(args)[f"{t[0]}_minutes"] if t else 0.0, options)
        for name, (algo, part, t, options) in TRAINING.items()
        if corpora[part] is not None
    }
    return {**training, "calibrate": Calibrating(args.validation, args.out / "policy", "size")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--train", type=Path, default=Path("data/corpus-train"))
    parser.add_argument("--validation", type=Path, default=Path("data/corpus-validation"))
    parser.add_argument("--out", type=Path, default=Path("data/issue40/scratch"))
    parser.add_argument("--es-packages", default=FIRST_ES_PACKAGES, help="c, all, or names")
    parser.add_argument("--mix-packages", default="", help="names: the second ES stage's")
    for name, default in (t for _, _, t, _ in TRAINING.values() if t):
        parser.add_argument(f"--{name}-minutes", type=float, default=default)
    args = parser.parse_args()
    record, out = args.out / "recipe.json", args.out
    try:
        stages = Stages.timed(record, STAGES, {"validation": None})
    except ValueError as e:  # JSONDecodeError too
        parser.error(f"{record}: not this tool's record ({e}); move it away to time afresh")
    # A stopped stage (a killed job, Ctrl-C) has its seconds counted before it ends.
    signal.signal(signal.SIGTERM, lambda signum, _frame: sys.exit(128 + signum))
    try:  # a package not in the corpus, a corpus not built, ...
        problem, stages_recipe, tc = get_problem(PROBLEM), recipe(args), find_toolchain()
        with closing(make_workers("local")) as pool:
            run_in_turn(stages, stages_recipe, out, problem, tc, pool)
    except MlgoError as e:
        parser.exit(1, f"error: {e}\n")
    stages.result = {"validation": kept(read_json(out / "policy/calibration.json"))}
    stages.save()
    print(json.dumps(stages.summary(), indent=1))


if __name__ == "__main__":
    main()
