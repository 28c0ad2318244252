"""A learned policy: per-feature quantile normalization and a small MLP over LLVM's features.

Normalization follows MLGO's idea and is learned from the training traces: each raw
feature value becomes its quantile q in [0, 1] among the values seen in training, given
to the network as (q, sqrt q, q^2) so that both small and large values are resolved.
The quantiles are stored with the policy, so a policy takes raw compiler features.

Rollouts evaluate the policy in numpy (tens of microseconds a decision, no TensorFlow in
the compile workers); trainers and the exported SavedModel use the same weights in TF.
"""

from __future__ import annotations

import hashlib
import json
import zipfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar, TypeVar

import numpy as np

from mlgo.errors import MlgoError, UsageError
from mlgo.llvm.languages import LANGUAGES, label
from mlgo.llvm.log_format import Observation
from mlgo.problems import SELF, Derived, Problem, get_problem
from mlgo.records import Decisions
from mlgo.runtime.files import atomic_path, atomic_write_text

T = TypeVar("T")
QUANTILES = 256
# The logit of an answer a mask rules out: no sample reaches it, and no NaN either.
MASKED = -1e9


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

    kind: ClassVar[str] = "mlp"  # policy.json's name for the shape
    hidden: ClassVar[tuple[int, ...]] = (64, 32)  # the hidden layers of a fresh policy
    mask_feature: ClassVar[str | None] = None  # the feature that rules answers out, if any
    outputs: ClassVar[int] = 2  # the network's outputs: a logit per answer (no, yes)
    problem: Problem
    normalizer: Normalizer
    weights: list[np.ndarray] = field(default_factory=list)  # W0, b0, W1, b1, ...
    temperature: float = 0.0  # 0: greedy; > 0: sample from softmax(logits / T)
    seed: int | None = None
    # Follow the compiler's own answer unless the policy gives the other one at least
    # this probability (None: no gate, argmax). Set by `mlgo calibrate`, saved with it.
    departure_threshold: float | None = None
    # The languages (mlgo.llvm.languages) whose compiles it answers; None: all. Set by
    # `mlgo calibrate` where a language's validation packages grow at every threshold.
    languages: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    @classmethod
    def init(
        cls,
        problem: Problem,
        normalizer: Normalizer,
        hidden: Sequence[int] | None = None,
        seed: int = 0,
    ) -> MLPPolicy:
        rng = np.random.default_rng(seed)
        sizes = [normalizer.width, *(hidden or cls.hidden), cls.outputs]
        weights: list[np.ndarray] = []
        for a, b in zip(sizes[:-1], sizes[1:], strict=True):
            weights.append((rng.standard_normal((a, b)) * np.sqrt(2.0 / a)).astype(np.float32))
            weights.append(np.zeros(b, np.float32))
        return cls(problem, normalizer, weights)

    @classmethod
    def for_cloning(
        cls, problem: Problem, data: Decisions, seed: int = 0, derived: bool = False
    ) -> tuple[MLPPolicy, np.ndarray, np.ndarray, np.ndarray]:
        """A fresh policy normalized on traced decisions, for behavioral cloning: the
        policy, its network input rows (here one per decision), each decision's weight in
        the loss and the logit offsets of its answers. Rare answers weigh as much in total
        as common ones; the problem's derived inputs only with `derived`."""
        normalizer = Normalizer.fit(data.features, data.x, problem.derived if derived else ())
        policy = cls.init(problem, normalizer, seed=seed)
        return policy, *policy.cloning_inputs(data)

    def cloning_inputs(self, data: Decisions) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What `for_cloning` gives besides the policy, with this policy's own
        normalization: a warm start (BC-Max) clones new decisions into it."""
        actions = self.weights[-1].shape[0]
        freq = np.bincount(data.default, minlength=actions) / len(data.default)
        weight = (1 / actions / np.maximum(freq, 1e-6))[data.default].astype(np.float32)
        x = self.normalizer.transform(data.x)
        return x, weight, np.zeros((len(x), actions), np.float32)

    def describe(self) -> str:
        """The network's shape in a sentence, for the model card."""
        layers = " -> ".join(str(w.shape[0]) for w in self.weights[::2])
        layers += f" -> {self.weights[-1].shape[0]}"
        out = f"An MLP ({layers}) over LLVM's {len(self.normalizer.features)} features. "
        if self.departure_threshold is not None:
            out += (
                "It departs from the compiler's own decision only where it gives the other "
                f"answer a probability of at least {self.departure_threshold:g}. "
            )
        if self.languages is not None:
            names = " and ".join(label(x) for x in self.languages)
            out += f"It answers {names} compiles only; the others keep the compiler's own. "
        return out

    @property
    def classes(self) -> range:
        """The answers that are classes of their own (each gets a recall in BC's metrics)."""
        return range(self.weights[-1].shape[0])

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
        scores = self.logits(self.raw_features(obs))[0]
        if self.departure_threshold is None:
            return self.pick(scores)
        return int(self.gate(scores[None, :], np.array([self.problem.default_advice(obs)]))[0])

    @property
    def can_gate(self) -> bool:
        """A yes/no decision whose default the compiler sends: a departure gate applies."""
        return self.problem.default_is_observed and self.outputs == 2

    @property
    def departure_margin(self) -> np.float32:
        """The gate as a logit difference: p(other) >= t is logit(other) - logit(default)
        >= log(t / (1 - t)). Every backend compares in float32 against this one number."""
        t = self.departure_threshold
        if t is None:
            raise ValueError("the policy has no departure gate")
        with np.errstate(divide="ignore"):
            return np.float32(np.log(np.float64(t)) - np.log1p(-np.float64(t)))

    def gate(self, logits: np.ndarray, default: np.ndarray) -> np.ndarray:
        """[n, 2] logits and the compiler's [n] answers -> the gated [n] answers."""
        rows = np.arange(len(default))
        other = 1 - default
        margin = logits[rows, other] - logits[rows, default]
        return np.where(margin >= self.departure_margin, other, default)

    def pick(self, scores: np.ndarray, rng: np.random.Generator | None = None) -> int:
        """The best answer, or a sample from softmax(scores / T) when exploring (drawn
        from RNG if given, else from the policy's own stream)."""
        if self.temperature <= 0:
            return int(np.argmax(scores))
        z = scores / self.temperature
        p = np.exp(z - z.max())
        return int((rng or self._rng).choice(len(p), p=p / p.sum()))

    def predict(self, raw: np.ndarray) -> np.ndarray:
        """Greedy answers for traced decisions (`Decisions.x`: LLVM's features as rows)."""
        return np.argmax(self.logits(raw), 1)

    def decision_rows(self, features: dict[str, np.ndarray], n: int) -> np.ndarray:
        """A compile's N decisions (LLVM's features, each [n, ...]) as the policy's raw
        input rows: [n, features]."""
        names = self.normalizer.features
        if n == 0:
            return np.zeros((0, len(names)))
        return np.stack([features[f].reshape(n, -1)[:, 0] for f in names], 1)

    @property
    def observation_shape(self) -> tuple[int, ...]:
        """The shape of one decision's network input in `observations`."""
        return (self.normalizer.width,)

    def observations(self, x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Raw rows (`decision_rows`) as network inputs, and the policy's logits on them."""
        return self.normalizer.transform(x), self.logits(x)

    # -- parameters as one vector (evolution strategies) -------------------------------
    def flat(self) -> np.ndarray:
        return np.concatenate([w.reshape(-1) for w in self.weights]).astype(np.float32)

    def with_flat(self, theta: np.ndarray) -> MLPPolicy:
        weights, i = [], 0
        for w in self.weights:
            weights.append(theta[i : i + w.size].reshape(w.shape).astype(np.float32))
            i += w.size
        return replace(self, weights=weights)

    def fingerprint(self) -> str:
        """A digest of everything that decides the policy's answers (a built server's key)."""
        h = hashlib.sha256(f"{self.kind}\0{self.problem.name}\0".encode())
        h.update(json.dumps([self.normalizer.to_json(), self.departure_threshold]).encode())
        for w in self.weights:
            h.update(f"{w.dtype}{w.shape}".encode() + np.ascontiguousarray(w).tobytes())
        return h.hexdigest()

    # -- storage -----------------------------------------------------------------------
    def save(self, directory: Path) -> None:
        """policy.npz + normalization.json + policy.json, each written atomically."""
        directory.mkdir(parents=True, exist_ok=True)
        with atomic_path(directory / "policy.npz") as tmp, open(tmp, "wb") as f:
            np.savez(f, *self.weights)
        atomic_write_text(directory / "normalization.json", json.dumps(self.normalizer.to_json()))
        meta = {
            "problem": self.problem.name,
            "kind": self.kind,
            "layers": [list(w.shape) for w in self.weights[::2]],
        }
        if self.departure_threshold is not None:
            meta["departure_threshold"] = self.departure_threshold
        if self.languages is not None:
            meta["languages"] = list(self.languages)
        atomic_write_text(directory / "policy.json", json.dumps(meta, indent=1))

    @classmethod
    def load(cls, directory: Path) -> MLPPolicy:
        """The policy of the problem policy.json names, in that problem's policy class,
        checked whole (see `check`): a truncated, corrupt or diverged policy is one line
        naming its file, never a traceback or a served NaN."""
        meta = _read(directory / "policy.json", lambda p: json.loads(p.read_text()))
        norm = _read(
            directory / "normalization.json",
            lambda p: Normalizer.from_json(json.loads(p.read_text())),
        )
        weights = _read(directory / "policy.npz", _read_weights)
        where = directory / "policy.json"
        try:
            problem = get_problem(meta["problem"])
        except (KeyError, TypeError, UsageError) as e:
            raise PolicyError(f"{where}: not a policy ({e})") from e
        kind = policy_class(problem)
        if meta.get("kind", "mlp") != kind.kind:
            raise PolicyError(f"{where}: a {meta.get('kind', 'mlp')} policy for {problem.name}")
        languages = meta.get("languages")
        if languages is not None:
            if not isinstance(languages, list) or not all(x in LANGUAGES for x in languages):
                raise PolicyError(f"{where}: languages {languages!r} are not some of {LANGUAGES}")
            if not languages:
                raise PolicyError(f"{where}: languages is empty: the policy would answer nothing")
            languages = tuple(x for x in LANGUAGES if x in languages)
        policy = kind(
            problem,
            norm,
            weights,
            departure_threshold=meta.get("departure_threshold"),
            languages=languages,
        )
        policy.check(directory)
        return policy

    def check(self, directory: Path) -> None:
        """Raises a PolicyError naming the file in DIRECTORY that does not hold up: a
        feature that is not one of the problem's (names reach generated code), layers
        that do not chain from the normalizer's width, weights that are not all finite,
        boundaries the normalizer cannot search (NaN may only trail: an old policy keeps
        its NaN boundaries and both numpy and the exported graph count them exactly), a
        departure threshold outside [0.5, 1] or where there is no default to gate on."""
        npz, norm = directory / "policy.npz", directory / "normalization.json"
        t = self.departure_threshold
        if t is not None:
            meta = directory / "policy.json"
            if isinstance(t, bool) or not isinstance(t, int | float) or not 0.5 <= t <= 1:
                raise PolicyError(f"{meta}: departure_threshold {t!r} is not in [0.5, 1]")
            if not self.can_gate:
                raise PolicyError(f"{meta}: {self.problem.name} has no default to gate on")
        n = self.normalizer
        if len(set(n.features)) != len(n.features):
            raise PolicyError(f"{norm}: a feature is listed twice")
        known = self.problem.input_names
        for name in n.features:
            if name not in known:
                raise PolicyError(f"{norm}: {name!r} is not a {self.problem.name} feature")
        for d in n.derived:
            if not (isinstance(d.name, str) and d.name.isidentifier() and d.name.isascii()):
                raise PolicyError(f"{norm}: derived feature name {d.name!r} is not a plain name")
            if not {d.left, d.right} <= set(n.features):
                raise PolicyError(f"{norm}: derived {d.name} uses an unknown feature")
        if len(n.quantiles) != n.columns:
            raise PolicyError(f"{norm}: {len(n.quantiles)} boundary lists for {n.columns} columns")
        for j, q in enumerate(n.quantiles):
            finite = q[~np.isnan(q)]
            if q.ndim != 1 or not q.size or np.isnan(q[: finite.size]).any():
                raise PolicyError(f"{norm}: column {j} boundaries are empty or not a list")
            if (np.diff(finite) < 0).any():
                raise PolicyError(f"{norm}: column {j} boundaries are not sorted")
        if not self.weights or len(self.weights) % 2:
            raise PolicyError(f"{npz}: {len(self.weights)} arrays, not weight and bias pairs")
        width = n.width
        for i, (w, b) in enumerate(zip(self.weights[::2], self.weights[1::2], strict=True)):
            if w.ndim != 2 or w.shape[0] != width or b.shape != (w.shape[1],):
                raise PolicyError(
                    f"{npz}: layer {i} is {w.shape} + {b.shape}, expected ({width}, k) + (k,)"
                )
            if not (np.isfinite(w).all() and np.isfinite(b).all()):
                raise PolicyError(f"{npz}: layer {i} holds NaN or infinite weights")
            width = w.shape[1]


def policy_class(problem: Problem) -> type[MLPPolicy]:
    """The network that decides PROBLEM, by the kind it names: MLPPolicy, or the subclass
    that defines that kind in the problem's own module (imported with the problem)."""
    shapes = {c.kind: c for c in MLPPolicy.__subclasses__() if "kind" in vars(c)}
    return {**shapes, MLPPolicy.kind: MLPPolicy}[problem.policy_kind]


class PolicyError(MlgoError, ValueError):
    """A policy on disk does not hold up; the message is one line naming the file."""


def _read(path: Path, parse: Callable[[Path], T]) -> T:
    try:
        return parse(path)
    except FileNotFoundError as e:
        raise PolicyError(f"{path}: missing (not a policy directory)") from e
    except (OSError, ValueError, KeyError, TypeError, EOFError, zipfile.BadZipFile) as e:
        raise PolicyError(f"{path}: not a policy ({type(e).__name__}: {e})") from e


def _read_weights(path: Path) -> list[np.ndarray]:
    with np.load(path) as z:
        weights = [z[f"arr_{i}"] for i in range(len(z.files))]
    if not all(np.issubdtype(w.dtype, np.floating) for w in weights):
        raise ValueError("weights are not floating point")
    return weights
