"""Which language a compile is, as clang's driver reads it: C or C++.

A policy may be calibrated for one language only (C++'s inline and template functions, kept
in every module that uses them, grow where C's do not), so the service needs each compile's
language, and an evaluation each module's. Standard library only: `mlgo-cc` imports this on
every compiler invocation.
"""

from __future__ import annotations

from collections.abc import Callable

LANGUAGES = ("c", "c++")
LABELS = {"c": "C", "c++": "C++"}
_SUFFIXES = {".c": "c", ".i": "c", ".ii": "c++", ".C": "c++"} | {
    s: "c++" for s in (".cc", ".cp", ".cpp", ".cxx", ".c++", ".CPP")
}


def suffix_language(name: str, cxx_driver: bool = False) -> str | None:
    """The language of the source file NAME by its suffix (clang++ compiles C as C++), None
    for any other (Objective-C, assembler, ...)."""
    dot = name.rfind(".")
    language = _SUFFIXES.get(name[dot:]) if dot > 0 else None
    return "c++" if language == "c" and cxx_driver else language


def source_language(
    args: list[str], cxx_driver: bool, is_source: Callable[[str], bool]
) -> str | None:
    """The language of the sources among a driver's ARGS (IS_SOURCE tells them): set by the
    last `-x LANG` before each, else by its suffix. None when they are of more than one
    language, or of one neither C nor C++."""
    found: set[str | None] = set()
    x = "none"
    rest = iter(args)
    for a in rest:
        if a == "-x":
            x = next(rest, "none")
        elif a.startswith("-x") and len(a) > 2:
            x = a[2:]
        elif is_source(a):
            found.add(suffix_language(a, cxx_driver) if x == "none" else _x_language(x))
    return found.pop() if len(found) == 1 else None


def _x_language(x: str) -> str | None:
    return x if x in LANGUAGES else None


def label(language: str | None) -> str:
    """How a message names LANGUAGE (None: what `source_language` cannot tell)."""
    return LABELS.get(language or "", "mixed-language or other")
