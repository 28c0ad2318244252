"""A shipped policy's recipe: a TOML file beside it (policies/NAME/recipe.toml) that says how
it is made, so that the command that reproduces it and the card's "Reproduce" section read
one file rather than constants in a tool.

A recipe names its problem, the corpora it needs (each one's `mlgo corpus build` arguments,
printed on the card), its stages in order and where it is released. A stage is one of:

- a training (`train = ALGO`): on a corpus, or on some of its packages (names, `c` for those
  whose every module is C, or `all`; none: the stage is not run), for `minutes` and at most
  `steps` steps (0: no bound), with trainer `options`, from the stage before it or, the
  first, from the shipped policy `start`;
- a calibration (`calibrate = CORPUS`) of the stage before it, judged as served with `guard`;
- a link-judged choice (`choose = CORPUS`) among the training before it, its start and it at
  each of `gates`, judged as lld's LTO links each program (with `guard`), tested on `test`.

The loader is strict: a key it does not know, a value of the wrong type or a stage that
refers to nothing is one `RecipeError` naming the file and the key.
"""

from __future__ import annotations

import math
import os
import shlex
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from mlgo.corpus.format import Corpus
from mlgo.errors import UsageError
from mlgo.options import OPT_LEVELS
from mlgo.runtime.inputs import read_toml

RECIPE_FILE = "recipe.toml"
GUARDS = ("size",)
PACKAGE_SETS = ("all", "c")  # a training stage's packages given as one word


class RecipeError(UsageError):
    """A recipe file that is not one: the file, the key, what is wrong."""


@dataclass(frozen=True)
class CorpusBuild:
    """A corpus a recipe needs: where it is, and the `mlgo corpus build` that makes it."""

    out: Path
    split: str | None = None
    packages: tuple[str, ...] = ()
    lto: str | None = None
    opt_level: str | None = None
    work: Path | None = None

    def command(self) -> str:
        words = ["mlgo", "corpus", "build"]
        words += ["--lto", self.lto] if self.lto else []
        words += ["--split", self.split] if self.split else list(self.packages)
        words += ["--opt-level", self.opt_level] if self.opt_level else []
        words += ["--out", str(self.out)]
        words += ["--work", str(self.work)] if self.work else []
        return shlex.join(words)


@dataclass(frozen=True)
class TrainStage:
    """Trainer ALGO on CORPUS (its PACKAGES, with those of stage WITH_PACKAGES_OF), for
    MINUTES, with OPTIONS; from START (a shipped policy's name) if it is the first stage;
    EVALUATE: evaluated on its corpus afterwards (a choice's card quotes it)."""

    name: str
    algo: str
    corpus: str
    packages: str | tuple[str, ...] = "all"
    with_packages_of: str | None = None
    minutes: float = 0.0
    options: dict[str, Any] = field(default_factory=dict)
    start: str | None = None
    evaluate: bool = False
    steps: int = 0  # the trainer's steps (`mlgo train --steps`); 0: its own number


@dataclass(frozen=True)
class CalibrateStage:
    name: str
    corpus: str
    guard: str | None = None


@dataclass(frozen=True)
class ChooseStage:
    """The choice among the training before it (`chain.linked_choice`): its start, named
    START_AS, the trained policy and it at each of GATES, judged on CORPUS, tested on TEST."""

    name: str
    corpus: str
    test: str
    gates: tuple[float, ...]
    start_as: str
    guard: str | None = None


Stage = TrainStage | CalibrateStage | ChooseStage


@dataclass(frozen=True)
class PolicyRecipe:
    path: Path
    problem: str
    out: Path
    release: Path
    corpora: dict[str, CorpusBuild]
    stages: tuple[Stage, ...]
    note: str = ""

    def stage(self, name: str) -> Stage:
        found = {s.name: s for s in self.stages}
        if name not in found:
            raise UsageError(f"{self.path}: no stage {name!r} (have: {', '.join(found)})")
        return found[name]

    def reproduce_lines(self, flags: Sequence[str] = ()) -> list[str]:
        """The shell lines that make this policy: each corpus's build, then the one command
        that runs the recipe (with FLAGS, the changes it was run with) and releases what it
        makes, after the recipe's note."""
        here = self.path.parent
        # a shipped policy's by its checkout path (installed, the same files are in the
        # package's data); any other recipe's, from where it was read
        where = f"policies/{here.name}" if here.parent.name == "policies" else os.path.relpath(here)
        notes = [f"# {line}" for line in self.note.splitlines()]
        builds = [c.command() for c in self.corpora.values()]
        run = shlex.join(["python", "-m", "tools.reproduce_policy", where, *flags, "--release"])
        return [*notes, *builds, run]


