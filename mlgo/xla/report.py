"""How good the choices are, per program and in total, against the measured ground truth.

For each program: the model's pick and its runtime against XLA's default, the exhaustive
best and the best single fixed config, Kendall's tau between predicted and measured
runtimes, and the top-1/top-5 gaps. Two baselines rank the same configs: the best single
fixed config (what a user would try first) and an analytical roofline estimate.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from mlgo.errors import UsageError
from mlgo.xla.dataset import Record
from mlgo.xla.extract import HloGraph
from mlgo.xla.features import dot_roofline_ns
from mlgo.xla.model import ALWAYS_DEFAULT, CostModel

GEMM_DOMINATED = 0.9  # share of the program's arithmetic in dots


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def best_fixed_config(records: list[Record], configs: list[str]) -> str:
    """The config with the best geometric-mean speedup over default across `records`."""
    usable = [c for c in configs if all(c in r.times() for r in records)]
    if not usable:
        raise UsageError("no config ran on every program")
    return min(usable, key=lambda c: geomean([r.times()[c] / r.times()["default"]
                                              for r in records]))  # fmt: skip


def dot_share(graph: HloGraph) -> float:
    """Fraction of the program's arithmetic (dot FLOPs vs. other elements) in dots."""
    dots = sum(2 * n.dot["m"] * n.dot["k"] * n.dot["n"] * n.dot["batch"] for n in graph.dots)
    rest = sum(math.prod(n.dims) for n in graph.nodes if n.op not in ("dot", "parameter"))
    return dots / max(dots + rest, 1)


def roofline_scores(graph: HloGraph, configs: list[str]) -> np.ndarray:
    """Analytical log runtime: the sum of every dot's roofline time (features.dot_roofline_ns)."""
    totals = [sum(dot_roofline_ns(n.dot, c) for n in graph.dots) for c in configs]
    return np.log(np.maximum(totals, 1e-9))


def _tau(predicted: list[float], measured: np.ndarray) -> float:
    from scipy.stats import kendalltau  # here: scipy.stats takes a second and a half to import

    tau = kendalltau(predicted, measured).statistic
    return float(tau) if tau == tau else 0.0  # constant predictions: no order at all


def _repeat_tau(record: Record, configs: list[str]) -> float:
    halves = record.halves()
    if halves is None:
        return float("nan")
    return _tau([halves[0][c] for c in configs], np.array([halves[1][c] for c in configs]))


@dataclass
class Row:
    program: str
    family: str
    chosen: str
    default_us: float
    chosen_us: float
    best: str
    best_us: float
    fixed_us: float
    roofline_us: float
    kendall_tau: float
    roofline_tau: float
    repeat_tau: float  # between two halves of the measurement: the ceiling of any model's tau
    top1_gap: float  # of the model's first config, before the default margin
    top5_gap: float
    gemm_dominated: bool
    exhaustive_s: float

    @property
    def vs_default(self) -> float:
        return self.default_us / self.chosen_us

    @property
    def vs_fixed(self) -> float:
        return self.fixed_us / self.chosen_us


def evaluate(
    records: list[Record], model: CostModel, fixed: str, scores: np.ndarray | None = None
) -> list[Row]:
    """Rows of `records` with the model's scores (or given ones, e.g. out-of-fold)."""
    if scores is None:
        scores = model.predict([r.graph for r in records])
    rows = []
    for r, s in zip(records, scores, strict=True):
        t = r.times()
        cs = [c for c in model.configs if c in t]
        pred = {c: s[model.configs.index(c)] for c in cs}
        ranked = sorted(cs, key=pred.__getitem__)
        measured = np.array([t[c] for c in cs])
        best = min(cs, key=t.__getitem__)
        roof = dict(zip(model.configs, roofline_scores(r.graph, model.configs), strict=True))
        tau = _tau([pred[c] for c in cs], measured)
        chosen = model.pick(s) if model.pick(s) in t else "default"  # tuned_jit falls back
        rows.append(
            Row(
                r.name,
                r.family,
                chosen,
                t["default"],
                t[chosen],
                best,
                t[best],
                t.get(fixed, t["default"]),
                t[min(cs, key=roof.__getitem__)],
                tau,
                _tau([roof[c] for c in cs], measured),
                _repeat_tau(r, cs),
                t[ranked[0]] / t[best] - 1,
                min(t[c] for c in ranked[:5]) / t[best] - 1,
                dot_share(r.graph) >= GEMM_DOMINATED,
                r.exhaustive_seconds(),
            )
        )
    return rows


