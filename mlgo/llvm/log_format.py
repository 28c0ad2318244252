"""LLVM's training-log format: what the compiler writes on an interactive channel.

A JSON header line names the feature tensors (and the advice or score tensor), then come
`{"context": NAME}` lines and, per decision, `{"observation": N}` followed by the raw
feature tensors in header order and a newline. The layout is documented in LLVM's
`llvm/lib/Analysis/models/log_reader.py` and ml-compiler-opt's `compiler_opt/rl/log_reader.py`.
Tensors are raw native-endian bytes, so specs carry a numpy dtype.
"""

from __future__ import annotations

import json
import math
import os
import select
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from functools import cached_property
from typing import BinaryIO

import numpy as np

from mlgo.errors import MlgoError

# LLVM's type names (TensorSpec.cpp) to numpy dtypes.
_DTYPES: dict[str, np.dtype] = {
    "int64_t": np.dtype(np.int64),
    "int32_t": np.dtype(np.int32),
    "int8_t": np.dtype(np.int8),
    "uint8_t": np.dtype(np.uint8),
    "float": np.dtype(np.float32),
    "double": np.dtype(np.float64),
}


class LogFormatError(MlgoError, ValueError):
    """The stream does not follow the training-log format."""


class EmptyLog(LogFormatError):
    """The stream ended before its header: the peer closed without a word."""


class ChannelTimeout(TimeoutError):
    """The peer did not send the expected bytes in time."""


@dataclass(frozen=True)
class TensorSpec:
    name: str
    type: str
    shape: tuple[int, ...]
    port: int = 0

    @cached_property
    def dtype(self) -> np.dtype:
        return _DTYPES[self.type]

    @cached_property
    def num_elements(self) -> int:
        return math.prod(self.shape)

    @cached_property
    def num_bytes(self) -> int:
        return self.num_elements * self.dtype.itemsize

    @classmethod
    def from_json(cls, d: dict) -> TensorSpec:
        try:
            spec = cls(
                str(d["name"]),
                str(d["type"]),
                tuple(int(s) for s in d["shape"]),
                int(d.get("port", 0)),
            )
        except (KeyError, TypeError, ValueError) as e:
            raise LogFormatError(f"bad tensor spec {d!r}: {e}") from e
        if spec.type not in _DTYPES:
            raise LogFormatError(f"tensor {spec.name!r} has unknown type {spec.type!r}")
        return spec

    def to_json(self) -> dict:
        return {"name": self.name, "type": self.type, "port": self.port, "shape": list(self.shape)}

    def decode(self, raw: bytes, offset: int = 0) -> np.ndarray:
        return np.frombuffer(raw, self.dtype, self.num_elements, offset).reshape(self.shape)


# A policy input that is one element of a vector feature is named `tensor.index`
# (IR2Vec's `callee_embedding.3`); a scalar feature by its tensor's name alone.
ELEMENT = "."


def column_of(name: str) -> tuple[str, int | None]:
    """(tensor, element) that feature column NAME reads; None: the tensor whole."""
    tensor, _, index = name.partition(ELEMENT)
    return tensor, int(index) if index else None


def tensor_of(name: str) -> str:
    """The tensor that feature column NAME reads."""
    return column_of(name)[0]


def element_column(features: Mapping[str, np.ndarray], name: str, n: int) -> np.ndarray:
    """[n] values of column NAME over N decisions ([n, ...] tensors by name): a scalar
    feature, or one element of a vector feature."""
    tensor, index = column_of(name)
    return features[tensor].reshape(n, -1)[:, index or 0]


@dataclass(frozen=True)
class Header:
    """`advice` is what an interactive compiler waits for after each observation; `score`
    is the per-observation outcome that a development-mode log carries instead."""

    features: tuple[TensorSpec, ...]
    advice: TensorSpec | None = None
    score: TensorSpec | None = None

    @classmethod
    def parse(cls, line: bytes) -> Header:
        try:
            d = json.loads(line)
            features = tuple(TensorSpec.from_json(f) for f in d["features"])
            advice, score = d.get("advice"), d.get("score")
        except (json.JSONDecodeError, KeyError, TypeError, AttributeError) as e:
            raise LogFormatError(f"bad log header {line[:200]!r}: {e}") from e
        return cls(
            features, advice and TensorSpec.from_json(advice), score and TensorSpec.from_json(score)
        )

    def to_json(self) -> dict:
        d: dict = {"features": [f.to_json() for f in self.features]}
        for key, spec in (("advice", self.advice), ("score", self.score)):
            if spec is not None:
                d[key] = spec.to_json()
        return d


