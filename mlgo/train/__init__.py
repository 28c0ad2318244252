"""What every trainer shares: the run directory, checkpoints, TensorBoard scalars, and the
training data. A run directory holds:

    OUT/policy/          the current best policy (policy.npz, normalization.json, policy.json)
    OUT/checkpoint.npz   the trainer's full state, rewritten atomically every step
    OUT/state.json       step, budget spent, history; a rerun resumes from here
    OUT/tb/              TensorBoard scalars
    OUT/traces/          default traces of the training corpus (collected once)
"""

from __future__ import annotations

import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlgo.errors import UsageError
from mlgo.problems.policy import MLPPolicy
from mlgo.runtime.files import atomic_path, atomic_write_text
from mlgo.runtime.inputs import read_json
from mlgo.runtime.tfutil import import_tf


@dataclass
class RunState:
    algo: str
    step: int = 0
    compiles: int = 0
    seconds: float = 0.0
    history: list[dict] = field(default_factory=list)
    extra: dict = field(default_factory=dict)


@dataclass
class Outcome:
    """What a trainer hands back: its policy, and what it reports about the run."""

    policy: MLPPolicy
    state: RunState | None = None  # ES, PPO, BC-Max: the run's steps, seconds and history
    accuracy: dict[str, float] = field(default_factory=dict)  # BC, on the default's decisions
    decisions: int = 0  # BC: default decisions it learned from
    left_out: int = 0  # BC: modules whose default traces failed to compile


def policy_dir(path: Path) -> Path:
    """A run directory or its policy/ directory."""
    return path / "policy" if (path / "policy" / "policy.json").exists() else path


class RunDir:
    def __init__(self, root: Path, algo: str):
        self.root = root
        self.algo = algo
        root.mkdir(parents=True, exist_ok=True)
        self._tb = None

    @property
    def policy_dir(self) -> Path:
        return self.root / "policy"

    @property
    def traces_dir(self) -> Path:
        return self.root / "traces"

    def load_state(self) -> tuple[RunState, dict[str, np.ndarray]] | None:
        """The last checkpoint, or None for a fresh run."""
        state_path, ckpt = self.root / "state.json", self.root / "checkpoint.npz"
        if not (state_path.exists() and ckpt.exists()):
            return None
        d = read_json(state_path)
        if d.get("algo") != self.algo:
            raise UsageError(f"{self.root} holds a {d.get('algo')} run, not {self.algo}")
        with np.load(ckpt) as z:
            arrays = {k: z[k] for k in z.files}
        return RunState(**d), arrays

    def save_state(self, state: RunState, arrays: dict[str, np.ndarray]) -> None:
        """Checkpoint first, then state: a kill between the two replays one step at most."""
        with atomic_path(self.root / "checkpoint.npz") as tmp, open(tmp, "wb") as f:
            np.savez(f, **arrays)
        atomic_write_text(self.root / "state.json", json.dumps(state.__dict__, indent=1))

    def scalars(self, step: int, values: dict[str, float]) -> None:
        tf = import_tf()
        if self._tb is None:
            self._tb = tf.summary.create_file_writer(str(self.root / "tb"))
        with self._tb.as_default(step=step):
            for k, v in values.items():
                tf.summary.scalar(k, v)
        self._tb.flush()


class Adam:
    """optax's Adam on a flat parameter vector, for every trainer that steps one (BC, ES);
    its moments checkpoint with the run as numpy arrays under the keys they always had."""

    def __init__(self, size: int, lr: float, b1: float = 0.9, b2: float = 0.999):
        import optax

        # JAX warns at every fork once it runs; the trainers fork only to exec (compilers,
        # spawned worker pools), which is safe.
        warnings.filterwarnings("ignore", r"os\.fork\(\) was called", RuntimeWarning)
        self._optax = optax
        self._adam = optax.adam(lr, b1, b2, eps=1e-8)
        self._state = self._adam.init(np.zeros(size, np.float32))

    def step(self, theta: np.ndarray, grad: np.ndarray) -> np.ndarray:
        """One ascent step along `grad` (a gradient of something to maximise)."""
        updates, self._state = self._adam.update(-grad, self._state)  # optax descends
        return theta + np.asarray(updates, theta.dtype)

    def state(self) -> dict[str, np.ndarray]:
        get = self._optax.tree_utils.tree_get
        return {
            "adam_m": np.asarray(get(self._state, "mu")),
            "adam_v": np.asarray(get(self._state, "nu")),
            "adam_t": np.asarray(get(self._state, "count")),
        }

    def restore(self, arrays: dict[str, np.ndarray]) -> None:
        self._state = self._optax.tree_utils.tree_set(
            self._state,
            mu=np.asarray(arrays["adam_m"], np.float32),
            nu=np.asarray(arrays["adam_v"], np.float32),
            count=np.asarray(arrays["adam_t"], np.int32),
        )
