"""Inlining for size in the link of a full-LTO build (`-Oz -flto`, lld).

The link merges the program into one module and runs the inliner again over it, across what
were separate files. The decision, its features and its reward are inlining-size's; what
differs is the code it sees: a corpus of merged modules, one per linked program or shared
library (`mlgo corpus record --lto full`), whose `.text` is the program's, with no copy of
an inline function counted per object. A policy trained per file makes the link worse
(measured in docs/records/inlining-size.md), so each serves only at its own stage.
"""

from __future__ import annotations

from dataclasses import replace

from mlgo.problems.inlining_size import PROBLEM as PER_FILE

PROBLEM = replace(
    PER_FILE,
    name="inlining-size-link",
    summary="inline or not at each call site of a full-LTO link, for the smallest program",
    stage="link",
    starts_from=PER_FILE.name,
    # its objects are whole programs' (or their backends', whose link chose each inline
    # function's one copy already): .text itself, with no copy to share out
    reward_metric="text_size",
)
