"""Strings written into generated C and C++ source (the plugin's policy header, the native
wrapper's allow-list): escaped so that no string, wherever it came from, can end its literal."""

from __future__ import annotations

import string

_SAFE = frozenset(string.ascii_letters + string.digits + "_:.-=+/, ")


def c_string(text: str) -> str:
    """TEXT as a C string literal: letters, digits and a few marks as they are, every other
    byte (of its UTF-8) as a three-digit octal escape."""
    body = "".join(chr(b) if chr(b) in _SAFE else f"\\{b:03o}" for b in text.encode("utf-8"))
    return f'"{body}"'