class _Table:
    """One TOML table of the recipe at PATH, at WHERE (its key path), read strictly: every
    key taken once with its type, and any key left over an error."""

    def __init__(self, path: Path, where: str, data: object):
        self.path, self.where = path, where
        if not isinstance(data, dict):
            raise self.error(where, f"a table, not {type(data).__name__}")
        self.data = dict(data)

    def error(self, key: str, what: str) -> RecipeError:
        return RecipeError(f"{self.path}: {key}: {what}")

    def key(self, name: str) -> str:
        return f"{self.where}.{name}" if self.where else name

    def take(self, name: str, kind: type | tuple[type, ...], default: Any = ...) -> Any:
        if name not in self.data:
            if default is ...:
                raise self.error(self.key(name), "missing")
            return default
        value = self.data.pop(name)
        numbers = kind is float or (isinstance(kind, tuple) and float in kind)
        if numbers and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if not isinstance(value, kind) or (kind is not bool and isinstance(value, bool)):
            names = (
                kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
            )
            raise self.error(self.key(name), f"a {names}, not {value!r}"[:200])
        if isinstance(value, int | float) and not (math.isfinite(value) and value >= 0):
            raise self.error(self.key(name), f"a number of 0 or more, not {value!r}")
        return value

    def strings(self, name: str, default: Any = ...) -> tuple[str, ...]:
        value = self.take(name, list, default)
        if not all(isinstance(v, str) and v for v in value):
            raise self.error(self.key(name), "a list of names")
        return tuple(value)

    def one_of(self, name: str, allowed: tuple[str, ...], default: Any = ...) -> Any:
        value = self.take(name, str, default)
        if value is not None and value not in allowed:
            raise self.error(self.key(name), f"one of {', '.join(allowed)}, not {value!r}")
        return value

    def done(self) -> None:
        if self.data:
            raise self.error(self.key(sorted(self.data)[0]), "not a key of a recipe here")


def _corpus(path: Path, name: str, data: object) -> CorpusBuild:
    t = _Table(path, f"corpora.{name}", data)
    corpus = CorpusBuild(
        out=Path(t.take("out", str)),
        split=t.take("split", str, None),
        packages=t.strings("packages", ()),
        lto=t.one_of("lto", ("full", "thin"), None),
        opt_level=t.one_of("opt_level", OPT_LEVELS, None),
        work=Path(w) if (w := t.take("work", str, None)) else None,
    )
    t.done()
    if (corpus.split is None) == (not corpus.packages):
        raise t.error(t.where, "give split or packages, one of them")
    return corpus


def _stage(path: Path, i: int, data: object, corpora: dict, before: list[Stage]) -> Stage:
    t = _Table(path, f"stages[{i}]", data)
    name = t.take("name", str)
    kinds = [k for k in ("train", "calibrate", "choose") if k in t.data]
    if len(kinds) != 1:
        raise t.error(t.where, "give one of train, calibrate or choose")
    corpus = t.take(kinds[0], str) if kinds[0] != "train" else t.take("corpus", str)
    if corpus not in corpora:
        raise t.error(t.key(kinds[0] if kinds[0] != "train" else "corpus"), f"no corpus {corpus!r}")
    trained = [s for s in before if isinstance(s, TrainStage)]
    stage: Stage
    if kinds[0] == "train":
        packages = t.take("packages", (str, list), "all")
        if isinstance(packages, list):
            if not all(isinstance(p, str) and p for p in packages):
                raise t.error(t.key("packages"), "a list of names")
            packages = tuple(packages)
        elif packages not in PACKAGE_SETS:
            raise t.error(t.key("packages"), f"all, c or a list of names, not {packages!r}")
        stage = TrainStage(
            name,
            t.take("train", str),
            corpus,
            packages,
            t.take("with_packages_of", str, None),
            t.take("minutes", float, 0.0),
            _options(t),
            t.take("start", str, None),
            t.take("evaluate", bool, False),
            t.take("steps", int, 0),
        )
        if stage.with_packages_of not in (None, *(s.name for s in trained)):
            raise t.error(
                t.key("with_packages_of"), f"no training stage {stage.with_packages_of!r} before it"
            )
        if stage.start is not None and before:
            raise t.error(t.key("start"), "only the first stage starts from a policy")
    elif not trained:
        raise t.error(t.where, f"a {kinds[0]} follows a training stage")
    elif kinds[0] == "calibrate":
        stage = CalibrateStage(name, corpus, t.one_of("guard", GUARDS, None))
    else:
        test = t.take("test", str)
        if test not in corpora:
            raise t.error(t.key("test"), f"no corpus {test!r}")
        gates = t.take("gates", list)
        if not all(isinstance(g, float) and 0 < g < 1 for g in gates):
            raise t.error(t.key("gates"), "a list of thresholds between 0 and 1")
        guard = t.one_of("guard", GUARDS, None)
        stage = ChooseStage(name, corpus, test, tuple(gates), t.take("start_as", str), guard)
        if trained[-1].start is None:
            raise t.error(t.where, "a choice is of a training that starts from a policy")
    t.done()
    if name in {s.name for s in before} or name in ("policy", "chosen"):
        raise t.error(t.key("name"), f"{name!r} names another stage or output")
    return stage


