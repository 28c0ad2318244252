"""The size guard's memory: which output a guarded compile or link kept, remembered by content.

A guarded compile or LTO link whose policy departed from clang is done twice, and the
smaller output kept (`guard.keep_smaller`). Which one won does not change until what decides
it does, so it is remembered in the user's cache (GUARD_CACHE), and a rebuild of unchanged
inputs runs once, with the winner: the same output. An entry is named by the hash of what
decides the output besides the files read (the command line without its outputs, the
directory it runs in, the compiler, the lease's flags, whose plugin's path is a hash of the
policy and LLVM's version, and ENVIRONMENT) and lists the hash of every file read: a hit
needs them all unchanged. Anything else is a miss, and the output is guarded again: an
entry that is stale, corrupt, too large, not this user's or writable by another. A wrong
winner could cost bytes, never a wrong output: either way it is a real compile or link of
the inputs as they are.

The native mlgo-cc remembers its compiles so (mlgo/serve/native/mlgo_cc.c, `memo`: the files
a compile read are its dependency list), built with this module's format (`native_lists`);
this module remembers the guarded links, which the native wrapper hands to Python: the files
a link reads are those its command line names, and the libraries its -l options find in its
-L directories.
"""

from __future__ import annotations

import hashlib
import os
import shutil
import stat
from contextlib import suppress
from pathlib import Path

from mlgo.llvm.cmdline import without_outputs
from mlgo.llvm.driver import takes_value
from mlgo.runtime.files import atomic_write_text, cache_subdir, open_regular
from mlgo.runtime.trust import UntrustedPathError

GUARD_CACHE = "guard"  # the memory's directory in the user's cache
VERSION = "mlgo-guard-cache 1"  # an entry's first line
WINNERS = {"policy": "winner policy", "default": "winner default"}  # its second
END = "end"  # its last, after a "HASH NAME" line per file read
# What clang finds headers and libraries by, besides its command line
ENVIRONMENT = (
    "CPATH",
    "C_INCLUDE_PATH",
    "CPLUS_INCLUDE_PATH",
    "OBJC_INCLUDE_PATH",
    "LIBRARY_PATH",
    "SOURCE_DATE_EPOCH",
    "CCC_OVERRIDE_OPTIONS",
)
MAX_ENTRY_BYTES = 1 << 20


def link_entry(compiler: str, args: list[str], flags: list[str]) -> Path | None:
    """The entry of the link ARGS (response files expanded) run by COMPILER with the lease's
    FLAGS; None where it cannot be remembered (no such compiler, an untrusted cache)."""
    found = shutil.which(compiler)
    if found is None:
        return None
    key = hashlib.sha256()
    try:
        real = os.path.realpath(found)
        st = os.stat(real)
        for part in (
            VERSION,
            "link",
            f"{real} {st.st_size} {st.st_mtime_ns}",  # another clang, or this one upgraded
            os.getcwd(),
            *without_outputs(args),
            *(f"{name}={os.environ.get(name)!r}" for name in ENVIRONMENT),
            *flags,
        ):
            key.update(part.encode(errors="surrogateescape") + b"\0")
        return cache_subdir(GUARD_CACHE) / key.hexdigest()
    except (OSError, UntrustedPathError):  # a build never fails for want of a memory
        return None


def link_inputs(args: list[str]) -> list[str]:
    """The files the link ARGS (response files expanded) reads: those it names (to the linker
    too, through -Wl, and -Xlinker), and for each -lNAME (-l:FILE) the libraries of that
    name in its -L directories."""
    named, libraries, directories = [], [], []
    rest = iter(args)
    for a in rest:
        if a in ("-l", "-L"):
            (libraries if a == "-l" else directories).append(next(rest, ""))
        elif a.startswith(("-l", "-L")):
            (libraries if a.startswith("-l") else directories).append(a[2:])
        elif a == "-Xlinker":
            named.append(next(rest, "-"))
        elif a.startswith("-Wl,"):
            named += a.split(",")[1:]
        elif takes_value(a) or a == "-o":
            next(rest, None)
        elif not a.startswith("-"):
            named.append(a)
    found = [
        os.path.join(d, name)
        for lib in libraries
        for name in ([lib[1:]] if lib.startswith(":") else [f"lib{lib}.a", f"lib{lib}.so"])
        for d in directories
    ]
    return [f for f in [*named, *found] if not f.startswith("-") and os.path.isfile(f)]


def remembered(entry: Path) -> str | None:
    """The winner ENTRY remembers ("policy" or "default"), read only from a regular file of
    this user's that no one else may write, if it is whole and every file it lists still
    hashes as it did; None otherwise."""
    try:
        fd = os.open(entry, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
        with open(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if not stat.S_ISREG(st.st_mode) or st.st_uid != os.getuid() or st.st_mode & 0o022:
                return None
            text = f.read(MAX_ENTRY_BYTES + 1).decode(errors="replace")
    except OSError:
        return None
    lines = text.split("\n")
    winner = {line: w for w, line in WINNERS.items()}.get(lines[1] if len(lines) > 1 else "")
    if lines[0] != VERSION or winner is None or lines[-2:] != [END, ""] or len(lines) < 5:
        return None
    for line in lines[2:-2]:
        digest, _, name = line.partition(" ")
        if _hash(name) != digest:
            return None
    return winner


def remember(entry: Path, winner: str, files: list[str], since: float) -> None:
    """Writes ENTRY: WINNER and the hash of each of FILES, whole or not at all. Nothing is
    remembered if a file cannot be hashed or changed after SINCE (when the link began: an
    edit during the build, which the link may have read before)."""
    lines = [VERSION, WINNERS[winner]]
    for name in files:
        try:
            st = os.stat(name)
        except OSError:
            return
        digest = _hash(name)
        if digest is None or max(st.st_mtime, st.st_ctime) >= since:
            return
        lines.append(f"{digest} {name}")
    if len(lines) > 2:
        with suppress(OSError):  # a full disk, say: not remembered, guarded again next time
            atomic_write_text(entry, "\n".join([*lines, END, ""]))


def _hash(name: str) -> str | None:
    """The hex SHA-256 of the regular file NAME; None if it is not one or cannot be read."""
    try:
        f = open_regular(name)
        if f is None:
            return None
        with f:
            return hashlib.file_digest(f, "sha256").hexdigest()
    except OSError:
        return None
