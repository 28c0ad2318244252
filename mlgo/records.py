"""Plain records that several rooms pass around: one compile's decisions, and training rows.

They sit on the low floor, apart from the code that makes them (`corpus.compile`,
`traces.dataset`) and the code that reads them (`traces.format`, `problems.policy`,
trainers), so that no room has to import another just to name what it was handed.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from mlgo.llvm.log_format import TensorSpec


@dataclass
class ModuleRun:
    """Everything one compilation of a module revealed: decisions, answers and cost."""

    module: str
    specs: tuple[TensorSpec, ...] = ()
    contexts: list[str] = field(default_factory=list)
    features: dict[str, np.ndarray] = field(default_factory=dict)  # name -> [decisions, ...]
    advice: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    default: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    metrics: dict[str, float] = field(default_factory=dict)
    seconds: float = 0.0

    @property
    def num_decisions(self) -> int:
        return len(self.advice)


@dataclass
class Decisions:
    """Traced decisions as training data: one row per decision, LLVM's features as columns."""

    features: tuple[str, ...]
    # [decisions, features] raw values; for per-candidate features (regalloc)
    # [decisions, slots, features], scalar features repeated for each slot.
    x: np.ndarray
    default: np.ndarray  # [decisions] the default answer
    module: np.ndarray  # [decisions] index into `modules`
    modules: list[str]
