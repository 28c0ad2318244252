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
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlgo.fsutil import atomic_path, atomic_write_text
from mlgo.log_format import Observation

QUANTILES = 256


@dataclass
class Normalizer:
    features: tuple[str, ...]
    quantiles: list[np.ndarray]  # per feature, sorted distinct boundary values

    @classmethod
    def fit(cls, features: Sequence[str], values: np.ndarray, n: int = QUANTILES) -> Normalizer:
        """values: [samples, features] raw feature values from the training traces."""
        qs = []
        for j in range(values.shape[1]):
            column = values[:, j].astype(np.float64)
            qs.append(np.unique(np.quantile(column, np.linspace(0, 1, n + 1))))
        return cls(tuple(features), qs)

    @property
    def width(self) -> int:
        return 3 * len(self.features)

    def transform(self, values: np.ndarray) -> np.ndarray:
        """[n, features] raw -> [n, 3 * features] float32."""
        values = np.atleast_2d(values)
        out = np.empty((values.shape[0], self.width), np.float32)
        f = len(self.features)
        for j, q in enumerate(self.quantiles):
            frac = np.searchsorted(q, values[:, j], side="right") / max(len(q), 1)
            out[:, j] = frac
            out[:, f + j] = np.sqrt(frac)
            out[:, 2 * f + j] = frac * frac
        return out

    def to_json(self) -> dict:
        return {"features": list(self.features), "quantiles": [q.tolist() for q in self.quantiles]}

    @classmethod
    def from_json(cls, d: dict) -> Normalizer:
        return cls(tuple(d["features"]), [np.asarray(q, np.float64) for q in d["quantiles"]])


@dataclass
class MLPPolicy:
    """logits = MLP(normalize(features)); action = argmax (or a sample, when exploring)."""

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
        return MLPPolicy(self.problem, self.normalizer, weights, self.temperature, self.seed)

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
                    "kind": "mlp",
                    "layers": [list(w.shape) for w in self.weights[::2]],
                },
                indent=1,
            ),
        )

    @classmethod
    def load(cls, directory: Path) -> MLPPolicy:
        try:
            meta = json.loads((directory / "policy.json").read_text())
            norm = Normalizer.from_json(json.loads((directory / "normalization.json").read_text()))
            with np.load(directory / "policy.npz") as z:
                weights = [z[f"arr_{i}"] for i in range(len(z.files))]
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{directory}: not a policy ({e})") from e
        return cls(meta["problem"], norm, weights)
