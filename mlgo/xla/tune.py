"""`tuned_jit`: jax.jit whose GEMM config is chosen by the cost model.

On the first call for an input signature the function is lowered; its fingerprint (hash of
the StableHLO) looks up an earlier choice, shared by every tuned function in the process.
Otherwise the optimized HLO graph is extracted (one compilation), the model ranks every
config, and either its best config is taken, or (top_k > 1) the top k and XLA's default are
compiled, checked against the default's output and timed on the actual inputs, and the
fastest wins. Any failure on the way warns and falls back to XLA's default compilation.
"""

from __future__ import annotations

import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from mlgo.xla.config import DEFAULT, compiler_options
from mlgo.xla.extract import extract_graph, fingerprint
from mlgo.xla.measure import MAX_REL_ERROR, summarize
from mlgo.xla.model import CostModel


@dataclass(frozen=True)
class Choice:
    config: str
    ranking: tuple[str, ...]  # the model's order, best first
    seconds: float  # time spent choosing and compiling
    fallback: str = ""  # why the default was used instead, if it was


_CHOICES: dict[str, Choice] = {}  # by fingerprint, for the whole process


def _time(fn: Callable, args: tuple, kwargs: dict, rounds: int = 5) -> float:
    per_round = []
    for _ in range(rounds):
        fn(*args, **kwargs)
        start = time.perf_counter()
        for _ in range(3):
            jax.block_until_ready(fn(*args, **kwargs))
        per_round.append((time.perf_counter() - start) / 3)
    return summarize(per_round)["median_us"]


def _first_leaf(out: Any) -> np.ndarray:
    return np.asarray(jax.tree.leaves(out)[0], dtype=np.float32)


def choose(
    lowered: jax.stages.Lowered, model: CostModel, top_k: int, args: tuple, kwargs: dict
) -> tuple[Choice, Any]:
    """The model's config for `lowered` and its compiled executable."""
    start = time.perf_counter()
    scores = model.predict([extract_graph(lowered)])[0]
    ranking = tuple(model.configs[i] for i in np.argsort(scores))

    def build(config: str) -> Any:
        return lowered.compile(compiler_options=compiler_options(config))

    if top_k <= 1:
        config = model.pick(scores)
        compiled = build(config)
    else:
        candidates = list(dict.fromkeys([DEFAULT, *ranking[:top_k]]))
        built = {c: build(c) for c in candidates}
        reference = _first_leaf(built[DEFAULT](*args, **kwargs))
        times = {}
        for c, fn in built.items():
            out = _first_leaf(fn(*args, **kwargs))
            err = np.max(np.abs(out - reference)) / (np.max(np.abs(reference)) + 1e-6)
            if err <= MAX_REL_ERROR:
                times[c] = _time(fn, args, kwargs)
        config = min(times, key=times.__getitem__)
        compiled = built[config]
    return Choice(config, ranking, time.perf_counter() - start), compiled


class TunedFunction:
    """Callable like the `jax.jit` of `fun`; see the module docstring."""

    def __init__(
        self, fun: Callable, model: CostModel | None, top_k: int, jit_kwargs: dict
    ) -> None:
        self._jit = jax.jit(fun, **jit_kwargs)
        self._model = model
        self._top_k = top_k
        self._compiled: dict[Any, Any] = {}
        self.choices: dict[str, Choice] = {}  # by fingerprint, for this function

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        leaves, tree = jax.tree.flatten((args, kwargs))
        signature = (tree, tuple((np.shape(x), np.result_type(x)) for x in leaves))
        compiled = self._compiled.get(signature)
        if compiled is None:
            compiled = self._compiled[signature] = self._compile(args, kwargs)
        return compiled(*args, **kwargs)

    def _compile(self, args: tuple, kwargs: dict) -> Any:
        lowered = self._jit.lower(*args, **kwargs)
        key = fingerprint(lowered)
        known = _CHOICES.get(key)
        try:
            if known is not None:
                choice = known
                compiled = lowered.compile(compiler_options=compiler_options(known.config))
            elif self._model is None:
                raise ValueError("no cost model given")
            else:
                choice, compiled = choose(lowered, self._model, self._top_k, args, kwargs)
        except Exception as e:  # the default compilation always stands behind the model
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            warnings.warn(f"tuned_jit: tuning failed ({why}); using XLA's default", stacklevel=3)
            choice = Choice(DEFAULT, (), 0.0, fallback=why)
            compiled = lowered.compile()
        _CHOICES.setdefault(key, choice)
        self.choices[key] = choice
        return compiled


def tuned_jit(
    fun: Callable,
    cost_model: str | Path | CostModel | None = None,
    top_k: int = 1,
    **jit_kwargs: Any,
) -> TunedFunction:
    """Like `jax.jit(fun, **jit_kwargs)`, with the GEMM config chosen by `cost_model` (a
    model directory such as policies/xla-gemm-tile); `top_k` > 1 measures the model's
    top k (and the default) on the first call's inputs."""
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    model = cost_model
    if isinstance(cost_model, str | Path):
        model = CostModel.load(Path(cost_model))
    return TunedFunction(fun, model, top_k, jit_kwargs)
