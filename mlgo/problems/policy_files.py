"""A policy's files: policy.npz (the weights), normalization.json (how it reads LLVM's
features) and policy.json (its problem, shape, departure gate and languages). Each is
written atomically; a policy is read and checked whole, since policies are data that people
send each other: a truncated, corrupt, diverged or crafted one is one line naming its file.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

import numpy as np

from mlgo.errors import MlgoError, UsageError
from mlgo.llvm.cmdline import GUARDS
from mlgo.llvm.languages import LANGUAGES
from mlgo.problems import get_problem
from mlgo.problems.normalizer import Normalizer
from mlgo.problems.policy import MLPPolicy, policy_class
from mlgo.runtime.files import atomic_path, atomic_write_text
from mlgo.runtime.inputs import read_arrays, read_json

T = TypeVar("T")
# The largest base a policy may carry: its switch's value reaches the compiler's command
# line, and clang's thresholds live far below it
MAX_BASE = 1_000_000
# The most weights and biases a policy may hold, counted from the arrays' headers before any
# is read. The plugin build writes each into a C++ header: a crafted 66 MB policy made it
# take 5.2 GB. The largest policy `mlgo train` makes holds 15,650 (inlining-size-ir2vec's;
# the shipped ones 9,506 at most), and its plugin builds in 6.7 s and 106 MB; at this bound,
# 16 times that, in 10.6 s and 116 MB (a million: 26 s and 347 MB).
MAX_PARAMETERS = 250_000
# The largest policy.json (a few fields) and normalization.json (at most 256 boundaries a
# column: under 0.5 MB for inlining-size-ir2vec's 70 columns; the shipped ones' 10 to 40 KB).
MAX_META_BYTES = 64 << 10
MAX_NORMALIZATION_BYTES = 4 << 20


def save_policy(policy: MLPPolicy, directory: Path) -> None:
    """policy.npz + normalization.json + policy.json, each written atomically."""
    directory.mkdir(parents=True, exist_ok=True)
    with atomic_path(directory / "policy.npz") as tmp, open(tmp, "wb") as f:
        np.savez(f, *policy.weights)
    atomic_write_text(directory / "normalization.json", json.dumps(policy.normalizer.to_json()))
    meta = {
        "problem": policy.problem.name,
        "kind": policy.kind,
        "layers": [list(w.shape) for w in policy.weights[::2]],
    }
    if policy.departure_threshold is not None:
        meta["departure_threshold"] = policy.departure_threshold
    if policy.languages is not None:
        meta["languages"] = list(policy.languages)
    if policy.guard is not None:
        meta["guard"] = policy.guard
    if policy.base is not None:
        meta["base"] = policy.base
    if policy.problem.feature_digest is not None:
        meta["feature_digest"] = policy.problem.feature_digest
    atomic_write_text(directory / "policy.json", json.dumps(meta, indent=1))


def load_policy(directory: Path) -> MLPPolicy:
    """The policy of the problem policy.json names, in that problem's policy class,
    checked whole (see `check_policy`): a truncated, corrupt or diverged policy is one line
    naming its file, never a traceback or a served NaN."""
    meta = _read(directory / "policy.json", lambda p: read_json(p, PolicyError, MAX_META_BYTES))
    norm = _read(
        directory / "normalization.json",
        lambda p: Normalizer.from_json(read_json(p, PolicyError, MAX_NORMALIZATION_BYTES)),
    )
    weights = _read(directory / "policy.npz", lambda p: read_arrays(p, MAX_PARAMETERS, PolicyError))
    where = directory / "policy.json"
    try:
        problem = get_problem(meta["problem"])
    except (KeyError, TypeError, UsageError) as e:
        raise PolicyError(f"{where}: not a policy ({e})") from e
    if why := problem.other_features(meta.get("feature_digest")):
        raise PolicyError(f"{where}: {why}")
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
    guard = meta.get("guard")
    if guard is not None and guard not in GUARDS:
        raise PolicyError(f"{where}: guard {guard!r} is not one of: {', '.join(GUARDS)}")
    policy = kind(
        problem,
        norm,
        weights,
        departure_threshold=meta.get("departure_threshold"),
        languages=languages,
        guard=guard,
        base=meta.get("base"),
    )
    check_policy(policy, directory)
    return policy


def check_policy(policy: MLPPolicy, directory: Path) -> None:
    """Raises a PolicyError naming the file in DIRECTORY that does not hold up: a
    feature that is not one of the problem's (names reach generated code), layers
    that do not chain from the normalizer's width, weights that are not all finite,
    boundaries the normalizer cannot search (NaN may only trail: an old policy keeps
    its NaN boundaries and both numpy and the exported graph count them exactly), a
    departure threshold outside [0.5, 1] or where there is no default to gate on, a base
    that is not a small whole number or for a problem without one."""
    npz, norm = directory / "policy.npz", directory / "normalization.json"
    t = policy.departure_threshold
    if t is not None:
        meta = directory / "policy.json"
        if isinstance(t, bool) or not isinstance(t, int | float) or not 0.5 <= t <= 1:
            raise PolicyError(f"{meta}: departure_threshold {t!r} is not in [0.5, 1]")
        if not policy.can_gate:
            raise PolicyError(f"{meta}: {policy.problem.name} has no default to gate on")
    b = policy.base
    if b is not None:
        meta = directory / "policy.json"
        switch = policy.problem.base_switch
        if switch is None:
            raise PolicyError(f"{meta}: {policy.problem.name} has no base to set")
        if isinstance(b, bool) or not isinstance(b, int) or not 0 <= b <= MAX_BASE:
            raise PolicyError(f"{meta}: base {b!r} ({switch}) is not an integer in [0, {MAX_BASE}]")
    n = policy.normalizer
    if len(set(n.features)) != len(n.features):
        raise PolicyError(f"{norm}: a feature is listed twice")
    known = policy.problem.input_names
    for name in n.features:
        if name not in known:
            raise PolicyError(f"{norm}: {name!r} is not a {policy.problem.name} feature")
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
    if not policy.weights or len(policy.weights) % 2:
        raise PolicyError(f"{npz}: {len(policy.weights)} arrays, not weight and bias pairs")
    width = n.width
    for i, (w, b) in enumerate(zip(policy.weights[::2], policy.weights[1::2], strict=True)):
        if w.ndim != 2 or w.shape[0] != width or b.shape != (w.shape[1],):
            raise PolicyError(
                f"{npz}: layer {i} is {w.shape} + {b.shape}, expected ({width}, k) + (k,)"
            )
        if not (np.isfinite(w).all() and np.isfinite(b).all()):
            raise PolicyError(f"{npz}: layer {i} holds NaN or infinite weights")
        width = w.shape[1]


class PolicyError(MlgoError, ValueError):
    """A policy on disk does not hold up; the message is one line naming the file."""


def _read(path: Path, parse: Callable[[Path], T]) -> T:
    try:
        return parse(path)
    except FileNotFoundError as e:
        raise PolicyError(f"{path}: missing (not a policy directory)") from e
    except PolicyError:  # read_json's and read_arrays': one line naming PATH already
        raise
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise PolicyError(f"{path}: not a policy ({type(e).__name__}: {e})") from e
