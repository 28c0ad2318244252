"""Reading a file that a user, or another user, could have handed mlgo (a policy, a corpus
description, a run's record), bounded before it is read in full: a file crafted to be huge,
nested without end, or an array archive whose headers declare gigabytes is one line naming
it, never a traceback, a hang or a machine out of memory.

Every JSON file mlgo reads goes through `read_json`, and the arrays of a policy or a model
through `read_arrays`; the caller names the error type its users already catch, and an
OSError (a missing file) stays the caller's to say."""

from __future__ import annotations

import json
import math
import re
import tomllib
import zipfile
import zlib
from pathlib import Path
from typing import IO, Any, BinaryIO

import numpy as np

from mlgo.errors import MlgoError, UsageError
from mlgo.runtime.files import open_regular

# The largest JSON mlgo reads is a build's compile database (bear writes every argument,
# about 2 KB a file): this holds a 100,000-file build's. Parsed, JSON takes several times
# its size in memory.
MAX_JSON_BYTES = 256 << 20
# No record mlgo writes nests deeper than a handful of levels; Python's parser recurses once
# per level and dies of it (RecursionError) near a thousand.
MAX_JSON_DEPTH = 64

_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_A_BRACKET = bytes(b for b in range(256) if b not in b"[]{}")
_DEPTH_STEP = np.zeros(256, np.int64)
_DEPTH_STEP[list(b"[{")] = 1
_DEPTH_STEP[list(b"]}")] = -1
_CHUNK = 1 << 20  # brackets counted at once: a file of nothing else takes little memory


def _open_regular(path: Path, error: type[MlgoError]) -> BinaryIO:
    """PATH opened for reading, refused (ERROR) if it is not a regular file."""
    f = open_regular(path)
    if f is None:
        raise error(f"{path}: not a regular file")
    return f


MAX_TOML_BYTES = 1 << 20  # a recipe or a split: a few kilobytes


def read_toml(path: Path, error: type[MlgoError] = UsageError, limit: int = MAX_TOML_BYTES) -> Any:
    """The TOML table in PATH; what is not TOML, is larger than LIMIT bytes or nests so deep
    that the parser recurses out is an ERROR naming PATH and why."""
    with _open_regular(path, error) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise error(f"{path}: larger than {_size(limit)}; no such file is so large")
    try:
        return tomllib.loads(data.decode())
    except (UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError) as e:
        raise error(f"{path}: not TOML ({str(e)[:200] or type(e).__name__})") from None


def json_depth(data: bytes) -> int:
    """How deep the arrays and objects of the JSON text DATA nest, counted without parsing it
    (brackets inside strings do not count): bounded before a recursive parser meets it."""
    brackets = _STRING.sub(b"", data).translate(None, _NOT_A_BRACKET)
    depth = deepest = 0
    for start in range(0, len(brackets), _CHUNK):
        chunk = np.frombuffer(brackets, np.uint8, min(_CHUNK, len(brackets) - start), start)
        running = depth + _DEPTH_STEP[chunk].cumsum()
        deepest, depth = max(deepest, int(running.max())), int(running[-1])
    return deepest


def read_bytes(path: Path, limit: int, error: type[MlgoError] = UsageError) -> bytes:
    """The bytes of PATH, a regular file (opened without blocking) of at most LIMIT bytes,
    else an ERROR naming PATH and why; an OSError (a missing file) is the caller's to say."""
    with _open_regular(path, error) as f:
        data = f.read(limit + 1)
    if len(data) > limit:
        raise error(f"{path}: larger than {_size(limit)}; no such file is so large")
    return data


