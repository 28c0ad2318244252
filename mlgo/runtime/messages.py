"""One line that says what went wrong, out of a tool's output or an exception.

Every error the user sees is one line; this is where that line is chosen, so that a
failed build, a failed AOT compile and a failed worker task are reported alike.
"""

from __future__ import annotations

import re

# An error named as such: "error:", "fatal error:", "make: *** ... Error 2", "ValueError:".
# Not "error.o" or "strerror", which are file and function names in a build log.
_ERROR = re.compile(r"(?:\berror|[a-z]Error)\b\s*(?::|\d)", re.IGNORECASE)


def error_line(what: str | BaseException, limit: int = 300) -> str:
    """The line that says what went wrong. For an exception, its message's first line (its
    type's name if it has none); for a tool's output or log, the first line that names an
    error, else the last line (where a tool says why it stopped)."""
    if isinstance(what, BaseException):
        lines = str(what).strip().splitlines()
        return lines[0].strip()[:limit] if lines else type(what).__name__
    lines = [ln.strip() for ln in what.splitlines() if ln.strip()]
    named = [ln for ln in lines if _ERROR.search(ln)]
    return (named[:1] or lines[-1:] or ["(no output)"])[0][:limit]
