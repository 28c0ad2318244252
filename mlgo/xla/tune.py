"""`tuned_jit`: jax.jit whose GEMM config is chosen by the cost model.

On the first call for an input signature the function is lowered; its fingerprint (hash of
the StableHLO) looks up an earlier choice, shared by every tuned function in the process.
Otherwise the optimized HLO graph is extracted (one compilation), the model ranks every
config, and either its pick is taken, or (verify, implied by top_k > 1) the top k and XLA's
default are compiled, checked against the default's output and timed on the actual inputs
(the default is the model's only candidate when it ranks first). A candidate
replaces the default only if it is clearly faster: interleaved rounds (order reshuffled
each round, so load hits all alike) compare it with the default round by round, and it must
be faster in the median round by WIN_MARGIN, by the rounds' own spread or by WIN_SECONDS
per call, whichever is largest, and faster in most rounds. A winner is then confirmed by a
second, independent measurement: both it and the default are compiled again (new code and
buffers, as another process would get) and timed afresh; it replaces the default only if
it wins again. Any failure on the way warns and falls back to XLA's default compilation.
"""

from __future__ import annotations

import random
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
from mlgo.xla.measure import MAX_REL_ERROR
from mlgo.xla.model import CostModel


@dataclass(frozen=True)
class Choice:
    config: str
    ranking: tuple[str, ...]  # the model's order, best first
    seconds: float  # time spent choosing and compiling
    fallback: str = ""  # why the default was used instead, if it was


_CHOICES: dict[str, Choice] = {}  # by fingerprint, for the whole process


# A measured candidate must beat the default by this much in the median round (or by the
# interquartile range of its per-round ratios to the default, if that is wider) ...
WIN_MARGIN = 0.03
# ... and save at least this much per call: re-collecting training programs of 16-25 us per
# call in fresh processes at another time moved a tile's gain over the default by up to
# 3.5 us (e.g. from 7% faster to 10% slower), so smaller gains are not trusted.
WIN_SECONDS = 4e-6
# ... and in at least this share of the rounds.
WIN_ROUNDS = 0.75


def _call_time(fn: Callable, args: tuple, kwargs: dict, calls: int) -> float:
    """Median wall time of `calls` calls, after one warm-up call."""
    jax.block_until_ready(fn(*args, **kwargs))
    samples = []
    for _ in range(calls):
        start = time.perf_counter()
        jax.block_until_ready(fn(*args, **kwargs))
        samples.append(time.perf_counter() - start)
    return float(np.median(samples))


def measured_choice(
    built: dict[str, Any],
    args: tuple,
    kwargs: dict,
    rounds: int = 9,
    round_s: float = 0.003,
    seed: int = 0,
) -> str:
    """The config of `built` (which holds DEFAULT) that is clearly faster than the default
    on these inputs, else DEFAULT; see the module docstring."""
    first = {c: _call_time(fn, args, kwargs, 3) for c, fn in built.items()}
    calls = {c: max(3, min(100, int(round_s / max(t, 1e-7)))) for c, t in first.items()}
    per_round: dict[str, list[float]] = {c: [] for c in built}
    order = list(built)
    rng = random.Random(seed)
    for _ in range(rounds):
        rng.shuffle(order)
        for c in order:
            per_round[c].append(_call_time(built[c], args, kwargs, calls[c]))
    base = np.asarray(per_round[DEFAULT])
    least = max(WIN_MARGIN, WIN_SECONDS / float(np.median(base)))
    best, best_ratio = DEFAULT, 1.0 - WIN_MARGIN
    for c, times in per_round.items():
        ratios = np.asarray(times) / base
        q25, median, q75 = np.percentile(ratios, [25, 50, 75])
        clear = median <= 1.0 - max(least, q75 - q25)
        if clear and np.mean(ratios < 1.0) >= WIN_ROUNDS and median < best_ratio:
            best, best_ratio = c, float(median)
    return best


def _first_leaf(out: Any) -> np.ndarray:
    return np.asarray(jax.tree.leaves(out)[0], dtype=np.float32)


def choose(
    lowered: jax.stages.Lowered,
    model: CostModel,
    top_k: int,
    args: tuple,
    kwargs: dict,
    verify: bool = False,
) -> tuple[Choice, Any]:
    """The model's config for `lowered` and its compiled executable (see the module doc)."""
    start = time.perf_counter()
    scores = model.predict([extract_graph(lowered)])[0]
    ranking = tuple(model.configs[i] for i in np.argsort(scores))

    def build(config: str) -> Any:
        return lowered.compile(compiler_options=compiler_options(config))

    if top_k <= 1 and not verify:
        config = model.pick(scores)
        compiled = build(config)
    else:
        candidates = list(dict.fromkeys([DEFAULT, *ranking[: ranking.index(DEFAULT)][:top_k]]))
        built = {c: build(c) for c in candidates}
        reference = _first_leaf(built[DEFAULT](*args, **kwargs))
        for c in candidates[1:]:  # a config that computes something else is never a candidate
            out = _first_leaf(built[c](*args, **kwargs))
            if np.max(np.abs(out - reference)) > MAX_REL_ERROR * (np.max(np.abs(reference)) + 1e-6):
                del built[c]
        config = measured_choice(built, args, kwargs)
        if config != DEFAULT:  # confirmed on fresh compilations, or the default stays
            again = {DEFAULT: build(DEFAULT), config: build(config)}
            config = measured_choice(again, args, kwargs, seed=1)
            built = again
        compiled = built[config]
    return Choice(config, ranking, time.perf_counter() - start), compiled


class TunedFunction:
    """Callable like the `jax.jit` of `fun`; see the module docstring."""

    def __init__(
        self, fun: Callable, model: CostModel | None, top_k: int, verify: bool, jit_kwargs: dict
    ) -> None:
        self._jit = jax.jit(fun, **jit_kwargs)
        self._model = model
        self._top_k = top_k
        self._verify = verify
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
                choice, compiled = choose(
                    lowered, self._model, self._top_k, args, kwargs, self._verify
                )
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
    verify: bool = False,
    **jit_kwargs: Any,
) -> TunedFunction:
    """Like `jax.jit(fun, **jit_kwargs)`, with the GEMM config chosen by `cost_model` (a
    model directory such as policies/xla-gemm-tile). With `verify` (implied by `top_k` > 1)
    the model's top k are timed against XLA's default on the first call's inputs, and the
    default stays unless one is clearly faster."""
    if top_k < 1:
        raise ValueError(f"top_k must be >= 1, got {top_k}")
    model = cost_model
    if isinstance(cost_model, str | Path):
        model = CostModel.load(Path(cost_model))
    return TunedFunction(fun, model, top_k, verify, jit_kwargs)
