"""Recipes: how to fetch, build, test and time one Debian source package (`corpus/recipes`).

A recipe is data, shipped with mlgo (`mlgo.data`): the corpus builds (`build.py`) and the
programs built and measured by `mlgo build`, `tune` and `demo` all read it.
"""

from __future__ import annotations

import re
import shlex
import tomllib
from dataclasses import dataclass
from pathlib import Path

from mlgo import data as shipped
from mlgo.runtime.commands import BuildError

RECIPES = shipped.recipes_dir()
# How long one run of a workload command may take, as a test may: past it, it never ends
BENCH_TIMEOUT_S = 600.0
NOTHING_VOLATILE = r"$^"  # a regex that matches nothing: a workload's output is the same


@dataclass(frozen=True)
class Recipe:
    name: str
    source: str
    build: tuple[str, ...]
    build_depends: tuple[str, ...] = ()
    configure: tuple[str, ...] = ()
    programs: tuple[str, ...] = ()
    test: tuple[str, ...] = ()
    test_timeout_s: float = 600.0
    build_timeout_s: float = 1800.0
    # a workload for throughput: shell lines that make its input in the built tree, the
    # commands timed (argv, no shell), and a shell line that checks their result
    bench_prepare: tuple[str, ...] = ()
    bench: tuple[str, ...] = ()
    bench_check: str = "true"
    bench_volatile: str = NOTHING_VOLATILE  # a regex of what may differ in two builds' output
    bench_timeout_s: float = BENCH_TIMEOUT_S  # one run of a bench command, killed past it
    language: str = ""  # what a report groups it by ("C", "C++"); "": not said


def shell_workload(line: str) -> tuple[str, ...]:
    """A workload given as one shell line, as the commands a recipe times (argv)."""
    return (shlex.join(["sh", "-c", line]),)


def project(
    name: str,
    configure: list[str],
    build: list[str],
    test: list[str],
    bench: str | None,
    bench_timeout_s: float = BENCH_TIMEOUT_S,
) -> Recipe:
    """A user's project as a recipe without a Debian source: its shell lines, and its
    workload (a shell line whose output must be the same on both builds, each run killed
    past BENCH_TIMEOUT_S)."""
    if not build:
        raise BuildError("no build command: give --build, e.g. --build 'make -j2'")
    workload = shell_workload(bench) if bench else ()
    return Recipe(
        name,
        "",
        tuple(build),
        configure=tuple(configure),
        test=tuple(test),
        bench=workload,
        bench_timeout_s=bench_timeout_s,
    )


def available_recipes(recipes_dir: Path = RECIPES) -> list[str]:
    return sorted(p.stem for p in recipes_dir.glob("*.toml"))


def _recipe_path(name: str, recipes_dir: Path) -> Path:
    """A recipe by its own name (`lua`) or by its Debian source package (`lua5.4`)."""
    path = recipes_dir / f"{name}.toml"
    if path.is_file():
        return path
    for candidate in sorted(recipes_dir.glob("*.toml")):
        if re.search(rf'^source\s*=\s*"{re.escape(name)}"', candidate.read_text(), re.M):
            return candidate
    have = ", ".join(available_recipes(recipes_dir))
    raise BuildError(f"no recipe {path.name} in {recipes_dir} (have: {have})")


def load_recipe(name: str, recipes_dir: Path = RECIPES) -> Recipe:
    """Recipe NAME from RECIPES_DIR. Its workload is `bench` (commands timed, argv, no
    shell) or `bench_shell` (one shell line, as `mlgo tune --bench` takes it), not both.
    `extends = "BASE"` takes every field but the workload's from the shipped recipe BASE,
    where it does not give them itself: another workload on the same package."""
    path = _recipe_path(name, recipes_dir)
    name = path.stem
    try:
        d = tomllib.loads(path.read_text())
        if "extends" in d:
            base = tomllib.loads(_recipe_path(str(d.pop("extends")), RECIPES).read_text())
            d = {**{k: v for k, v in base.items() if not k.startswith("bench")}, **d}
        if "bench_shell" in d and "bench" in d:
            raise ValueError("give bench or bench_shell, not both")
        shell = d.get("bench_shell")
        bench = shell_workload(shell) if shell else tuple(d.get("bench", ()))
        return Recipe(
            name=name,
            source=d["source"],
            build=tuple(d["build"]),
            build_depends=tuple(d.get("build_depends", ())),
            configure=tuple(d.get("configure", ())),
            programs=tuple(d.get("programs", ())),
            test=tuple(d.get("test", ())),
            test_timeout_s=float(d.get("test_timeout_s", 600)),
            build_timeout_s=float(d.get("build_timeout_s", 1800)),
            bench_prepare=tuple(d.get("bench_prepare", ())),
            bench=bench,
            bench_check=str(d.get("bench_check", "true")),
            bench_volatile=str(d.get("bench_volatile", NOTHING_VOLATILE)),
            bench_timeout_s=float(d.get("bench_timeout_s", BENCH_TIMEOUT_S)),
            language=str(d.get("language", "")),
        )
    except (ValueError, RecursionError, KeyError, TypeError) as e:  # tomllib recurses per level
        raise BuildError(f"{path}: bad recipe ({e})") from e
