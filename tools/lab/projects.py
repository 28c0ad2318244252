"""The real projects the lab tunes on their own code: Debian source packages, each a recipe
file in tools/projects/ (the format of corpus/recipes/, with `language` and a `bench_shell`
workload), kept apart from corpus/ so that nothing trains on them by accident."""

from __future__ import annotations

from pathlib import Path

from mlgo.packages.recipes import Recipe, available_recipes, load_recipe

PROJECTS_DIR = Path(__file__).resolve().parents[1] / "projects"
PROJECTS = tuple(available_recipes(PROJECTS_DIR))
RETIMED = (15, 6.0)  # a speed problem's builds timed again: rounds, CPU seconds a build a round


def project_recipe(name: str) -> Recipe:
    """Project NAME as `mlgo tune` takes it: its shell lines, its workload, and the Debian
    source and build dependencies it is fetched with."""
    return load_recipe(name, PROJECTS_DIR)
