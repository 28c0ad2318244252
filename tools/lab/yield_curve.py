"""What a search finds against what it spends: each module's anytime curve (the best cost
after each compile, `bcmax.SearchResult.curve`) summed over a corpus at a few budgets, as
bytes found and as a share of a ceiling, and the compiles as build-equivalents."""

from __future__ import annotations

from collections.abc import Mapping, Sequence


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
