"""Writes that never leave a half-written file or directory: write a sibling, then rename."""

from __future__ import annotations

import fcntl
import hashlib
import os
import re
import shutil
import stat
import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import BinaryIO

from mlgo.runtime.messages import copy_error, names_no_file, reworded
from mlgo.runtime.trust import (
    UntrustedPathError,
    output_dir_checked,
    path_problem,
    private_dir,
    private_temp_dir,
    resolved_dir,
    trusted_dir,
)

CACHE_WAY_OUT = "set MLGO_CACHE to a directory of yours"
TEMP_WAY_OUT = "set TMPDIR to a directory of yours"


def cache_dir() -> Path:
    """The user's mlgo cache: $MLGO_CACHE, else $XDG_CACHE_HOME/mlgo (a relative one is
    ignored, as the XDG spec says), else ~/.cache/mlgo; created if missing, and refused
    (UntrustedPathError) unless no other user could have put or changed anything in it:
    what is built there runs as this user. Returned resolved (`resolved_dir`): the path that
    was checked, the only one used. mlgo/serve/native/mlgo_cc.c finds it the same way
    (`plugin_cache`)."""
    xdg = os.environ.get("XDG_CACHE_HOME", "")
    root = os.environ.get("MLGO_CACHE") or os.path.join(
        xdg if os.path.isabs(xdg) else os.path.expanduser("~/.cache"), "mlgo"
    )
    return resolved_dir(root, "the mlgo cache", CACHE_WAY_OUT)


def cache_subdir(*parts: str) -> Path:
    """CACHE/PARTS..., created writable by this user only and checked like the cache."""
    return trusted_dir(cache_dir().joinpath(*parts), "the mlgo cache", CACHE_WAY_OUT)


def content_cached(kind: str, digest: str, suffix: str, fetch: Callable[[], bytes]) -> Path:
    """A file DIGEST+SUFFIX holding the bytes whose sha256 is DIGEST (hex), in this user's
    private temporary directory under KIND: the copy there if it is this user's alone and
    its bytes still hash to DIGEST, else FETCH()'s bytes written anew. What is read from it
    is then what was asked for, whoever wrote files near it."""
    root = private_temp_dir()
    directory = private_dir(root / kind, "this user's temporary directory", TEMP_WAY_OUT)
    path = directory / f"{digest}{suffix}"
    if (
        path.exists()
        and not path_problem(path)
        and hashlib.sha256(path.read_bytes()).hexdigest() == digest
    ):
        return path
    data = fetch()
    if hashlib.sha256(data).hexdigest() != digest:
        raise ValueError(f"the bytes fetched for {path} do not hash to its name")
    atomic_write_bytes(path, data)  # atomic: concurrent workers write the same bytes
    return path


def open_regular(path: str | Path) -> BinaryIO | None:
    """PATH opened for reading, or None if it is not a regular file: opened without
    blocking, so that a FIFO put where a file was is not waited on, nor a device read."""
    f = os.fdopen(os.open(path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC), "rb")
    if not stat.S_ISREG(os.fstat(f.fileno()).st_mode):
        f.close()
        return None
    return f


def close_to_others(tree: Path) -> None:
    """Takes write permission for group and others off TREE and everything in it: what
    mlgo builds in its cache must pass `mlgo.runtime.trust` whatever the umask was."""
    for path in [tree, *tree.rglob("*")]:
        if not path.is_symlink():
            path.chmod(path.stat().st_mode & ~0o022)


def _chmod_as_created(path: str | Path, mode: int) -> None:
    """The mode a plain create would give (MODE under the umask): mkstemp's and mkdtemp's
    private 0600/0700 would make results private by accident."""
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(path, mode & ~umask)


@contextmanager
def held_lock(path: Path) -> Iterator[None]:
    """PATH, a lock file in a directory of this user's alone, held exclusively while the
    block runs: one process at a time does what the others then find done."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # and the lock with it


@contextmanager
def atomic_path(target: str | Path) -> Iterator[Path]:
    """Yields a temp path next to `target`; renames it onto `target` only on success. An
    OSError that names no file or the temp one (a full disk) names `target` instead."""
    target = Path(target)
    with _naming(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
        os.close(fd)
        try:
            _chmod_as_created(tmp, 0o666)
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
    not `replace`, kept (a concurrent builder of the same thing won: both are complete).
    An OSError that names no file, or one in the staging directory, names `target` (or the
    file under it) instead; so does a copy into it that failed (`copy_error`)."""
    target = Path(target)
    with _naming(target):
        target.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(
            tempfile.mkdtemp(prefix=f".{target.name}.", suffix=".partial", dir=target.parent)
        )
        try:
            _chmod_as_created(staging, 0o777)
            yield staging
            if target.is_symlink():  # rmtree would not remove it, rename not replace it
                raise UntrustedPathError(f"{target} is a symbolic link where a directory goes")
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
def _naming(target: Path) -> Iterator[None]:
    """An OSError raised while writing TARGET through a temp file or staging directory
    beside it says `cannot write TARGET: <reason>` (or TARGET/sub/file), keeping its errno:
    a write to a full disk names no file, and a temp name is not one the user knows."""
    temp = re.compile(re.escape(str(target.parent / f".{target.name}.")) + r"[^/\s:'\"]*")

    def shown(text: str) -> str:
        return temp.sub(lambda _: str(target), text)

    try:
        yield
    except shutil.Error as e:
        raise copy_error(e, shown) from e
    except OSError as e:
        if names_no_file(e):
            raise reworded(e, f"cannot write {target}: {e.strerror}") from e
        if isinstance(e.filename, str | bytes | os.PathLike) and e.strerror is not None:
            named = os.fsdecode(e.filename)
            if shown(named) != named:
                raise reworded(e, f"cannot write {shown(named)}: {e.strerror}") from e
        if shown(str(e)) != str(e):  # an inner atomic write's message, under the staging
            raise reworded(e, shown(str(e))) from e
        raise


@contextmanager
def output_dir(path: Path) -> Iterator[Path]:
    """Makes PATH, a command's output directory. If the command fails and PATH is new,
    the empty directories it made go again: a failed run leaves no empty output that a
    later run or the loader would trip on, while any file written (real progress, which
    a rerun resumes) stays."""
    existed = path.exists()
    output_dir_checked(path, create=True)
    try:
        yield path
    except BaseException:
        if not existed:
            for d, _, _ in sorted(os.walk(path), key=lambda t: -len(t[0])):  # deepest first
                with suppress(OSError):  # not empty: it holds a file
                    os.rmdir(d)
        raise
