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
from mlgo.runtime.inputs import read_json, read_named_arrays
from mlgo.runtime.tfutil import import_tf

# No checkpoint holds more numbers than this (1 GiB of float64), whatever its run's size: a
# run's own bound (`Session`'s, BC's) is lower still.
MAX_CHECKPOINT_NUMBERS = 1 << 27
# The copies of its weights a checkpoint holds (besides BC-Max's one per module): the best,
# the current, and Adam's two moments.
CHECKPOINT_COPIES = 4


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

    def load_state(
        self, max_values: int = MAX_CHECKPOINT_NUMBERS
    ) -> tuple[RunState, dict[str, np.ndarray]] | None:
        """The last checkpoint, or None for a fresh run. Its arrays are read only if they
        hold at most MAX_VALUES numbers (what this run can have saved): anything else in
        the run directory, a FIFO, a file that is not an archive or one whose headers ask
        for gigabytes, is one line naming it."""
        state_path, ckpt = self.root / "state.json", self.root / "checkpoint.npz"
        if not (state_path.exists() and ckpt.exists()):
            return None
        d = read_json(state_path)
        if not isinstance(d, dict) or d.get("algo") != self.algo:
            algo = d.get("algo") if isinstance(d, dict) else None
            raise UsageError(f"{self.root} holds a {algo} run, not {self.algo}")
        try:
            state = RunState(**d)
        except TypeError as e:
            raise UsageError(f"{state_path}: not a run's state ({e})") from e
        return state, read_named_arrays(ckpt, min(max_values, MAX_CHECKPOINT_NUMBERS))

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
