"""A shipped policy's recipe (`train.recipe`) run into one directory: its trainings and its
calibration in turn (`stages.run_in_turn`), then its link-judged choice, if it has one
(`chain.linked_choice`), each stage timed in OUT/recipe.json (`StageRecord`), so that a
rerun resumes; and what it made released as it ships, with a card whose "Reproduce"
section is the recipe's."""

from __future__ import annotations

import json
import re
from dataclasses import replace
from pathlib import Path

from mlgo.corpus.format import Corpus, load_corpus
from mlgo.data import shipped_policy
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import Problem, get_problem
from mlgo.problems.policy_files import load_policy, save_policy
from mlgo.programs.chain import linked_choice
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.inputs import read_json
from mlgo.runtime.workers import Workers
from mlgo.train.calibrate import kept
from mlgo.train.candidates import gated
from mlgo.train.evaluate import Evaluation
from mlgo.train.recipe import (
    CalibrateStage,
    ChooseStage,
    PolicyRecipe,
    RecipeError,
    TrainStage,
    stage_packages,
)
from mlgo.train.run import load_start
from mlgo.train.stages import Calibrating, RecipeRun, StageRecord, Training, run_in_turn

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
    from mlgo.ship.modelcard import chosen_card, run_card
    from mlgo.ship.release import release

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
