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
from scipy.stats import kendalltau

from mlgo.xla.config import parse_config
from mlgo.xla.dataset import Record
from mlgo.xla.extract import HloGraph
from mlgo.xla.features import VECTOR_WIDTH
from mlgo.xla.model import CostModel

GEMM_DOMINATED = 0.9  # share of the program's arithmetic in dots


def geomean(xs: list[float]) -> float:
    return math.exp(sum(math.log(x) for x in xs) / len(xs)) if xs else float("nan")


def best_fixed_config(records: list[Record], configs: list[str]) -> str:
    """The config with the best geometric-mean speedup over default across `records`."""
    usable = [c for c in configs if all(c in r.times() for r in records)]
    if not usable:
        raise ValueError("no config ran on every program")
    return min(usable, key=lambda c: geomean([r.times()[c] / r.times()["default"]
                                              for r in records]))  # fmt: skip


def dot_share(graph: HloGraph) -> float:
    """Fraction of the program's arithmetic (dot FLOPs vs. other elements) in dots."""
    dots = sum(2 * n.dot["m"] * n.dot["k"] * n.dot["n"] * n.dot["batch"] for n in graph.dots)
    rest = sum(math.prod(n.dims) for n in graph.nodes if n.op not in ("dot", "parameter"))
    return dots / max(dots + rest, 1)


def roofline_scores(graph: HloGraph, configs: list[str]) -> np.ndarray:
    """Analytical log runtime: per dot, max(FLOPs / (peak * tile efficiency), bytes / BW).
    A tile's efficiency is the share of its padded work that is useful times the share of
    the 16 vector registers its M x N accumulators keep busy; library paths run at peak."""
    peak, bandwidth = 32.0, 8.0  # FLOPs and bytes per ns, one core
    out = []
    for config in configs:
        tile = parse_config(config)
        total = 0.0
        for n in graph.dots:
            m, k, nn, b = n.dot["m"], n.dot["k"], n.dot["n"], n.dot["batch"]
            eff = 1.0
            if tile is not None:
                tn = tile.n * VECTOR_WIDTH
                pad = (math.ceil(m / tile.m) * tile.m * math.ceil(k / tile.k) * tile.k
                       * math.ceil(nn / tn) * tn) / (m * k * nn)  # fmt: skip
                eff = min(1.0, tile.m * tile.n / 16) / pad
            flops = 2.0 * m * k * nn * b
            total += max(flops / (peak * eff), 4.0 * b * (m * k + k * nn + m * nn) / bandwidth)
        out.append(math.log(max(total, 1e-9)))
    return np.asarray(out)


def _tau(predicted: list[float], measured: np.ndarray) -> float:
    tau = kendalltau(predicted, measured).statistic
    return float(tau) if tau == tau else 0.0  # constant predictions: no order at all


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
    top1_gap: float
    top5_gap: float
    gemm_dominated: bool
    exhaustive_s: float

    @property
    def vs_default(self) -> float:
        return self.default_us / self.chosen_us

    @property
    def vs_fixed(self) -> float:
        return self.fixed_us / self.chosen_us


def evaluate(records: list[Record], model: CostModel, fixed: str) -> list[Row]:
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
                t[chosen] / t[best] - 1,
                min(t[c] for c in ranked[:5]) / t[best] - 1,
                dot_share(r.graph) >= GEMM_DOMINATED,
                r.exhaustive_seconds(),
            )
        )
    return rows


def fit_default_margin(records: list[Record], model: CostModel) -> float:
    """The margin (see CostModel.pick) with the best geometric-mean speedup on `records`;
    fitted on the training programs, never on the held-out ones."""
    best_margin, best = 0.0, 0.0
    for margin in (0.0, 0.02, 0.05, 0.1, 0.2):
        model.info["default_margin"] = margin
        speedup = summary(evaluate(records, model, "default"))["speedup_vs_default_geomean"]
        if speedup > best + 1e-9:
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
        "top1_gap_median": float(np.median([r.top1_gap for r in rows])),
        "top5_gap_median": float(np.median([r.top5_gap for r in rows])),
        "speedup_vs_default_geomean": geomean([r.vs_default for r in rows]),
        "speedup_vs_default_geomean_gemm": geomean([r.vs_default for r in gemm]),
        "speedup_vs_fixed_geomean_gemm": geomean([r.vs_fixed for r in gemm]),
        "best_vs_default_geomean": geomean([r.default_us / r.best_us for r in rows]),
        "fixed_vs_default_geomean": geomean([r.default_us / r.fixed_us for r in rows]),
        "roofline_vs_default_geomean": geomean([r.default_us / r.roofline_us for r in rows]),
        "worst_vs_default": min(r.vs_default for r in rows),
    }


def to_json(rows: list[Row]) -> list[dict]:
    return [{**asdict(r), "vs_default": r.vs_default, "vs_fixed": r.vs_fixed} for r in rows]


def plot(rows: list[Row], path: Path) -> None:
    """Per program: speedup over default of the model's pick, the fixed config and the best."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from mlgo.fsutil import atomic_path

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
