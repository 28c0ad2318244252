"""Problems: one compiler decision point each, declared in one small module.

A problem names the clang flags that open its channel, the features and advice LLVM uses,
the compiler's default answer, how a compiled object is measured and how a measurement
becomes a reward. Collection, training, export and serving only ever use this interface.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from mlgo.llvm.log_format import Observation
from mlgo.problems.policy import Derived


@dataclass(frozen=True)
class Problem:
    name: str
    summary: str
    opt_level: str  # the optimization level the decision is trained for
    channel_flags: Callable[[str], list[str]]  # channel base path -> compiler flags
    feature_names: tuple[str, ...]  # LLVM's feature names, in LLVM's spelling
    advice_name: str
    # The compiler's own decision (inlining sends it) or, where the compiler does not
    # reveal it, the documented baseline answer used to walk the default trajectory.
    default_advice: Callable[[Observation], int]
    default_is_observed: bool
    validate: Callable[[Observation, np.ndarray], None]  # raises ValueError on illegal advice
    measure_flags: Callable[[Path], list[str]]  # cc1 flags that make the compiler report costs
    measure: Callable[[Path, Path], dict[str, float]]  # (object, work dir) -> metrics
    reward_metric: str  # the metric a policy should lower, relative to the default
    derived: tuple[Derived, ...] = ()  # extra inputs computed from LLVM's features
    # "mlp": one network over all features (a yes/no decision); "candidate": one network
    # scores each slot of per-candidate features and the best legal slot wins.
    policy_kind: str = "mlp"
    # LLVM's input tensors as (name, dtype, shape), for an exported model to take them as
    # the compiler sends them; empty: every feature is an int64 scalar (inlining).
    input_specs: tuple[tuple[str, str, tuple[int, ...]], ...] = ()
    # The flags for serving a trained policy, where they are cheaper than channel_flags:
    # the compiler's own decision costs it one more cost analysis per call site, and
    # only training looks at it.
    serving_flags: Callable[[str], list[str]] | None = None

    def flags_for_serving(self, base: str) -> list[str]:
        return (self.serving_flags or self.channel_flags)(base)


def _registry() -> dict[str, Problem]:
    from mlgo.problems import inlining_size, regalloc_eviction

    return {p.name: p for p in (inlining_size.PROBLEM, regalloc_eviction.PROBLEM)}


def get_problem(name: str) -> Problem:
    problems = _registry()
    if name not in problems:
        raise KeyError(f"unknown problem {name!r}; known: {', '.join(sorted(problems))}")
    return problems[name]


def problem_names() -> list[str]:
    return sorted(_registry())
