"""What a search finds against what it spends: each module's anytime curve (the best cost
after each compile, `bcmax.SearchResult.curve`) summed over a corpus at a few budgets, as
bytes found and as a share of a ceiling, and the compiles as build-equivalents; the spread
of a ceiling measured on a sample of modules."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np


def found_at(curve: Sequence[float], base: float, compiles: int) -> float:
    """What a module's search had found against BASE (the default's cost) after COMPILES
    compiles: a search that stopped early (nothing left to try) keeps its last best; none
    before its first compile, and never less than nothing (the default is kept)."""
    if compiles < 1 or not curve:
        return 0.0
    return max(base - curve[min(compiles, len(curve)) - 1], 0.0)


def yield_curve(
    base: Mapping[str, float], curves: Mapping[str, Sequence[float]], points: Sequence[int]
) -> dict[int, float]:
    """Bytes found over the corpus at each of POINTS compiles a module."""
    return {k: sum(found_at(curves[m], base[m], k) for m in curves if m in base) for k in points}


def build_equivalents(
    seconds: Mapping[str, float], compiles: Mapping[str, int], plain: Mapping[str, float]
) -> float:
    """The CPU of one search compile in build-equivalents per module compiled: the searches'
    SECONDS over what their COMPILES would take at each module's PLAIN compile time (one
    compile of every module is one build-equivalent at this ratio)."""
    spent = sum(seconds[m] for m in seconds)
    plain_cost = sum(compiles[m] * plain[m] for m in seconds if m in plain)
    return spent / plain_cost if plain_cost else float("nan")


def stalled_found(
    base: Mapping[str, float],
    curves: Mapping[str, Sequence[float]],
    cost: Mapping[str, float],
    seconds: float,
    patience: int,
    starts: int = 2,
) -> float:
    """Bytes found over the corpus within SECONDS of compiling (each compile of a module
    costing COST[m]) when a module that went PATIENCE compiles without finding anything
    stops getting compiles: one compile each in turn while its search has moves left and
    it still gives (its STARTS always do), until the seconds are spent.
    Read from each search's anytime curve, so it is what that budget rule would have found
    with the same searches."""
    names = [m for m in curves if m in base and curves[m]]
    given, spent = dict.fromkeys(names, 0), 0.0

    def gives(m: str) -> bool:
        n, curve = given[m], curves[m]
        stalled = n > max(patience, starts - 1) and curve[n - 1] >= curve[n - 1 - patience]
        return n < len(curve) and not stalled

    active = list(names)
    while active:
        still = []
        for m in active:
            if spent + cost[m] > seconds:
                continue
            given[m] += 1
            spent += cost[m]
            if gives(m):
                still.append(m)
        active = still
    return sum(found_at(curves[m], base[m], given[m]) for m in names)


def sampled_share_interval(
    gains: Mapping[str, float],
    totals: Mapping[str, float],
    draws: int = 2000,
    seed: int = 0,
    level: float = 0.9,
) -> tuple[float, float]:
    """The spread of a ceiling measured on a random sample of modules: the LEVEL interval
    of the sample's share (the sum of GAINS over the sum of TOTALS, per module) over DRAWS
    bootstrap resamples of its modules, drawn again with replacement. A share measured on
    32 modules of a thousand is an estimate of the whole corpus's; this says how loose."""
    rng = np.random.default_rng(seed)
    names = sorted(totals)
    gain = np.array([gains.get(n, 0.0) for n in names])
    total = np.array([totals[n] for n in names])
    picks = rng.integers(0, len(names), size=(draws, len(names)))
    shares = gain[picks].sum(axis=1) / total[picks].sum(axis=1)
    tail = (1 - level) / 2
    return float(np.quantile(shares, tail)), float(np.quantile(shares, 1 - tail))