def _options(t: _Table) -> dict[str, Any]:
    """A training stage's trainer options: names any trainer declares, each of its type."""
    from mlgo.train.registry import options

    given = _Table(t.path, t.key("options"), t.take("options", dict, {}))
    known = options()
    taken = {}
    for name in sorted(given.data):
        if name not in known:
            raise given.error(given.key(name), "no trainer takes this option")
        kind = known[name].type
        taken[name] = given.take(name, float if kind is float else kind)
    return taken


def load_policy_recipe(path: Path) -> PolicyRecipe:
    """The recipe at PATH (a policy's directory, or its recipe.toml), checked whole."""
    if path.is_dir():
        path = path / RECIPE_FILE
    t = _Table(path, "", read_toml(path, RecipeError))
    corpora_table = _Table(path, "corpora", t.take("corpora", dict))
    corpora = {n: _corpus(path, n, corpora_table.data[n]) for n in list(corpora_table.data)}
    stages: list[Stage] = []
    for i, s in enumerate(t.take("stages", list)):
        stages.append(_stage(path, i, s, corpora, stages))
    if not stages:
        raise t.error("stages", "none")
    recipe = PolicyRecipe(
        path,
        t.take("problem", str),
        Path(t.take("out", str)),
        Path(t.take("release", str)),
        corpora,
        tuple(stages),
        t.take("note", str, ""),
    )
    t.done()
    return recipe


def stage_packages(corpus: Corpus, given: str | tuple[str, ...]) -> list[str]:
    """A training stage's packages of CORPUS: `c` (those whose every module is C), `all`,
    or the names given."""
    every = corpus.packages()
    if given == "c":
        return sorted(p for p, ms in every.items() if all(m.language == "c" for m in ms))
    return sorted(every) if given == "all" else list(given)


def overridden(
    recipe: PolicyRecipe,
    minutes: dict[str, float] | None = None,
    scale: float = 1.0,
    packages: dict[str, str] | None = None,
    corpora: dict[str, Path] | None = None,
    guards: dict[str, str] | None = None,
) -> PolicyRecipe:
    """RECIPE with some of its stages' MINUTES (every training's times SCALE, then those
    named), PACKAGES (`c`, `all` or names by commas; "": the stage is not run) and GUARDS
    (`none`: unguarded), and where its CORPORA are; a name it has not is a UsageError."""
    stages = {s.name: s for s in recipe.stages}
    for name in [*(minutes or {}), *(packages or {}), *(guards or {})]:
        recipe.stage(name)
    changed: list[Stage] = []
    for s in stages.values():
        if isinstance(s, TrainStage):
            if s.name in (guards or {}):
                raise UsageError(f"{recipe.path}: stage {s.name!r} is a training: no guard")
            given = (packages or {}).get(s.name)
            words = (
                given if given in PACKAGE_SETS else tuple(filter(None, (given or "").split(",")))
            )
            s = replace(
                s,
                minutes=(minutes or {}).get(s.name, s.minutes * scale),
                packages=s.packages if given is None else words,
            )
        elif s.name in (guards or {}):
            guard = (guards or {})[s.name]
            if guard not in (*GUARDS, "none"):
                raise UsageError(f"--guard {s.name}={guard}: size or none")
            s = replace(s, guard=None if guard == "none" else guard)
        elif s.name in (minutes or {}) or s.name in (packages or {}):
            raise UsageError(f"{recipe.path}: stage {s.name!r} is not a training")
        changed.append(s)
    if unknown := sorted(set(corpora or {}) - set(recipe.corpora)):
        raise UsageError(
            f"{recipe.path}: no corpus {unknown[0]!r} (have: {', '.join(recipe.corpora)})"
        )
    where = {n: replace(c, out=(corpora or {}).get(n, c.out)) for n, c in recipe.corpora.items()}
    return replace(recipe, stages=tuple(changed), corpora=where)
