"""The programs the lab times register allocation (and its speed reward) on: each a recipe
file in tools/workloads/ that extends a shipped recipe with a workload of its own, read by
the product's one recipe loader; and the flags those programs are built with."""

from __future__ import annotations

import json
from pathlib import Path

from rich.console import Console

from mlgo.corpus.wrappers import build_env
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import available_recipes, load_recipe
from mlgo.programs.compare import Variant
from mlgo.programs.measure import Workload, recipe_workload
from mlgo.runtime.commands import run_logged
from mlgo.runtime.files import atomic_write_text

WORKLOADS_DIR = Path(__file__).resolve().parents[1] / "workloads"
FLAGS = ["-O2", "-g0", "-Qunused-arguments"]
PROGRAMS: dict[str, Workload] = {
    name: recipe_workload(load_recipe(name, WORKLOADS_DIR))
    for name in available_recipes(WORKLOADS_DIR)
}


def save_json(path: Path, result: dict, console: Console) -> None:
    """RESULT written whole as PATH, and said."""
    path.parent.mkdir(parents=True, exist_ok=True)
    atomic_write_text(path, json.dumps(result, indent=1))
    console.print(f"wrote {path}")


def prepare_workload(
    prog: Workload, tc: Toolchain, work: Path, v: Variant, flags: list[str]
) -> None:
    """The benchmark's own setup in WORK/<variant>, compiled as the package was."""
    env = dict(build_env(tc, work / f".{v.name}-bin", flags, *v.compilers), **v.env)
    for cmd in prog.prepare:
        run_logged(
            cmd,
            work / v.name,
            work / f"{v.name}.log",
            1800,
            env,
            f"{prog.recipe} {v.name}: bench setup",
        )
