"""Inlining for speed: the inliner's decision at -O2, for the fastest program on the user's
own workload.

The decision, features and network are inlining-size's; the level is -O2, where clang's own
heuristic inlines far more, and the aim is speed. Nothing in a module says how often its
call sites run (LLVM's features carry no profile), so no corpus cost stands for speed: a
policy is trained and judged only on a workload, each candidate built whole and costed on
its run (`mlgo tune --bench`, `mlgo.programs.speed`). Its start is clang's own -O2
decisions on that code, cloned (`tune.cloned_start`), so that a search departs from the
heuristic the user builds with; its corpus cost is the code's size, reported beside.
"""

from __future__ import annotations

from mlgo.problems import with_advisor_flags
from mlgo.problems.inlining_size import PROBLEM as INLINING_SIZE

# LLVM's ML inliner stops inlining in a module grown to twice its size
# (-ml-advisor-size-increase-threshold, 2 by default), which clang's own -O2 inliner does
# not: with that cap, clang's own answers given back made cmark's utf8.c 18% smaller than
# clang -O2 does. Lifted, they build what clang builds.
UNCAPPED = ("-mllvm", "-ml-advisor-size-increase-threshold=1000")

PROBLEM = with_advisor_flags(
    INLINING_SIZE,
    UNCAPPED,
    name="inlining-speed",
    summary="inline or not at each call site, for the least time on a workload (clang -O2)",
    opt_level="-O2",
    aim="speed",
    needs_workload=True,
    # its objects' .text itself: the size beside the speed, not a reward of its own
    reward_metric="text_size",
)
