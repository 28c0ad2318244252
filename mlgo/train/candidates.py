"""The candidates a chain judges, and the rule that keeps one of them.

A trained policy is not served as it is: it is one candidate beside clang's own decisions
(the start gated never to depart), the start, and the trained policy gated at a few
departure thresholds (`GATES`; with a calibration's sweep, each language alone too). A
judge (the corpus, the real link, a workload's clock: `programs/judges.py`) gives each a
change against clang's own, and the cheapest is kept, the earliest of equals, so that a
policy that does not beat the default on the code it will build is not served. A
candidate that makes any program or package larger is never kept (`none_larger`).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import replace

from mlgo.llvm.languages import label
from mlgo.problems.policy import MLPPolicy
from mlgo.train.calibrate import NEVER, options

GATES = (0.6, 0.8, 0.95)  # departure thresholds tried on the trained policy (an evaluation each)
FINALISTS = 3  # the candidates cheapest by a judge with a clock, timed by it


def gate_name(threshold: float, languages: tuple[str, ...] | None = None) -> str:
    """The trained policy gated at THRESHOLD (answering LANGUAGES alone), as a candidate."""
    alone = f", {label(languages[0])} only" if languages else ""
    return f"trained, gated at {threshold:g}{alone}"


def gated(policy: MLPPolicy, thresholds: tuple[float, ...]) -> dict[str, MLPPolicy]:
    """POLICY at each of THRESHOLDS, by `gate_name` (none for a policy that cannot gate)."""
    if not policy.can_gate:
        return {}
    return {gate_name(t): replace(policy, departure_threshold=t) for t in thresholds}


def gated_candidates(policy: MLPPolicy, sweep: list[dict]) -> dict[str, tuple[MLPPolicy, float]]:
    """POLICY at each of a calibration SWEEP's `options` on the user's corpus: every
    compile and, in a code base of C and C++, each language alone (the other left to the
    default), so that a project whose C++ grows under the policy can still have its C
    served."""
    candidates = {}
    for t, languages, judged in options(sweep):
        gated = replace(policy, departure_threshold=t, languages=languages)
        candidates[gate_name(t, languages)] = (gated, judged["change"])
    return candidates


def none_larger(change: float, larger: list[str]) -> float:
    """A candidate's CHANGE as the keep rule weighs it: infinite where it made anything
    LARGER, so that it is never kept."""
    return math.inf if larger else change


def cheapest(judged: dict[str, float]) -> str:
    """The candidate of JUDGED with the lowest change, the earliest of equals."""
    return min(judged, key=judged.__getitem__)


def smaller(judged: dict[str, float]) -> str | None:
    """The `cheapest` of JUDGED if it is smaller than clang's own (below 0), else None:
    clang's own decisions stay."""
    if not judged:
        return None
    kept = cheapest(judged)
    return kept if judged[kept] < 0 else None


def cheapest_distinct(judged: dict[str, float], n: int) -> list[str]:
    """The N candidates of JUDGED cheaper than the default (0), cheapest first, and of
    equals only the first (a policy and its C-only gate, in a project of C alone)."""
    kept: dict[float, str] = {}
    for name in sorted(judged, key=judged.__getitem__):
        if judged[name] < 0 and len(kept) < n:
            kept.setdefault(judged[name], name)
    return list(kept.values())


def surely_faster(timed: dict[str, dict]) -> str | None:
    """Of the TIMED candidates (`WorkloadReward.clock`), the one whose CPU time's median
    change is lowest among those whose whole IQR is below zero; None where none is: a cost
    that ranked changes of 1 to 11% well does not rank candidates a point or two apart (on
    serd, -2.1% by it was +1.2% by the clock; on cmark its cheapest, -2.2%, lost to clang's
    own at threshold 400, -1.3% on the clock), so a speed tune serves only what the clock
    says is faster."""
    faster = {n: t["change_pct"] for n, t in timed.items() if t["iqr_pct"][1] < 0}
    return min(faster, key=faster.__getitem__) if faster else None


# --- the sources of candidates --------------------------------------------------------------
# Each gives named candidates, each a policy and its change on the corpus (`Weigh`), in the
# order a chain weighs them: the earliest of equals is kept.

Weigh = Callable[[MLPPolicy], float]  # a policy's change on the corpus against clang's own
Candidates = dict[str, tuple[MLPPolicy, float]]


def clangs_own(start: MLPPolicy) -> Candidates:
    """Clang's own decisions: START gated never to depart, no change by definition (none
    for a policy that cannot gate)."""
    return {"default": (replace(start, departure_threshold=NEVER), 0.0)} if start.can_gate else {}


def the_start(start: MLPPolicy, name: str, weigh: Weigh) -> Candidates:
    """START as it is, under NAME (the shipped policy, or clang's own cloned)."""
    return {name: (start, weigh(start))}


def threshold_grid(start: MLPPolicy, weigh: Weigh) -> Candidates:
    """Clang's own decisions at each base of START's problem (`Problem.base_grid`: the
    inline threshold); none for a problem with no grid or a policy that cannot gate."""
    problem = start.problem
    if not (start.can_gate and problem.base_grid):
        return {}
    bases = {
        f"clang's own, {problem.base_switch}={b}": replace(start, departure_threshold=NEVER, base=b)
        for b in problem.base_grid
    }
    return {name: (at, weigh(at)) for name, at in bases.items()}


def trained_and_gated(
    trained: MLPPolicy, change: float, sweep: Callable[[MLPPolicy], list[dict]]
) -> Candidates:
    """The TRAINED policy (its CHANGE on the corpus) and, if it can gate, it at each
    departure threshold of its calibration's SWEEP (`gated_candidates`)."""
    found: Candidates = {"trained": (trained, change)}
    if trained.can_gate:
        found.update(gated_candidates(trained, sweep(trained)))
    return found
