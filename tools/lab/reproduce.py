"""A shipped policy's recipe (`tools.lab.recipe`) run into one directory: its trainings and its
calibration in turn (`stages.run_in_turn`), then its link-judged choice, if it has one
(`chain.linked_choice`), each stage timed in OUT/recipe.json (`StageRecord`), so that a
rerun resumes; and what it made released as it ships, with a card whose "Reproduce"
section is the recipe's."""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path

from rich.table import Table

from mlgo.corpus.format import Corpus, load_corpus
from mlgo.data import shipped_policy
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import Problem, get_problem
from mlgo.problems.policy_files import load_policy, save_policy
from mlgo.programs.chain import linked_choice
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.inputs import read_json
from mlgo.runtime.workers import Workers
from mlgo.train import policy_dir
from mlgo.train.calibrate import kept
from mlgo.train.candidates import gated
from mlgo.train.evaluate import Evaluation
from mlgo.train.run import load_start
from mlgo.train.stages import Stage, StageRecord, run_stages
from tools.lab.recipe import (
    CalibrateStage,
    ChooseStage,
    PolicyRecipe,
    RecipeError,
    TrainStage,
    stage_packages,
)

# The card's account of a link-judged choice, from its training's record
CHOICE_HOW = (
    "BC-Max trained {spent:.0f} minutes from the per-file policy on the train split's "
    "full-LTO links (train change {train:+.3f}%). Every candidate below was judged on the "
    "validation split as lld's LTO links each program{guarded}; the smallest total with no "
    "package larger ships. Sizes are the `.text` sections of the linked programs and "
    "libraries against plain `-Oz -flto`."
)


def _start(recipe: PolicyRecipe, name: str) -> Path:
    """The shipped policy NAME a recipe's first stage starts from."""
    where = shipped_policy(name)
    if not re.fullmatch(r"[a-z0-9][a-z0-9-]*", name) or not where.is_dir():
        raise RecipeError(f"{recipe.path}: start: no shipped policy {name!r}")
    return where


def stages_of(
    recipe: PolicyRecipe, problem: Problem, out: Path
) -> dict[str, Training | Calibrating]:
    """The recipe's trainings and calibration as `run_in_turn` runs them, every corpus read
    and every package name checked before any stage runs (one not in its corpus is a
    CorpusError); a training given no packages is left out."""
    corpora: dict[str, Corpus] = {}

    def corpus(name: str) -> Corpus:
        if name not in corpora:
            corpora[name] = load_corpus(recipe.corpora[name].out).require(problem)
        return corpora[name]

    packages: dict[str, list[str]] = {}
    turn: dict[str, Training | Calibrating] = {}
    for stage in recipe.stages:
        if isinstance(stage, CalibrateStage):
            turn[stage.name] = Calibrating(
                recipe.corpora[stage.corpus].out, out / "policy", stage.guard
            )
        elif isinstance(stage, TrainStage) and stage.packages != ():
            own = stage_packages(corpus(stage.corpus), stage.packages)
            wanted = sorted({*packages.get(stage.with_packages_of or "", []), *own})
            packages[stage.name] = wanted if stage.with_packages_of else own
            every = stage.packages == "all" and not stage.with_packages_of
            part = (
                corpus(stage.corpus) if every else corpus(stage.corpus).select(packages[stage.name])
            )
            start = _start(recipe, stage.start) if stage.start else None
            turn[stage.name] = Training(
                stage.algo, part, stage.minutes, stage.options, start, stage.evaluate, stage.steps
            )
    return turn


def timed_stages(recipe: PolicyRecipe, out: Path) -> StageRecord:
    """The recipe's stages as OUT/recipe.json records them; one that is not such a record
    is refused, kept as it is."""
    record = out / "recipe.json"
    try:
        return StageRecord.load(record, [s.name for s in recipe.stages])
    except ValueError as e:  # JSONDecodeError too
        raise RecipeError(
            f"{record}: not this tool's record ({e}); move it away to time afresh"
        ) from None


