"""Inlining for size in the link of a ThinLTO build (`-Oz -flto=thin`, lld).

Each of the link's backends optimizes one file's module again, after importing from the
others the functions it calls, and its inliner decides once more, now across files. The
decision, features and reward are inlining-size's; the code differs: a corpus of backend
modules after import (`mlgo corpus record --lto thin`), grouped by the program or shared
library they are linked into. A module's `.text` alone does not say what the program keeps
(an inline function's linkonce_odr copy is kept once, an imported one is not emitted), so a
policy is judged on whole programs (`lto.thin_text`), and serves only at its own stage.
"""

from __future__ import annotations

from dataclasses import replace

from mlgo.problems.inlining_size import PROBLEM as PER_FILE

PROBLEM = replace(
    PER_FILE,
    name="inlining-size-thin",
    summary="inline or not at each call site of a ThinLTO link's backends, for the smallest size",
    stage="thin-link",
    starts_from=PER_FILE.name,
    # its objects are whole programs' (or their backends', whose link chose each inline
    # function's one copy already): .text itself, with no copy to share out
    reward_metric="text_size",
)
