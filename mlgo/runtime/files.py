"""Writes that never leave a half-written file or directory: write a sibling, then rename."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path


def cache_dir() -> Path:
    """The user's mlgo cache: $MLGO_CACHE, else $XDG_CACHE_HOME/mlgo, else ~/.cache/mlgo."""
    root = os.environ.get("MLGO_CACHE") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "mlgo"
    )
    return Path(root)


def _chmod_as_created(path: str | Path, mode: int) -> None:
    """The mode a plain create would give (MODE under the umask): mkstemp's and mkdtemp's
    private 0600/0700 would make results private by accident."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, mode & ~umask)


@contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yields a temp path next to `target`; renames it onto `target` only on success."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    os.close(fd)
    _chmod_as_created(tmp, 0o666)
    try:
        yield Path(tmp)
        os.replace(tmp, target)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)


def atomic_write_bytes(target: str | Path, data: bytes) -> None:
    with atomic_path(target) as tmp:
        tmp.write_bytes(data)


def atomic_write_text(target: str | Path, text: str) -> None:
    atomic_write_bytes(target, text.encode())


@contextmanager
def atomic_directory(target: str | Path, replace: bool = True) -> Iterator[Path]:
    """Yields an empty staging directory next to `target` and puts it in `target`'s place
    only on success, so a killed writer never leaves half a directory under that name;
    on failure the staging directory is removed. An existing `target` is replaced, or, if
    not `replace`, kept (a concurrent builder of the same thing won: both are complete)."""
    target = Path(target)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(
        tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
    )
    _chmod_as_created(staging, 0o777)
    try:
        yield staging
        if replace:
            shutil.rmtree(target, ignore_errors=True)
        try:
            staging.rename(target)
        except OSError:
            if replace or not target.exists():
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextmanager
def output_dir(path: Path) -> Iterator[Path]:
    """Makes PATH, a command's output directory. If the command fails and PATH is new,
    the empty directories it made go again: a failed run leaves no empty output that a
    later run or the loader would trip on, while any file written (real progress, which
    a rerun resumes) stays."""
    existed = path.exists()
    path.mkdir(parents=True, exist_ok=True)
    try:
        yield path
    except BaseException:
        if not existed:
            for d, _, _ in sorted(os.walk(path), key=lambda t: -len(t[0])):  # deepest first
                with suppress(OSError):  # not empty: it holds a file
                    os.rmdir(d)
        raise
