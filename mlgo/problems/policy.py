"""A learned policy: per-feature quantile normalization and a small MLP over LLVM's features.

Normalization follows MLGO's idea and is learned from the training traces: each raw
feature value becomes its quantile q in [0, 1] among the values seen in training, given
to the network as (q, sqrt q, q^2) so that both small and large values are resolved.
The quantiles are stored with the policy, so a policy takes raw compiler features.

Rollouts evaluate the policy in numpy (tens of microseconds a decision, no TensorFlow in
the compile workers); trainers and the exported SavedModel use the same weights in TF.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from mlgo.llvm.log_format import Observation
from mlgo.runtime.files import atomic_path, atomic_write_text

QUANTILES = 256
# A per-candidate column holding the live range's own value of a feature (the last slot's),
# so that a derived input can compare each candidate with it: "self:use_def_density".
SELF = "self:"


def with_own_columns(x: np.ndarray, names: Sequence[str], wanted: Sequence[str]) -> np.ndarray:
    """[n, slots, len(names)] -> [n, slots, len(wanted)]; `wanted` may name SELF columns."""
    index = {f: j for j, f in enumerate(names)}
    columns = [
        np.broadcast_to(x[:, -1:, index[w.removeprefix(SELF)]], x.shape[:2])
        if w.startswith(SELF)
        else x[:, :, index[w]]
        for w in wanted
    ]
    return np.stack(columns, 2)


@dataclass(frozen=True)
class Derived:
    """A feature computed from two of LLVM's: `left - right`, or `left < right` as 0/1.

    Quantiles are taken per feature, so a comparison between two features (the default
    inliner's `cost_estimate < threshold`) is hard for the network to recover; giving it
    explicitly keeps the model exportable, since the graph computes it from LLVM's inputs.
    """

    name: str
    left: str
    op: str  # "-" or "<"
    right: str

    def __post_init__(self) -> None:
        if self.op not in ("-", "<"):
            raise ValueError(f"derived feature {self.name}: unknown op {self.op!r}")


@dataclass
class Normalizer:
    features: tuple[str, ...]  # LLVM's, in input order
    quantiles: list[np.ndarray]  # per column (features, then derived): sorted boundaries
    derived: tuple[Derived, ...] = ()

    @classmethod
    def fit(
        cls,
        features: Sequence[str],
        values: np.ndarray,
        derived: Sequence[Derived] = (),
        n: int = QUANTILES,
    ) -> Normalizer:
        """values: [samples, features] raw feature values from the training traces.

        Boundaries come from the finite values only: one +inf (LLVM gives an unspillable
        live range infinite weight) would otherwise turn every boundary of its column into
        NaN and the column into a constant. +inf and NaN still map to 1, -inf to 0."""
        norm = cls(tuple(features), [], tuple(derived))
        columns = norm.expand(values)
        norm.quantiles = []
        for j in range(columns.shape[1]):
            finite = columns[np.isfinite(columns[:, j]), j]
            q = np.quantile(finite, np.linspace(0, 1, n + 1)) if finite.size else np.zeros(1)
            norm.quantiles.append(np.unique(q))
        return norm

    @property
    def columns(self) -> int:
        return len(self.features) + len(self.derived)

    @property
    def width(self) -> int:
        return 3 * self.columns

    def expand(self, values: np.ndarray) -> np.ndarray:
        """[n, features] -> [n, features + derived]."""
        values = np.atleast_2d(values).astype(np.float64)
        index = {f: j for j, f in enumerate(self.features)}
        extra = []
        for d in self.derived:
            left, right = values[:, index[d.left]], values[:, index[d.right]]
            extra.append(left - right if d.op == "-" else (left < right).astype(np.float64))
        return np.concatenate([values, np.stack(extra, 1)], 1) if extra else values

    def transform(self, values: np.ndarray) -> np.ndarray:
        """[n, features] raw -> [n, 3 * columns] float32: (q, sqrt q, q^2) per column."""
        columns = self.expand(values)
        out = np.empty((columns.shape[0], self.width), np.float32)
        c = self.columns
        for j, q in enumerate(self.quantiles):
            frac = np.searchsorted(q, columns[:, j], side="right") / max(len(q), 1)
            out[:, j] = frac
            out[:, c + j] = np.sqrt(frac)
            out[:, 2 * c + j] = frac * frac
        return out

    def to_json(self) -> dict:
        return {
            "features": list(self.features),
            "derived": [[d.name, d.left, d.op, d.right] for d in self.derived],
            "quantiles": [q.tolist() for q in self.quantiles],
        }

    @classmethod
    def from_json(cls, d: dict) -> Normalizer:
        return cls(
            tuple(d["features"]),
            [np.asarray(q, np.float64) for q in d["quantiles"]],
            tuple(Derived(*x) for x in d.get("derived", [])),
        )


@dataclass
class MLPPolicy:
    """logits = MLP(normalize(features)); action = argmax (or a sample, when exploring)."""

    kind = "mlp"
    problem: str
    normalizer: Normalizer
    weights: list[np.ndarray] = field(default_factory=list)  # W0, b0, W1, b1, ...
    temperature: float = 0.0  # 0: greedy; > 0: sample from softmax(logits / T)
    seed: int | None = None

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    @classmethod
    def init(
        cls,
        problem: str,
        normalizer: Normalizer,
        hidden: Sequence[int] = (64, 32),
        actions: int = 2,
        seed: int = 0,
    ) -> MLPPolicy:
        rng = np.random.default_rng(seed)
        sizes = [normalizer.width, *hidden, actions]
        weights: list[np.ndarray] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            weights.append((rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32))
            weights.append(np.zeros(b, np.float32))
        return cls(problem, normalizer, weights)

    # -- evaluation -------------------------------------------------------------------
    def logits(self, raw: np.ndarray) -> np.ndarray:
        h = self.normalizer.transform(raw)
        n_layers = len(self.weights) // 2
        for i in range(n_layers):
            h = h @ self.weights[2 * i] + self.weights[2 * i + 1]
            if i < n_layers - 1:
                h = np.maximum(h, 0.0)
        return h

    def raw_features(self, obs: Observation) -> np.ndarray:
        return np.array(
            [obs.features[f].reshape(-1)[0] for f in self.normalizer.features], np.float64
        )

    def __call__(self, obs: Observation) -> int:
        logits = self.logits(self.raw_features(obs))[0]
        if self.temperature <= 0:
            return int(np.argmax(logits))
        z = logits / self.temperature
        p = np.exp(z - z.max())
        return int(self._rng.choice(len(p), p=p / p.sum()))

    # -- parameters as one vector (evolution strategies) -------------------------------
    def flat(self) -> np.ndarray:
        return np.concatenate([w.reshape(-1) for w in self.weights]).astype(np.float32)

    def with_flat(self, theta: np.ndarray) -> MLPPolicy:
        weights, i = [], 0
        for w in self.weights:
            weights.append(theta[i : i + w.size].reshape(w.shape).astype(np.float32))
            i += w.size
        return replace(self, weights=weights)

    # -- storage -----------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """policy.npz + normalization.json + policy.json, each written atomically."""
        directory.mkdir(parents=True, exist_ok=True)
        with atomic_path(directory / "policy.npz") as tmp, open(tmp, "wb") as f:
            np.savez(f, *self.weights)
        atomic_write_text(directory / "normalization.json", json.dumps(self.normalizer.to_json()))
        atomic_write_text(
            directory / "policy.json",
            json.dumps(
                {
                    "problem": self.problem,
                    "kind": self.kind,
                    "layers": [list(w.shape) for w in self.weights[::2]],
                },
                indent=1,
            ),
        )

    @classmethod
    def load(cls, directory: Path) -> MLPPolicy:
        """Either kind of policy, as policy.json says."""
        try:
            meta = json.loads((directory / "policy.json").read_text())
            norm = Normalizer.from_json(json.loads((directory / "normalization.json").read_text()))
            with np.load(directory / "policy.npz") as z:
                weights = [z[f"arr_{i}"] for i in range(len(z.files))]
            kind = _KINDS[meta.get("kind", "mlp")]
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{directory}: not a policy ({e})") from e
        return kind(meta["problem"], norm, weights)


@dataclass
class CandidatePolicy(MLPPolicy):
    """One MLP scores every candidate slot from that slot's features (plus the decision's
    scalar features, e.g. `progress`, repeated for each slot); the answer is the best slot
    the `mask` feature allows. This is the shape of MLGO's regalloc eviction model: the
    weights are shared across slots, so the network is small and sees no slot numbers.
    """

    kind = "candidate"
    mask_feature = "mask"

    @classmethod
    def init(
        cls,
        problem: str,
        normalizer: Normalizer,
        hidden: Sequence[int] = (32, 16),
        actions: int = 1,
        seed: int = 0,
    ) -> CandidatePolicy:
        return super().init(problem, normalizer, hidden, 1, seed)  # type: ignore[return-value]

    def raw_features(self, obs: Observation) -> np.ndarray:
        """[slots, features]: per-slot features as sent, scalar ones broadcast to each slot,
        SELF columns the live range's own value."""
        slots = obs.features[self.mask_feature].size
        llvm = [f for f in self.normalizer.features if not f.startswith(SELF)]
        sent = np.stack(
            [np.broadcast_to(obs.features[f].reshape(-1), (slots,)) for f in llvm], 1
        ).astype(np.float64)
        return with_own_columns(sent[None], llvm, self.normalizer.features)[0]

    def scores(self, raw: np.ndarray, mask: np.ndarray) -> np.ndarray:
        """raw [decisions, slots, features], mask [decisions, slots] -> masked scores."""
        n, slots, width = raw.shape
        s = self.logits(raw.reshape(n * slots, width)).reshape(n, slots)
        return np.where(mask.astype(bool), s, -np.inf)

    def __call__(self, obs: Observation) -> int:
        raw = self.raw_features(obs)
        mask = obs.features[self.mask_feature].reshape(1, -1)
        s = self.scores(raw[None], mask)[0]
        if self.temperature <= 0:
            return int(np.argmax(s))
        z = s / self.temperature
        p = np.exp(z - z.max())
        return int(self._rng.choice(len(p), p=p / p.sum()))


_KINDS: dict[str, type[MLPPolicy]] = {"mlp": MLPPolicy, "candidate": CandidatePolicy}
