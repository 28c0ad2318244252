"""The package-level splits of the corpus, written down before any training.

`corpus/splits.toml` names each recipe once, under `train`, `validation` or `test`, with its
language and domain. Every choice (runs, checkpoints, hyperparameters, features) is made on
`validation`; `test` is evaluated once, for the policy that ships.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from pathlib import Path

from mlgo import data as shipped
from mlgo.errors import UsageError
from mlgo.runtime.commands import BuildError

SPLITS = ("train", "validation", "test")
LANGUAGES = ("C", "C++")


@dataclass(frozen=True)
class Package:
    name: str
    split: str
    language: str
    domain: str


def splits_file() -> Path:
    return shipped.data_dir() / "splits.toml"


def load_splits(path: Path | None = None) -> dict[str, list[Package]]:
    """Each split's packages, in the file's order; a malformed file is one-line BuildError."""
    path = path or splits_file()
    try:
        d = tomllib.loads(path.read_text())
        out = {s: [_package(n, s, v) for n, v in d[s].items()] for s in SPLITS}
    except (OSError, ValueError, RecursionError, KeyError, TypeError, AttributeError) as e:
        raise BuildError(f"{path}: bad splits file ({e})") from e
    if unknown := set(d) - set(SPLITS):
        raise BuildError(f"{path}: bad splits file (unknown split {', '.join(sorted(unknown))})")
    return out


def _package(name: str, split: str, v: dict) -> Package:
    if v["language"] not in LANGUAGES:
        raise UsageError(f"{name}: language {v['language']!r} is not one of {LANGUAGES}")
    return Package(name, split, v["language"], str(v["domain"]))


def split_packages(split: str, path: Path | None = None) -> list[str]:
    """The recipe names of SPLIT (train, validation or test)."""
    if split not in SPLITS:
        raise BuildError(f"no split {split!r} (have: {', '.join(SPLITS)})")
    return [p.name for p in load_splits(path)[split]]


def packages_to_build(names: list[str], split: str | None) -> list[str]:
    """The packages named, or else every package of SPLIT: one of the two, not both."""
    if bool(names) == bool(split):
        raise BuildError("name packages or give --split, not both")
    return split_packages(split) if split else names
