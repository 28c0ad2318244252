"""Where mlgo's shipped data is: the package recipes and the trained policies.

One place decides, so that an installed mlgo (`pip install .`, not only an editable
checkout) finds them. In order:
- `$MLGO_DATA`, a directory holding `recipes/`, `splits.toml` and `policies/` (your own,
  or a copy);
- the package's own `mlgo/_data/`: in a checkout, links to `corpus/recipes`,
  `corpus/splits.toml` and `policies/`; in an installed package, the copies the build
  put there.
Standard library only: `mlgo-cc` imports this on every compiler invocation.
"""

from __future__ import annotations

import os
from pathlib import Path


def data_dir() -> Path:
    """The directory holding `recipes/` and `policies/`."""
    override = os.environ.get("MLGO_DATA")
    return Path(override) if override else Path(__file__).resolve().parent / "_data"


def recipes_dir() -> Path:
    """The package recipes (one TOML file each) that `mlgo corpus build` knows by name."""
    return data_dir() / "recipes"


def shipped_policy(name: str) -> Path:
    """The trained policy shipped as NAME: a problem's own (e.g. inlining-size), or another
    of it (inlining-size-guarded)."""
    return data_dir() / "policies" / name


def ir2vec_vocabulary() -> Path:
    """The IR2Vec vocabulary that inlining-size-ir2vec's features are computed with: the
    package's own whatever MLGO_DATA says, as the problem's features are."""
    return Path(__file__).resolve().parent / "_data" / "ir2vec-vocabulary.json"


# What a service serves unless told otherwise: per-file inlining for size and the link-time
# policy at full-LTO links, both served guarded (policies/*/MODEL_CARD.md say why each ships).
# policies/inlining-size, gated and unguarded (no second compile), is the one to name for
# a cheaper build, and the start `mlgo tune` trains from.
SERVED_BY_DEFAULT = ("inlining-size-guarded", "inlining-size-link")


def default_policies() -> list[Path]:
    return [shipped_policy(name) for name in SERVED_BY_DEFAULT]