def run_recipe(
    recipe: PolicyRecipe, stages: StageRecord, out: Path, tc: Toolchain, workers: Workers
) -> dict | None:
    """Every stage of RECIPE that STAGES has not finished, into OUT; the record's result is
    the calibration's kept change on its corpus, or the choice's. Returns the choice (as
    `linked_choice` gives it, with the training's seconds and change), if there is one."""
    problem = get_problem(recipe.problem)
    run_in_turn(stages, stages_of(recipe, problem, out), RecipeRun(out, problem, tc, workers))
    last = recipe.stages[-1]
    if isinstance(last, CalibrateStage):
        stages.result = {"validation": kept(read_json(out / "policy/calibration.json"))}
        stages.save()
        return None
    assert isinstance(last, ChooseStage), "a recipe ends in a calibration or a choice"
    with stages.timing(last.name):
        choice = _choose(recipe, last, problem, out, tc)
    stages.result = {"chosen": choice["chosen"]}
    if "test" in choice:
        stages.result["test_change_pct"] = choice["test"]["change_pct"]
    stages.save()
    return choice


def _suffix(stage: ChooseStage) -> str:
    return "-guard" if stage.guard else ""


def _choose(
    recipe: PolicyRecipe, stage: ChooseStage, problem: Problem, out: Path, tc: Toolchain
) -> dict:
    """The choice STAGE among the training before it, its start and it at each gate
    (OUT/chosen, guarded: OUT/chosen-guard); its judgements in OUT/ship.json (guarded:
    OUT/ship-guard.json), which a rerun takes."""
    trained_stage = [s for s in recipe.stages if isinstance(s, TrainStage)][-1]
    run = out / trained_stage.name
    trained = load_policy(run / "policy")
    assert trained_stage.start is not None, "the recipe's loader checks a choice's start"
    candidates = {stage.start_as: load_start(_start(recipe, trained_stage.start), problem)}
    candidates |= {"trained": trained, **gated(trained, stage.gates)}
    seconds = float(read_json(run / "state.json").get("seconds", 0.0))
    train = 100 * Evaluation.load(run / "eval").totals()["delta"]
    result: dict = {"training": {"seconds": seconds}, "train_change_pct": train}

    def corpus(name: str) -> Corpus:  # each read when its turn comes: a rerun resumes
        return load_corpus(recipe.corpora[name].out).require(problem)

    record = out / f"ship{_suffix(stage)}.json"
    held_out = (lambda: corpus(stage.corpus), lambda: corpus(stage.test))
    result |= linked_choice(candidates, *held_out, tc, record, bool(stage.guard))
    if (chosen := result["chosen"]) is not None:
        # judged as the guard serves it, it is served guarded whatever MLGO_GUARD says
        policy = candidates[chosen]
        save_policy(
            replace(policy, guard=stage.guard) if stage.guard else policy, chosen_dir(out, stage)
        )
    atomic_write_text(record, json.dumps(result, indent=1))
    return result


def chosen_dir(out: Path, stage: ChooseStage) -> Path:
    return out / f"chosen{_suffix(stage)}"


def release_made(
    recipe: PolicyRecipe, out: Path, to: Path, reproduce: list[str], choice: dict | None
) -> Path | None:
    """What the recipe made in OUT released into TO as it ships (numpy and SavedModel), its
    card's "Reproduce" section REPRODUCE; None if a choice kept nothing (clang's own stays)."""
    from mlgo.ship.release import release
    from mlgo.train.modelcard import chosen_card, run_card

    last = recipe.stages[-1]
    if isinstance(last, CalibrateStage):
        policy = load_policy(out / "policy")
        card = run_card(policy, out / "policy", reproduce)
    elif choice is None or choice["chosen"] is None:
        return None
    else:
        assert isinstance(last, ChooseStage)
        policy = load_policy(chosen_dir(out, last))
        how = {
            "spent": choice["training"]["seconds"] / 60,
            "train": choice["train_change_pct"],
            "guarded": ", served guarded" if last.guard else "",
        }
        card = chosen_card(policy, choice, CHOICE_HOW.format(**how), reproduce)
    return release(policy, to, card, aot=False).model_card.parent


