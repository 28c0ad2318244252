"""What this user may load, run or keep its state in: nothing another user could have placed.

A built clang plugin, a policy server, a recording wrapper or a socket directory is code or
control that runs as this user, so it is trusted only if no other user could have written
it or swapped it: the file itself and every directory up to `/` must be owned by this user
or root and writable by no one else. A world-writable directory is allowed on the way only
when it is sticky (like /tmp): there others may add names but not replace ours, and the
next component's own check decides. mlgo/serve/native/mlgo_cc.c checks plugins by the
same rule (`trusted_path`).

A check holds only for the path it checked: a path through a symbolic link that another user
may replace can lead somewhere else a moment later. So a directory named by the environment
is resolved once (`resolved_dir`), the resolved path is checked, and only that path is used
from then on: every component of it is this user's or root's, so no one else can redirect it.

Standard library only: `mlgo-cc` imports this on every compile.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

from mlgo.errors import MlgoError


class UntrustedPathError(MlgoError, PermissionError):
    """A file or directory another user could have placed or changed; the message is one
    line naming it, its owner and mode, and the way out."""


def path_problem(path: str | Path, own: bool = True) -> str | None:
    """What makes PATH untrustworthy, or None. OWN: the path itself must be this user's
    (root's is not enough), as everything mlgo builds or keeps is."""
    uid = os.getuid()
    real = Path(os.path.realpath(path))
    parts = [real, *real.parents]
    for i, part in enumerate(parts):
        try:
            st = part.lstat()
        except OSError as e:
            return f"{part} cannot be checked ({e.strerror})"
        owners = (uid,) if i == 0 and own else (uid, 0)
        if st.st_uid not in owners:
            return f"{part} belongs to uid {st.st_uid}, not to this user (uid {uid})"
        sticky_dir = stat.S_ISDIR(st.st_mode) and st.st_mode & stat.S_ISVTX and (i or not own)
        if st.st_mode & 0o022 and not sticky_dir:
            return f"{part} is writable by other users (mode {stat.S_IMODE(st.st_mode):o})"
    return None


def foreign_link(path: str | Path) -> str | None:
    """The first symbolic link on PATH, as given, that another user owns (neither this user
    nor root: they may point it elsewhere at any time), said in a few words; or None."""
    uid = os.getuid()
    given = Path(path)
    for part in [*reversed(given.parents), given]:
        try:
            st = part.lstat()
        except OSError:
            return None  # not there yet: nothing further on is a link
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (uid, 0):
            return f"{part} is a symbolic link of uid {st.st_uid}, who may point it anywhere"
    return None


def check_trusted(path: str | Path, what: str, way_out: str) -> Path:
    """PATH, if trusted (see `path_problem`); else UntrustedPathError naming WHAT it is,
    why, and WAY_OUT."""
    problem = path_problem(path)
    if problem:
        raise UntrustedPathError(f"refusing {what} {path}: {problem}; {way_out}")
    return Path(path)


def trusted_dir(path: Path, what: str, way_out: str) -> Path:
    """PATH as a directory of this user's that no one else may write, created (with its
    missing parents) writable by this user only; refused as `check_trusted` refuses."""
    missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
    for p in reversed(missing):
        try:
            p.mkdir(mode=0o700)
        except FileExistsError:
            pass  # another process made it meanwhile: checked below like any other
        except OSError as e:
            raise UntrustedPathError(f"cannot create {what} {p}: {e.strerror}") from e
    return check_trusted(path, what, way_out)


OUTPUT_WAY_OUT = "choose a directory of yours that no one else may write"


def output_dir_checked(path: Path, create: bool = False) -> Path:
    """PATH as the output directory of a command that resumes from what it finds there, or
    runs what it built there: refused in one line unless it is a directory of this user's,
    on a path of this user's or root's, that no one else may write (as the cache is); if
    it does not exist yet, the directory above it must be so. With CREATE it is made
    (with its missing parents, never writable by others), then checked: a directory that
    another user made meanwhile, in a sticky one such as /tmp, is theirs and refused."""
    if problem := foreign_link(path):
        raise UntrustedPathError(f"refusing the output directory {path}: {problem}")
    if create:
        missing = [p for p in (path, *path.parents) if not os.path.lexists(p)]
        for p in reversed(missing):
            try:
                p.mkdir(mode=0o755)
            except FileExistsError:
                pass  # made meanwhile, by whoever: checked below
            except OSError as e:
                raise UntrustedPathError(
                    f"cannot create the output directory {p}: {e.strerror}"
                ) from e
    existing = next(p for p in (path, *path.parents) if os.path.lexists(p))
    if existing == path and not path.is_dir():
        raise UntrustedPathError(f"refusing the output directory {path}: not a directory")
    if problem := path_problem(existing, own=existing == path):
        raise UntrustedPathError(
            f"refusing the output directory {path}: {problem}; {OUTPUT_WAY_OUT}"
        )
    return path


def no_links_in(root: Path) -> None:
    """None of ROOT's entries is a symbolic link: where mlgo keeps a directory of its own
    (a scratch tree it removes, decisions whose wrappers it runs) a link would point its
    removals and writes at any directory. One line naming the first, else nothing."""
    for entry in sorted(root.iterdir()) if root.is_dir() else ():
        if entry.is_symlink():
            raise UntrustedPathError(
                f"{entry} is a symbolic link (to {os.readlink(entry)}) where mlgo keeps an "
                "entry of its own; remove it, or choose another output directory"
            )


_resolved: dict[str, Path] = {}  # resolved_dir's, per given path: once per process


def resolved_dir(given: str, what: str, way_out: str) -> Path:
    """GIVEN (an absolute path) resolved the first time this process asks, then created if
    missing and checked as `trusted_dir` checks at every call: the path to use, with no
    symbolic link in it, the same for the life of the process. Refused, in one line naming
    WHAT and WAY_OUT, if GIVEN is relative (it would mean another directory wherever a build
    changes into) or passes a link another user owns (`foreign_link`)."""
    if given not in _resolved:
        if not os.path.isabs(given):
            raise UntrustedPathError(
                f"{what} {given} is a relative path; {way_out} (an absolute one)"
            )
        if problem := foreign_link(given):
            raise UntrustedPathError(f"refusing {what} {given}: {problem}; {way_out}")
        _resolved[given] = Path(os.path.realpath(given))
    real = trusted_dir(_resolved[given], what, way_out)
    if os.path.realpath(real) != str(real):  # a link made in place of a missing directory
        raise UntrustedPathError(f"refusing {what} {given}: {real} is now a link; {way_out}")
    return real


def private_dir(path: Path, what: str, way_out: str) -> Path:
    """PATH as a directory only this user may enter (0700, made so if missing): the place
    for sockets, FIFOs and locks. Taken by another user, or open to others, it is refused
    with a line that names its owner and WAY_OUT; it is never used or removed. So is one in
    a directory another user controls (they could rename it away); a sticky one such as
    /tmp is not theirs. Returned with its parent resolved, the path that was checked."""
    parent = Path(os.path.realpath(path.parent))
    if problem := path_problem(parent, own=False):
        raise UntrustedPathError(f"refusing {what} {path}: {problem}; {way_out}")
    path = parent / path.name
    try:
        path.mkdir(mode=0o700, exist_ok=True)
        st = path.lstat()
    except OSError as e:
        raise UntrustedPathError(f"cannot create {what} {path}: {e.strerror}; {way_out}") from e
    if not stat.S_ISDIR(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o077:
        kind = "directory" if stat.S_ISDIR(st.st_mode) else "non-directory"
        raise UntrustedPathError(
            f"{what} {path} is taken: a {kind} of uid {st.st_uid} with mode "
            f"{stat.S_IMODE(st.st_mode):o}, not a private directory of this user "
            f"(uid {os.getuid()}); {way_out}"
        )
    return path


def private_temp_dir() -> Path:
    """TMPDIR/mlgo-UID (made if missing, checked as `private_dir` checks): this user's
    temporary files that others must neither read nor plant, such as compiler channels and
    the bitcode Ray's workers cache."""
    return private_dir(
        Path(tempfile.gettempdir()) / f"mlgo-{os.getuid()}",
        "this user's temporary directory",
        "set TMPDIR to a directory of yours",
    )
