"""How a policy sees LLVM's features: per-feature quantile normalization, learned from the
training traces (MLGO's idea). Each raw feature value becomes its quantile q in [0, 1] among
the values seen in training, given to the network as (q, sqrt q, q^2) so that both small and
large values are resolved. The quantiles are stored with the policy, so a policy takes raw
compiler features.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from mlgo.llvm.log_format import Reads, column_of
from mlgo.problems import SELF, Derived

QUANTILES = 256
# Comparisons a transform makes at once (rows x every column's boundaries): ~2 MB of them.
AT_ONCE = 1 << 21


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
    # (tensor, element or None) each feature reads (`log_format.column_of`), parsed once:
    # a policy reads them at every decision
    reads: Reads = field(init=False, repr=False, compare=False)
    _padded: tuple[tuple[np.ndarray, ...], tuple[int, ...], np.ndarray, np.ndarray] | None = field(
        default=None, init=False, repr=False, compare=False
    )

    def __post_init__(self) -> None:
        self.reads = tuple(column_of(f) for f in self.features)

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
        padded, lengths = self._bounds()
        frac = self._ranks(self.expand(values), padded, lengths) / np.maximum(lengths, 1)
        return np.concatenate([frac, np.sqrt(frac), frac * frac], 1).astype(np.float32)

    def _ranks(self, columns: np.ndarray, padded: np.ndarray, lengths: np.ndarray) -> np.ndarray:
        """[n, columns] -> [n, columns]: how many of its column's boundaries each value is
        at or above (NaN: all of them), as `searchsorted(q, x, side="right")` counts.

        A few rows (a decision the compiler waits on) are compared with every boundary at
        once (PADDED, LENGTHS: `_bounds`), a few numpy calls instead of several per column;
        more go column by column, as all of their comparisons at once would take too much
        memory."""
        if columns.shape[0] * padded.size <= AT_ONCE:
            counts = (padded <= columns[:, :, None]).sum(2)
            return np.where(np.isnan(columns), lengths, counts)
        return np.stack(
            [np.searchsorted(q, columns[:, j], side="right") for j, q in enumerate(self.quantiles)],
            1,
        )

    def _bounds(self) -> tuple[np.ndarray, np.ndarray]:
        """The boundaries as one [columns, longest] array, NaN past each column's end (no
        value is at or above a NaN), and each column's count; made again only when the
        quantiles are other arrays (held here, so that no other takes one's id)."""
        ids = tuple(map(id, self.quantiles))
        if self._padded is None or self._padded[1] != ids:
            lengths = np.array([len(q) for q in self.quantiles], np.int64)
            padded = np.full((len(self.quantiles), int(lengths.max(initial=0))), np.nan)
            for j, q in enumerate(self.quantiles):
                padded[j, : len(q)] = q
            self._padded = (tuple(self.quantiles), ids, padded, lengths)
        return self._padded[2], self._padded[3]

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