@dataclass(frozen=True)
class Training:
    """A recipe's training stage: trainer ALGO on CORPUS, for MINUTES (0: its own number
    of steps), with OPTIONS (fields of `TrainOptions`), from the stage before it (the first
    from START, a policy, if given); EVALUATE: then evaluated on CORPUS (OUT/NAME/eval)."""

    algo: str
    corpus: Corpus
    minutes: float = 0.0
    options: dict = field(default_factory=dict)
    start: Path | None = None
    evaluate: bool = False
    steps: int = 0  # at most this many of the trainer's steps; 0: its own number


@dataclass(frozen=True)
class Calibrating:
    """A recipe's calibration of the stage before it on the corpus at CORPUS (read when
    its turn comes), judged as served with GUARD, into OUT (`calibrate_policy`)."""

    corpus: Path
    out: Path
    guard: str | None = None


@dataclass(frozen=True)
class RecipeRun:
    """What a recipe's stages share: where they train, the problem, the toolchain, the
    workers."""

    out: Path
    problem: Problem
    tc: Toolchain
    workers: Workers


def recipe_stages(recipe: dict[str, Training | Calibrating]) -> list[Stage[RecipeRun]]:
    """RECIPE's stages, each from the policy of the stage before it (the first from its
    start or nothing), a training into OUT/NAME."""
    stages, before = [], None
    for name, stage in recipe.items():
        stages.append(Stage(name, partial(_recipe_stage, name, stage, before)))
        before = stage.out if isinstance(stage, Calibrating) else name
    return stages


def _recipe_stage(
    name: str, stage: Training | Calibrating, before: Path | str | None, run: RecipeRun
) -> None:
    """One stage of a recipe. No training is evaluated on its corpus unless it asks (`mlgo
    train` would): the time goes to training."""
    from mlgo.train.calibrate import calibrate_policy
    from mlgo.train.run import TrainOptions, load_start
    from mlgo.train.run import run as train

    previous = run.out / before if isinstance(before, str) else before
    if isinstance(stage, Calibrating):
        assert previous is not None, "a calibration follows a training"
        corpus = load_corpus(stage.corpus).require(run.problem)
        calibrate_policy(policy_dir(previous), corpus, run.tc, run.workers, stage.out, stage.guard)
        return
    budget, init = 60 * stage.minutes, previous or stage.start
    opts = TrainOptions(steps=stage.steps, init=init, max_seconds=budget, trainer=stage.options)
    start = load_start(init, run.problem) if init else None
    train(stage.algo, stage.corpus, run.problem, run.out / name, run.tc, run.workers, opts,
          evaluate_on_corpus=stage.evaluate, start=start)  # fmt: skip


def run_in_turn(
    record: StageRecord, recipe: dict[str, Training | Calibrating], run: RecipeRun
) -> None:
    """Each stage of RECIPE that RECORD has not finished, timed (`recipe_stages`)."""
    run_stages(recipe_stages(recipe), record, run, "the recipe")


def choice_table(choice: dict, title: str) -> Table:
    """A `linked_choice`'s candidates for the terminal: each one's change on validation
    and the packages it made larger, the kept one marked."""
    table = Table("candidate", "validation", "packages larger", title=title)
    for name, v in choice["validation"].items():
        larger = ", ".join(v["packages_larger"]) or "-"
        kept = " (kept)" if name == choice["chosen"] else ""
        table.add_row(name + kept, f"{v['change_pct']:+.3f}%", larger)
    return table


def outcome_line(choice: dict) -> str | None:
    """A `linked_choice`'s test, in a line: its change, each language's, the packages it
    made larger and those by more than 0.1% (None: nothing was kept to test)."""
    if "test" not in choice:
        return None
    t = choice["test"]
    langs = ", ".join(f"{x} {v:+.3f}%" for x, v in t["by_language_pct"].items())
    larger = ", ".join(t["packages_larger"]) or "none"
    over = ", ".join(t["packages_over_0.1pct"]) or "none"
    return f"test: {t['change_pct']:+.3f}% ({langs}); larger: {larger}; >0.1%: {over}"
