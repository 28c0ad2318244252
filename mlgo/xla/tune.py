"""`tuned_jit`: jax.jit whose GEMM config is chosen, per input signature, by the cost model.

Calls take jax's own C++ dispatch path: `tuned_jit` returns the kind of object `jax.jit`
returns (a PjitFunction), built with a cache-miss handler of ours. The first call of a
signature chooses the config and hands the call to `jax.jit(fun, compiler_options=...)` of
that config (plain `jax.jit(fun)` for XLA's default), which compiles it; the C++ fast path
keeps that executable for the signature, so later calls never enter Python and cost what a
`jax.jit` call costs.

Choosing: the function is lowered (as jax.jit does anyway); its StableHLO fingerprint finds
an earlier choice made in this process or kept in the persistent tuning cache (cache.py),
which then costs no model, no measurement and no extra compilation. Otherwise the optimized
HLO graph is extracted (one compilation), the model ranks every config, and either its pick
is taken, or (verify, implied by top_k > 1) the top k and XLA's default are compiled,
checked against the default's output and timed on the actual inputs (the default is the
model's only candidate when it ranks first). A model whose fitted margin never lets it leave
the default is not even run unless asked to verify. A candidate replaces the default only if
it is clearly faster: interleaved rounds (order reshuffled each round, so load hits all
alike) compare it with the default round by round, and it must be faster in the median
round by WIN_MARGIN, by the rounds' own spread or by WIN_SECONDS per call, whichever is
largest, and faster in most rounds. A winner is then confirmed by a second, independent
measurement: both it and the default are compiled again (new code and buffers, as another
process would get) and timed afresh; it replaces the default only if it wins again. Any
failure on the way warns and falls back to XLA's default compilation.
"""

from __future__ import annotations

import dataclasses
import functools
import random
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jax
import numpy as np

from mlgo.errors import UsageError
from mlgo.runtime.files import cache_dir as user_cache_dir
from mlgo.runtime.inputs import read_json
from mlgo.xla.cache import TuningCache, digest
from mlgo.xla.config import DEFAULT, compiler_options, parse_config
from mlgo.xla.extract import HloGraph, fingerprint, hlo_fingerprint, optimized_hlo, parse_hlo
from mlgo.xla.measure import MAX_REL_ERROR
from mlgo.xla.model import ALWAYS_DEFAULT, CostModel


@dataclass(frozen=True)
class Choice:
    config: str
    ranking: tuple[str, ...]  # the model's order, best first
    seconds: float  # time spent choosing: extraction, model, verification
    fallback: str = ""  # why the default was used instead, if it was
    cached: bool = False  # reused from the persistent tuning cache


# By (StableHLO fingerprint, tuner), for the whole process.
_CHOICES: dict[tuple[str, str], Choice] = {}


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
    graph: HloGraph,
    model: CostModel,
    top_k: int,
    args: tuple,
    kwargs: dict,
    verify: bool = False,
) -> Choice:
    """The model's config for `lowered`, whose optimized HLO is `graph` (see the module doc)."""
    start = time.perf_counter()
    scores = model.predict([graph])[0]
    ranking = tuple(model.configs[i] for i in np.argsort(scores))
    if top_k <= 1 and not verify:
        return Choice(model.pick(scores), ranking, time.perf_counter() - start)

    def build(config: str) -> Any:
        return lowered.compile(compiler_options=compiler_options(config))

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
    return Choice(config, ranking, time.perf_counter() - start)


def _model_meta(model: CostModel | Path) -> dict:
    """What identifies a model and its margin, read without loading its networks."""
    if isinstance(model, CostModel):
        return {"configs": model.configs, "hyper": model.hyper.__dict__, "info": model.info}
    path = model / "model.json"
    try:
        meta = read_json(path)
    except OSError as e:
        raise UsageError(f"{path}: not a cost model ({e})") from e
    return {k: meta.get(k) for k in ("configs", "hyper", "info")}


@functools.cache
def load_model(path: Path) -> CostModel:
    """Loaded once per process, when the first program needs it: loading compiles."""
    return CostModel.load(path)


