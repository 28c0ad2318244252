"""Training data from a trace directory: one row per decision, LLVM's features as columns."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from mlgo.llvm.log_format import TensorSpec, element_column, tensor_of
from mlgo.problems import Problem
from mlgo.records import Decisions
from mlgo.traces.format import DEFAULT_DECISION, Manifest, TraceError, read_module_trace


def load_decisions(traces: Path, problem: Problem, packages: set[str] | None = None) -> Decisions:
    """All decisions of the traced modules (of `packages`, if given), in module order."""
    manifest = Manifest.load(traces)
    if manifest.problem is not problem:
        raise TraceError(f"{traces} holds {manifest.problem.name} traces, not {problem.name}")
    specs = [TensorSpec.from_json(s) for s in manifest.specs]
    present = {s.name for s in specs}
    tensors = {tensor_of(f) for f in problem.feature_names}
    # per-candidate features (regalloc) are whole tensors; a vector's elements are columns
    slots = max((s.num_elements for s in specs if s.name in problem.feature_names), default=1)
    missing = sorted(tensors - present)
    if missing:
        raise TraceError(f"{traces}: traces lack features {missing}")
    xs, defaults, owners, names = [], [], [], []
    for name in sorted(manifest.modules):
        if packages is not None and name.split("/", 1)[0] not in packages:
            continue
        entry = manifest.modules[name]
        if not entry["decisions"]:
            continue
        cols = read_module_trace(traces / entry["file"], specs, problem.advice_name)
        n = entry["decisions"]
        if slots == 1:
            columns = [element_column(cols, f, n) for f in problem.feature_names]
            xs.append(np.stack(columns, 1).astype(np.float64))
        else:
            xs.append(
                np.stack(
                    [
                        np.broadcast_to(cols[f].reshape(n, -1), (n, slots))
                        for f in problem.feature_names
                    ],
                    2,
                ).astype(np.float32)
            )
        defaults.append(cols[DEFAULT_DECISION])
        owners.append(np.full(n, len(names)))
        names.append(name)
    if not xs:
        raise TraceError(f"{traces}: no decisions for the selected packages")
    return Decisions(
        problem.feature_names,
        np.concatenate(xs),
        np.concatenate(defaults),
        np.concatenate(owners),
        names,
    )
