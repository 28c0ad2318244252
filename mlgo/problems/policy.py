"""A learned policy: a small MLP over LLVM's features, read through its normalizer
(mlgo.problems.normalizer), that answers a problem's decisions; with a departure gate it
follows the compiler's own answer unless confident, and it may answer some languages only.
Its files are mlgo.problems.policy_files.

Rollouts evaluate the policy in numpy (tens of microseconds a decision, no TensorFlow in
the compile workers); trainers and the exported SavedModel use the same weights in TF.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import ClassVar

import numpy as np

from mlgo.llvm.languages import label
from mlgo.llvm.log_format import FeatureView, Observation
from mlgo.problems import Problem
from mlgo.problems.normalizer import Normalizer
from mlgo.problems.profile_inputs import PROFILE_INPUTS, feature_column, reads_profile
from mlgo.records import Decisions

# The logit of an answer a mask rules out: no sample reaches it, and no NaN either.
MASKED = -1e9


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
    # Served only under this guard (mlgo.serve.guard.GUARDS), whatever MLGO_GUARD says: a
    # policy shipped because it was judged so (a link-time one that alone grows some
    # programs). None: as the user's environment says.
    guard: str | None = None
    # Its problem's `base_switch` at this value wherever it is served (inlining-speed:
    # clang's inline threshold): the heuristic it departs from. None: clang's own.
    base: int | None = None

    def __post_init__(self) -> None:
        self._rng = np.random.default_rng(self.seed)

    @property
    def base_flags(self) -> list[str]:
        """The flags that give the compiler its base (none without one)."""
        if self.base is None:
            return []
        return ["-mllvm", f"{self.problem.base_switch}={self.base}"]

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

    def input_rows(self, names: Sequence[str]) -> np.ndarray:
        """The first layer's rows that read the inputs NAMES: (q, sqrt q, q^2) of each."""
        norm = self.normalizer
        columns = [norm.features.index(n) for n in names]
        return np.array([block * norm.columns + c for block in range(3) for c in columns], int)

    def with_profile_inputs(self) -> MLPPolicy:
        """This policy with the profile's inputs (`profile_inputs`) after LLVM's features,
        each at zero weight: the same answers everywhere, and a network that a search can
        teach to read them. A policy that reads them already is returned as it is."""
        norm = self.normalizer
        if reads_profile(norm.features):
            return self
        added = [np.asarray(p.boundaries, np.float64) for p in PROFILE_INPUTS.values()]
        n = len(norm.features)
        wider = replace(
            self,
            normalizer=replace(
                norm,
                features=(*norm.features, *PROFILE_INPUTS),
                quantiles=[*norm.quantiles[:n], *added, *norm.quantiles[n:]],
            ),
        )
        first = self.weights[0]
        read = np.ones(wider.normalizer.width, bool)
        read[wider.input_rows(tuple(PROFILE_INPUTS))] = False
        widened = np.zeros((len(read), first.shape[1]), first.dtype)
        widened[read] = first
        return replace(wider, weights=[widened, *self.weights[1:]])

    def deaf_to(self, names: Sequence[str]) -> MLPPolicy:
        """This policy with the inputs NAMES at zero weight: what it decides without them
        (a search's use of an input, measured by taking it away)."""
        first = self.weights[0].copy()
        first[self.input_rows(names)] = 0.0
        return replace(self, weights=[first, *self.weights[1:]])

    def describe(self) -> str:
        """The network's shape in a sentence, for the model card."""
        layers = " -> ".join(str(w.shape[0]) for w in self.weights[::2])
        layers += f" -> {self.weights[-1].shape[0]}"
        out = f"An MLP ({layers}) over LLVM's {len(self.normalizer.features)} features. "
        elements = [t for t, i in self.normalizer.reads if i is not None]
        if elements:
            vectors = sorted(set(elements))
            out += (
                f"{len(elements)} of them are the elements of {' and '.join(vectors)}, IR2Vec "
                f"embeddings from the vocabulary of digest {self.problem.feature_digest}. "
            )
        if self.departure_threshold is not None:
            out += (
                "It departs from the compiler's own decision only where it gives the other "
                f"answer a probability of at least {self.departure_threshold:g}. "
            )
        if self.base is not None:
            out += (
                f"The compiler's own decision is made with {self.problem.base_switch}="
                f"{self.base} (`-mllvm`), which every use of it must pass. "
            )
        if self.languages is not None:
            names = " and ".join(label(x) for x in self.languages)
            out += f"It answers {names} compiles only; the others keep the compiler's own. "
        if self.guard == "size":
            out += (
                "It is served guarded: each output it decides (a file's object only where "
                "it departed) is made again with the compiler's own decisions and the one "
                "with less .text kept. "
            )
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
        reads, sent = self.normalizer.reads, obs.features
        if isinstance(sent, FeatureView) and (gathered := sent.gather(reads)) is not None:
            return gathered
        values = (
            sent[t].reshape(-1)[i or 0] if t in sent or t not in PROFILE_INPUTS
            else PROFILE_INPUTS[t].unknown
            for t, i in reads
        )  # fmt: skip
        return np.fromiter(values, np.float64, len(reads))

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
        return np.stack([feature_column(features, f, n) for f in names], 1)

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


def policy_class(problem: Problem) -> type[MLPPolicy]:
    """The network that decides PROBLEM, by the kind it names: MLPPolicy, or the subclass
    that defines that kind in the problem's own module (imported with the problem)."""
    shapes = {c.kind: c for c in MLPPolicy.__subclasses__() if "kind" in vars(c)}
    return {**shapes, MLPPolicy.kind: MLPPolicy}[problem.policy_kind]