class _Tuner:
    """Chooses the config of each new signature of one tuned function (see the module doc)."""

    def __init__(
        self,
        fun: Callable,
        model: CostModel | Path | None,
        top_k: int,
        verify: bool,
        cache: TuningCache,
        jit_kwargs: dict,
    ) -> None:
        self.fun = fun
        self.jit_kwargs = jit_kwargs
        self.jits = {DEFAULT: jax.jit(fun, **jit_kwargs)}
        self.model = model
        self.top_k = top_k
        self.verify = verify or top_k > 1
        self.cache = cache
        meta = _model_meta(model) if model is not None else {}
        self.tuner = digest([meta, top_k, self.verify])
        # Fitted so that the model alone never leaves the default: running it buys nothing.
        margin = (meta.get("info") or {}).get("default_margin", 0.0)
        self.idle = model is not None and not self.verify and margin >= ALWAYS_DEFAULT
        self.choices: dict[str, Choice] = {}  # by StableHLO fingerprint, for this function

    def jit(self, config: str) -> Any:
        """`jax.jit(fun)` compiling with `config`, one per config."""
        if config not in self.jits:
            own = self.jit_kwargs.get("compiler_options") or {}
            options = {**own, **compiler_options(config)}
            kwargs = {**self.jit_kwargs, "compiler_options": options}
            self.jits[config] = jax.jit(self.fun, **kwargs)
        return self.jits[config]

    def cache_miss(self, *args: Any, **kwargs: Any) -> Any:
        """The C++ fast path's miss handler: the chosen config's jit compiles and runs the
        call and returns the executable that the fast path keeps for this signature."""
        return self.jit(self.config_for(args, kwargs))._cache_miss(*args, **kwargs)

    def config_for(self, args: tuple, kwargs: dict) -> str:
        from jax._src import core

        if not core.trace_state_clean():  # inside an outer jit or transform: it compiles us
            return DEFAULT
        try:
            lowered = self.jits[DEFAULT].lower(*args, **kwargs)
        except Exception:  # bad arguments: jax.jit's own call raises what jax.jit would
            return DEFAULT
        key = fingerprint(lowered)
        choice = _CHOICES.get((key, self.tuner))
        if choice is None:
            choice = _CHOICES[(key, self.tuner)] = self.choose(lowered, key, args, kwargs)
        self.choices[key] = choice
        return choice.config

    def choose(self, lowered: jax.stages.Lowered, key: str, args: tuple, kwargs: dict) -> Choice:
        start = time.perf_counter()
        try:
            if self.model is None:
                raise UsageError("no cost model given")
            if self.idle:
                return Choice(DEFAULT, (), time.perf_counter() - start)
            hlo = self.cache.optimized(key)
            known = self.cache.choice(hlo, self.tuner) if hlo else None
            aliased = known is not None
            if known is None:
                text = optimized_hlo(lowered)
                fresh = hlo_fingerprint(text)
                if fresh != hlo:  # the same HLO may have been tuned when lowered otherwise
                    hlo, known = fresh, self.cache.choice(fresh, self.tuner)
            if known is not None:
                if not aliased:
                    self.cache.store(key, hlo, self.tuner, known)
                return Choice(known["config"], tuple(known.get("ranking", ())), 0.0, cached=True)
            if isinstance(self.model, Path):
                self.model = load_model(self.model.resolve())
            choice = choose(lowered, parse_hlo(text), self.model, self.top_k, args, kwargs,
                            self.verify)  # fmt: skip
            parse_config(choice.config)
            choice = dataclasses.replace(choice, seconds=time.perf_counter() - start)
            record = {"config": choice.config, "ranking": list(choice.ranking)}
            self.cache.store(key, hlo, self.tuner, {**record, "seconds": choice.seconds})
            return choice
        except Exception as e:  # the default compilation always stands behind the model
            why = str(e).splitlines()[0] if str(e) else type(e).__name__
            warnings.warn(f"tuned_jit: tuning failed ({why}); using XLA's default", stacklevel=4)
            return Choice(DEFAULT, (), time.perf_counter() - start, fallback=why)


def _fast_path(fun: Callable, tuner: _Tuner) -> Any:
    """A PjitFunction like `jax.jit(fun)`'s but with `tuner.cache_miss`, in a C++ cache of
    its own (so it never hands its executables to, or takes them from, `jax.jit(fun)`)."""
    from jax._src import pjit, tree_util
    from jax._src.interpreters import pxla
    from jax._src.lib import _jax

    info = tuner.jits[DEFAULT]._jit_info
    fields = dataclasses.fields(pxla.JitGlobalCppCacheKeys)
    key = pxla.JitGlobalCppCacheKeys(**{f.name: getattr(info, f.name) for f in fields})
    f = _jax.pjit(pjit.fun_name(fun), fun, tuner.cache_miss, info.static_argnums,
                  info.static_argnames, key, tree_util.dispatch_registry, pxla.cc_shard_arg,
                  pjit.make_jit_cpp_cache(CPP_CACHE_SIGNATURES))  # fmt: skip
    f = functools.wraps(fun)(f)
    f._fun, f._jit_info = fun, info  # what `.lower()` and `.trace()` of a jit read
    f.choices = tuner.choices
    return f


CPP_CACHE_SIGNATURES = 4096  # as jax.jit's own cache


def tuned_jit(
    fun: Callable,
    cost_model: str | Path | CostModel | None = None,
    top_k: int = 1,
    verify: bool = False,
    cache_dir: str | Path | None = None,
    **jit_kwargs: Any,
) -> Any:
    """Like `jax.jit(fun, **jit_kwargs)` (and as fast to call), with the GEMM config chosen
    by `cost_model` (a model directory such as policies/xla-gemm-tile). With `verify`
    (implied by `top_k` > 1) the model's top k are timed against XLA's default on the first
    call's inputs, and the default stays unless one is clearly faster. Choices persist in
    `cache_dir` (default: the user's mlgo cache, `mlgo.runtime.files.cache_dir`); the returned
    function's `choices` maps each signature's StableHLO fingerprint to its Choice."""
    if top_k < 1:
        raise UsageError(f"top_k must be >= 1, got {top_k}")
    model = Path(cost_model) if isinstance(cost_model, str) else cost_model
    cache = TuningCache(Path(cache_dir) if cache_dir is not None else user_cache_dir())
    return _fast_path(fun, _Tuner(fun, model, top_k, verify, cache, jit_kwargs))