def read_json(path: Path, error: type[MlgoError] = UsageError, limit: int = MAX_JSON_BYTES) -> Any:
    """The JSON value in PATH. What is not JSON, is larger than LIMIT bytes or nests deeper
    than MAX_JSON_DEPTH is an ERROR naming PATH and why; an OSError (a missing file) is
    the caller's to say."""
    data = read_bytes(path, limit, error)
    if json_depth(data) > MAX_JSON_DEPTH:
        raise error(
            f"{path}: nested more than {MAX_JSON_DEPTH} levels deep; no such file is so deep"
        )
    try:
        return json.loads(data)
    except (ValueError, RecursionError) as e:  # not UTF-8, not JSON
        raise error(f"{path}: not valid JSON ({e})") from e


def read_arrays(
    path: Path, max_values: int, error: type[MlgoError] = UsageError
) -> list[np.ndarray]:
    """The arrays arr_0, arr_1, ... of the .npz archive at PATH (as `np.savez(f, *arrays)`
    writes them), of a floating-point type, each refused before its data is read if with
    those before it it would make more than MAX_VALUES numbers: an array's header declares
    its shape, and a small compressed archive can declare gigabytes."""
    arrays = _read_archive(path, max_values, error, "f", positional=True)
    return list(arrays.values())


def read_named_arrays(
    path: Path, max_values: int, error: type[MlgoError] = UsageError
) -> dict[str, np.ndarray]:
    """The arrays of the .npz archive at PATH by name (as `np.savez(f, **arrays)` writes
    them): numbers, booleans or text (a character counts as a number), bounded as
    `read_arrays` bounds them; never objects, which only pickle could read."""
    return _read_archive(path, max_values, error, "fiubU", positional=False)


def _read_archive(
    path: Path, max_values: int, error: type[MlgoError], kinds: str, positional: bool
) -> dict[str, np.ndarray]:
    """The arrays of the .npz archive at PATH by name (without `.npy`), each of a dtype kind
    in KINDS, refused as `read_arrays` says; with POSITIONAL, only arr_0, arr_1, ..."""
    try:
        with _open_regular(path, error) as f, zipfile.ZipFile(f) as z:
            names = z.namelist()
            if positional and names != [f"arr_{i}.npy" for i in range(len(names))]:
                raise error(f"{path}: holds {', '.join(names[:3])}, not arrays arr_0, arr_1, ...")
            if not all(n.endswith(".npy") for n in names):
                raise error(f"{path}: holds {', '.join(names[:3])}, not only .npy arrays")
            arrays, total = {}, 0
            for name in names:
                with z.open(name) as member:
                    shape, dtype = _npy_header(member)
                if dtype.kind not in kinds:
                    raise error(f"{path}: {name} holds {dtype}, not {_KINDS[kinds]}")
                total += math.prod(shape) * (dtype.itemsize // 4 if dtype.kind == "U" else 1)
                if total > max_values:
                    raise error(
                        f"{path}: its arrays hold {total:,} numbers or more; at most "
                        f"{max_values:,} are allowed"
                    )
                with z.open(name) as member:
                    arrays[name.removesuffix(".npy")] = np.lib.format.read_array(
                        member, allow_pickle=False
                    )
            return arrays
    except MlgoError:
        raise
    except (ValueError, EOFError, zipfile.BadZipFile, zlib.error, NotImplementedError) as e:
        raise error(f"{path}: not an array archive ({type(e).__name__}: {e})") from e


_KINDS = {"f": "floating-point numbers", "fiubU": "numbers, booleans or text"}


def _npy_header(member: IO[bytes]) -> tuple[tuple[int, ...], np.dtype]:
    """The shape and type an .npy member declares, read from its header alone."""
    version = np.lib.format.read_magic(member)
    if version == (1, 0):
        shape, _, dtype = np.lib.format.read_array_header_1_0(member)
    elif version == (2, 0):
        shape, _, dtype = np.lib.format.read_array_header_2_0(member)
    else:
        raise ValueError(f".npy format version {version} is not one numpy's savez writes")
    return shape, dtype


def _size(n: int) -> str:
    return f"{n >> 20} MiB" if n >= 1 << 20 else f"{n >> 10} KiB"
