"""Programs: a JAX function plus example input shapes, loaded from Python files.

A corpus file (see corpus/xla/) defines `PROGRAMS`, a list of `Program`s. A user's own file
named as `path.py:fn` defines the function `fn` and `EXAMPLE_ARGS = {"fn": (...)}` with
arrays or `jax.ShapeDtypeStruct`s.
"""

from __future__ import annotations

import importlib.util
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import jax
import numpy as np

from mlgo.errors import UsageError


@dataclass(frozen=True)
class Program:
    name: str
    family: str
    fn: Callable[..., Any]
    args: tuple[jax.ShapeDtypeStruct, ...]
    held_out: bool = False  # kept out of training: the held-out figures are measured on these


def spec(shape: Sequence[int], dtype: Any = "float32") -> jax.ShapeDtypeStruct:
    return jax.ShapeDtypeStruct(tuple(shape), np.dtype(dtype))


def example_inputs(program: Program, seed: int = 0) -> list[jax.Array]:
    """Random inputs of the program's shapes (same seed, same inputs)."""
    rng = np.random.default_rng(seed)
    return [
        jax.numpy.asarray(rng.standard_normal(a.shape).astype(np.float32).astype(a.dtype))
        for a in program.args
    ]


def _import(path: Path) -> ModuleType:
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such program file")
    name = f"mlgo_xla_programs_{path.stem}_{abs(hash(path.resolve()))}"
    module_spec = importlib.util.spec_from_file_location(name, path)
    if module_spec is None or module_spec.loader is None:
        raise UsageError(f"{path}: not a Python file")
    module = importlib.util.module_from_spec(module_spec)
    sys.modules[name] = module
    try:
        module_spec.loader.exec_module(module)
    except Exception as e:
        raise UsageError(f"{path}: cannot import: {type(e).__name__}: {e}") from e
    return module


def load_corpus(root: Path) -> list[Program]:
    """Every program of every corpus file under `root`, sorted by name; names are unique."""
    if not root.is_dir():
        raise FileNotFoundError(f"{root}: no such program corpus directory")
    programs: dict[str, Program] = {}
    for path in sorted(root.glob("*.py")):
        found = getattr(_import(path), "PROGRAMS", None)
        if not isinstance(found, list) or not all(isinstance(p, Program) for p in found):
            raise UsageError(f"{path}: PROGRAMS must be a list of mlgo.xla.programs.Program")
        for p in found:
            if p.name in programs:
                raise UsageError(f"{path}: duplicate program name {p.name!r}")
            programs[p.name] = p
    if not programs:
        raise UsageError(f"{root}: no programs (corpus files define PROGRAMS)")
    return [programs[n] for n in sorted(programs)]


def load_target(target: str) -> Program:
    """`file.py:fn`: a corpus program of that name, or `fn` with `EXAMPLE_ARGS["fn"]`;
    `DIR:name`: the program `name` of the corpus in DIR."""
    path, sep, attr = target.rpartition(":")
    if not sep or not path or not attr:
        raise UsageError(f"{target!r}: expected FILE.py:FUNCTION")
    if Path(path).is_dir():
        found = {p.name: p for p in load_corpus(Path(path))}
        if attr not in found:
            raise UsageError(f"{target}: no program {attr!r} in the corpus {path}")
        return found[attr]
    module = _import(Path(path))
    for p in getattr(module, "PROGRAMS", []):
        if isinstance(p, Program) and p.name == attr:
            return p
    fn = getattr(module, attr, None)
    if not callable(fn):
        raise UsageError(f"{target}: {path} defines no function {attr!r}")
    args = getattr(module, "EXAMPLE_ARGS", {}).get(attr)
    if args is None:
        raise UsageError(f"{target}: {path} needs EXAMPLE_ARGS = {{{attr!r}: (inputs...)}}")
    shapes = tuple(jax.ShapeDtypeStruct(np.shape(a), np.dtype(a.dtype)) for a in args)
    return Program(attr, Path(path).stem, fn, shapes)