Reads = tuple[tuple[str, int | None], ...]  # (tensor, element) per column (`column_of`)


class Layout:
    """Where each feature tensor sits in an observation's block: shared by every view of
    one log, with the positions a policy's reads gather from worked out once."""

    def __init__(self, features: tuple[TensorSpec, ...]):
        self.offsets: dict[str, tuple[TensorSpec, int]] = {}
        offset = 0
        for spec in features:
            self.offsets[spec.name] = (spec, offset)
            offset += spec.num_bytes
        self.block_bytes = offset
        self._gathers: dict[Reads, tuple[np.dtype, np.ndarray] | None] = {}

    def gather_of(self, reads: Reads) -> tuple[np.dtype, np.ndarray] | None:
        """READS as one dtype and the element positions in a block of it; None where they
        are not all in this layout, in range and of one dtype."""
        if reads not in self._gathers:
            self._gathers[reads] = self._positions(reads)
        return self._gathers[reads]

    def _positions(self, reads: Reads) -> tuple[np.dtype, np.ndarray] | None:
        if not reads or any(t not in self.offsets for t, _ in reads):
            return None
        dtype = self.offsets[reads[0][0]][0].dtype
        positions = []
        for t, i in reads:
            spec, offset = self.offsets[t]
            if spec.dtype != dtype or offset % dtype.itemsize or (i or 0) >= spec.num_elements:
                return None
            positions.append(offset // dtype.itemsize + (i or 0))
        return dtype, np.array(positions)


class FeatureView(Mapping[str, np.ndarray]):
    """One observation's feature tensors, decoded on access from the raw block.

    An observation is one contiguous block of bytes; decoding all ~40 tensors eagerly
    would cost more than a whole decision round trip, and most consumers read few; a
    policy's reads are gathered in one go (`gather`), as it reads them at every decision.
    """

    __slots__ = ("_layout", "_raw")

    def __init__(self, layout: Layout, raw: bytes):
        self._layout = layout
        self._raw = raw

    def __getitem__(self, name: str) -> np.ndarray:
        spec, offset = self._layout.offsets[name]
        return spec.decode(self._raw, offset)

    def __iter__(self) -> Iterator[str]:
        return iter(self._layout.offsets)

    def __len__(self) -> int:
        return len(self._layout.offsets)

    def gather(self, reads: Reads) -> np.ndarray | None:
        """[len(READS)] float64, the values READS name, the same as reading each one; None
        where they are not all one dtype's in this view (then read them one by one)."""
        gather = self._layout.gather_of(reads)
        if gather is None:
            return None
        dtype, positions = gather
        block = np.frombuffer(self._raw, dtype, self._layout.block_bytes // dtype.itemsize)
        return block[positions].astype(np.float64)


def stack_features(
    specs: tuple[TensorSpec, ...], views: list[Mapping[str, np.ndarray]]
) -> dict[str, np.ndarray]:
    """Many observations' features as one array per feature, [observations, *shape].

    Views read off the channel share one layout, so their raw blocks are decoded in one
    go; any other mappings are stacked feature by feature.
    """
    if views and all(isinstance(v, FeatureView) for v in views):
        layout = np.dtype([(s.name, s.dtype, s.shape) for s in specs])
        block = layout.itemsize
        rows = np.frombuffer(b"".join(v._raw[:block] for v in views), layout)  # noqa: SLF001
        return {s.name: rows[s.name] for s in specs}
    return {
        s.name: np.stack([v[s.name] for v in views]) if views else np.zeros((0, *s.shape), s.dtype)
        for s in specs
    }


@dataclass(frozen=True)
class Observation:
    context: str
    index: int
    features: Mapping[str, np.ndarray]
    score: np.ndarray | None = None


class TimedReader:
    """Buffered reads from a file descriptor where every read has a deadline.

    `alive` is polled while waiting so that a dead peer is noticed at once rather than at
    the timeout.
    """

    def __init__(self, fd: int, timeout_s: float, alive=lambda: True):
        self.fd = fd
        self.timeout_s = timeout_s
        self.alive = alive
        self._buf = bytearray()
        self.eof = False

    def _fill(self) -> None:
        deadline = time.monotonic() + self.timeout_s
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise ChannelTimeout(f"no data from the compiler for {self.timeout_s:g} s")
            ready, _, _ = select.select([self.fd], [], [], min(remaining, 0.5))
            if ready:
                chunk = os.read(self.fd, 1 << 16)
                if not chunk:
                    self.eof = True
                    return
                self._buf += chunk
                return
            if not self.alive():
                # One last non-blocking look: the peer may have written then exited.
                ready, _, _ = select.select([self.fd], [], [], 0)
                if not ready:
                    self.eof = True
                    return

    def readline(self) -> bytes:
        """A line with its newline, or b'' at a clean end of stream."""
        while (nl := self._buf.find(b"\n")) < 0:
            if self.eof:
                break
            self._fill()
        if nl < 0:
            if self._buf:
                raise LogFormatError(f"stream ended inside a line: {bytes(self._buf[:80])!r}")
            return b""
        line = bytes(self._buf[: nl + 1])
        del self._buf[: nl + 1]
        return line

    def read_exact(self, n: int) -> bytes:
        while len(self._buf) < n and not self.eof:
            self._fill()
        if len(self._buf) < n:
            raise LogFormatError(f"stream ended after {len(self._buf)} of {n} tensor bytes")
        out = bytes(self._buf[:n])
        del self._buf[:n]
        return out


class LogReader:
    """Reads a training log event by event from a TimedReader or a plain binary file."""

    def __init__(self, source: TimedReader | BinaryIO):
        self._src = source
        first = self._readline()
        if not first:
            raise EmptyLog("empty log: no header line")
        self.header = Header.parse(first)
        self.context = ""
        self._layout = Layout(self.header.features)
        self._block_bytes = self._layout.block_bytes

    def _readline(self) -> bytes:
        return self._src.readline()

    def _read_exact(self, n: int) -> bytes:
        if isinstance(self._src, TimedReader):
            return self._src.read_exact(n)
        data = self._src.read(n)
        if len(data) != n:
            raise LogFormatError(f"log ended after {len(data)} of {n} tensor bytes")
        return data

    def observations(self) -> Iterator[Observation]:
        """Yields each observation; a consumer answers it before asking for the next."""
        while line := self._readline():
            try:
                event = json.loads(line)
            except json.JSONDecodeError as e:
                raise LogFormatError(f"bad log event line {line[:120]!r}") from e
            if "context" in event:
                self.context = str(event["context"])
                continue
            if "observation" not in event:
                raise LogFormatError(f"unexpected log event {event!r}")
            block = self._read_exact(self._block_bytes + 1)
            if block[-1:] != b"\n":
                raise LogFormatError("missing newline after a tensor block")
            feats = FeatureView(self._layout, block)
            score = None
            if self.header.score is not None:
                outcome = json.loads(self._readline() or b"null")
                if not isinstance(outcome, dict) or "outcome" not in outcome:
                    raise LogFormatError(f"expected an outcome line, got {outcome!r}")
                score = self.header.score.decode(self._read_exact(self.header.score.num_bytes))
                self._expect_newline()
            yield Observation(self.context, int(event["observation"]), feats, score)

    def _expect_newline(self) -> None:
        if self._read_exact(1) != b"\n":
            raise LogFormatError("missing newline after a tensor block")


class LogWriter:
    """Writes the same format; used to save a session's log and by tests as a peer."""

    def __init__(self, out: BinaryIO, header: Header):
        self._out = out
        self._header = header
        self._count = 0
        out.write(json.dumps(header.to_json()).encode() + b"\n")

    def context(self, name: str) -> None:
        self._out.write(json.dumps({"context": name}).encode() + b"\n")

    def observation(self, features: dict[str, np.ndarray]) -> None:
        self._out.write(json.dumps({"observation": self._count}).encode() + b"\n")
        for spec in self._header.features:
            value = np.ascontiguousarray(features[spec.name], dtype=spec.dtype)
            if value.size != spec.num_elements:
                raise LogFormatError(
                    f"{spec.name}: {value.size} values, spec wants {spec.num_elements}"
                )
            self._out.write(value.tobytes())
        self._out.write(b"\n")
        self._out.flush()
        self._count += 1
