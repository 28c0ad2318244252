"""One line that says what went wrong, out of a tool's output or an exception.

Every error the user sees is one line; this is where that line is chosen, so that a
failed build, a failed AOT compile and a failed worker task are reported alike.
"""

from __future__ import annotations

import re
import shutil
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

# A line naming an error as such: a compiler's "a.c:3:5: error: ...", "clang: error: ...",
# Meson's "ERROR: ...", CMake's "CMake Error at ...", Python's "ValueError: ...", GNU ld's
# "undefined reference". Not "error.o", "strerror" or "-Werror": names in a build log, nor
# "/opt/error:/usr/lib" in an echoed command (an "error:" here is followed by a space).
_ERROR = re.compile(
    r"(?:^|[\s:\]])(?:fatal )?error:(?:\s|$)"
    r"|^(?:[\w.]+\.)?[A-Z]\w*Error: "
    r"|\bCMake Error\b"
    r"|: undefined reference to ",
    re.IGNORECASE,
)
# make's own errors, "make: *** [Makefile:3: a.o] Error 1" (its summary of a failed recipe,
# after the recipe's own output) and "make[1]: *** No rule to make target": when no tool
# named an error.
_MAKE_ERROR = re.compile(r"^\S*make(?:\[\d+\])?: \*\*\* ")
# Colours (clang's -fdiagnostics-color=always, which CMake and Meson pass under Ninja).
_ANSI = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")
_ERRNO = re.compile(r"^\[Errno (\d+)\] ([^:]+)")
# How much of an mlgo error's own line is shown: all of it (a path can be long, and the reason
# follows it), where a tool's output line is cut at error_line's default.
WHOLE_LINE = 2000


def error_line(what: str | BaseException, limit: int = 300) -> str:
    """The line that says what went wrong. For an exception, its message's first line (its
    type's name if it has none; a copy's list of failures as `copy_error` says it); for a
    tool's output or log, the first line that names an error, else make's first `*** ...
    Error N`, else the last line (where a tool says why it stopped). A compile that fails
    in a build so is quoted by its own `file.c:3:5: error:` line, not by make's summary
    after it or a link line echoed later."""
    if isinstance(what, shutil.Error):
        what = copy_error(what)
    if isinstance(what, BaseException):
        lines = str(what).strip().splitlines()
        return lines[0].strip()[:limit] if lines else type(what).__name__
    lines = [ln.strip() for ln in _ANSI.sub("", what).splitlines() if ln.strip()]
    named = [ln for ln in lines if _ERROR.search(ln) and not _MAKE_ERROR.search(ln)]
    made = [ln for ln in lines if _MAKE_ERROR.search(ln)]
    return (named[:1] or made[:1] or lines[-1:] or ["(no output)"])[0][:limit]


def reworded(e: OSError, message: str) -> OSError:
    """E with MESSAGE as all it says, of its type and with its errno, so that a caller can
    still tell a full disk (ENOSPC) from a missing file."""
    try:
        new = type(e)(message)
    except TypeError:  # a subclass with a constructor of its own
        new = OSError(message)
    new.errno = e.errno  # not strerror: with it, str() would be "[Errno N] strerror" again
    return new


def names_no_file(e: OSError) -> bool:
    """Does E say only its errno's text, "[Errno 28] No space left on device", as a write to
    an open file or a copy's sendfile raises it, without which file?"""
    return e.filename is None and e.strerror is not None and not isinstance(e, shutil.Error)


@contextmanager
def naming(what: str) -> Iterator[None]:
    """Inside, an OSError that names no file (as a write to a full disk raises it from
    whichever library wrote) becomes `WHAT: <reason>`, its errno kept."""
    try:
        yield
    except OSError as e:
        if names_no_file(e):
            raise reworded(e, f"{what}: {e.strerror}") from e
        raise


def writing(target: str | Path) -> AbstractContextManager[None]:
    """Inside, an OSError that names no file becomes `cannot write TARGET: <reason>`."""
    return naming(f"cannot write {target}")


def copy_error(e: shutil.Error, where: Callable[[str], str] = str) -> OSError:
    """shutil.copytree's error as one line: it lists (source, destination, why) for every
    file it could not copy, and its message is that list. Names the first failure (its
    destination as WHERE says it) and how many there were; keeps the first one's errno."""
    failures = [f for f in (e.args[0] if e.args else []) if isinstance(f, tuple) and len(f) == 3]
    if not failures:
        return e
    src, dst, why = failures[0]
    m = _ERRNO.match(str(why))
    reason = m.group(2) if m else str(why)
    more = f" ({len(failures)} files not copied)" if len(failures) > 1 else ""
    new = OSError(f"cannot copy {src} to {where(str(dst))}: {reason}{more}")
    new.errno = int(m.group(1)) if m else None
    return new