SLOWDOWN_LIMIT = 0.98  # the bound: never slower than default by more than 2%
MARGINS = (0.0, 0.02, 0.05, 0.1, 0.15, 0.2, 0.3, 0.5, ALWAYS_DEFAULT)


def fit_default_margin(records: list[Record], model: CostModel, scores: np.ndarray) -> float:
    """The margin (see CostModel.pick) with the best geometric-mean speedup on `records`
    among those that keep every program within SLOWDOWN_LIMIT of default (ALWAYS_DEFAULT if
    none does). `scores` must be out-of-fold scores of training programs: a
    model's scores on its own training programs are overconfident, and the held-out
    programs are never used."""
    best_margin, best = ALWAYS_DEFAULT, 0.0
    for margin in MARGINS:
        model.info["default_margin"] = margin
        rows = evaluate(records, model, "default", scores)
        speedup = geomean([r.vs_default for r in rows])
        if min(r.vs_default for r in rows) >= SLOWDOWN_LIMIT and speedup > best + 1e-9:
            best_margin, best = margin, speedup
    model.info["default_margin"] = best_margin
    return best_margin


def summary(rows: list[Row]) -> dict[str, float]:
    gemm = [r for r in rows if r.gemm_dominated]
    return {
        "programs": len(rows),
        "gemm_dominated": len(gemm),
        "kendall_tau_median": float(np.median([r.kendall_tau for r in rows])),
        "roofline_kendall_tau_median": float(np.median([r.roofline_tau for r in rows])),
        "repeat_kendall_tau_median": float(np.median([r.repeat_tau for r in rows])),
        "top1_gap_median": float(np.median([r.top1_gap for r in rows])),
        "top5_gap_median": float(np.median([r.top5_gap for r in rows])),
        "speedup_vs_default_geomean": geomean([r.vs_default for r in rows]),
        "speedup_vs_default_geomean_gemm": geomean([r.vs_default for r in gemm]),
        "speedup_vs_fixed_geomean_gemm": geomean([r.vs_fixed for r in gemm]),
        "best_vs_default_geomean": geomean([r.default_us / r.best_us for r in rows]),
        "best_vs_default_geomean_gemm": geomean([r.default_us / r.best_us for r in gemm]),
        "best_vs_fixed_geomean_gemm": geomean([r.fixed_us / r.best_us for r in gemm]),
        "fixed_vs_default_geomean": geomean([r.default_us / r.fixed_us for r in rows]),
        "fixed_vs_default_geomean_gemm": geomean([r.default_us / r.fixed_us for r in gemm]),
        "roofline_vs_default_geomean": geomean([r.default_us / r.roofline_us for r in rows]),
        "slower_than_limit": sum(r.vs_default < SLOWDOWN_LIMIT for r in rows),
        "worst_vs_default": min(r.vs_default for r in rows),
    }


def to_json(rows: list[Row]) -> list[dict]:
    return [{**asdict(r), "vs_default": r.vs_default, "vs_fixed": r.vs_fixed} for r in rows]


def plot(rows: list[Row], path: Path) -> None:
    """Per program: speedup over default of the model's pick, the fixed config and the best."""
    from mlgo.plots import pyplot
    from mlgo.runtime.files import atomic_path

    plt = pyplot()

    x = np.arange(len(rows))
    fig, ax = plt.subplots(figsize=(max(6, 0.5 * len(rows)), 4))
    w = 0.27
    ax.bar(x - w, [r.default_us / r.fixed_us for r in rows], w, label="best fixed config")
    ax.bar(x, [r.vs_default for r in rows], w, label="cost model pick")
    ax.bar(x + w, [r.default_us / r.best_us for r in rows], w, label="exhaustive best")
    ax.axhline(1.0, color="black", lw=0.8)
    ax.set_xticks(x, [r.program for r in rows], rotation=70, ha="right", fontsize=7)
    ax.set_ylabel("speedup over XLA default")
    ax.legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format=path.suffix.lstrip(".") or "png", dpi=120)
    plt.close(fig)
