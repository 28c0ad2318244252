"""The languages mlgo tells compiles apart by: C and C++ (mlgo.llvm.driver reads which one a
compile is, as clang's driver does).

A policy may be calibrated for one language only (C++'s inline and template functions, kept
in every module that uses them, grow where C's do not), so the service needs each compile's
language, and an evaluation each module's. Standard library only: `mlgo-cc` imports this on
every compiler invocation.
"""

from __future__ import annotations

LANGUAGES = ("c", "c++")
LABELS = {"c": "C", "c++": "C++"}


def label(language: str | None) -> str:
    """How a message names LANGUAGE (None: what `driver.compile_language` cannot tell)."""
    return LABELS.get(language or "", "mixed-language or other")
