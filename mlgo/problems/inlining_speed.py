"""Inlining for speed: the inliner's decision at -O2, for the fastest program on the user's
own workload.

The decision, features and network are inlining-size's; the level is -O2, where clang's own
heuristic inlines far more, and the aim is speed. Nothing in a module says how often its
call sites run (LLVM's features carry no profile), so no corpus cost stands for speed: a
policy is trained and judged only on a workload, each candidate built whole and costed on
its run (`mlgo tune --bench`, `mlgo.programs.speed`). Its start is clang's own -O2
decisions on that code, cloned (`chain.cloned_start`), so that a search departs from the
heuristic the user builds with; its corpus cost is the code's size, reported beside.

Which heuristic: clang's inline threshold moves every call site one way, and on cmark 400
made the program 1.3% faster where every other value tried made it slower
(docs/records/inlining-speed.md). A search of network weights around clang's answers did not find
that, so a policy carries its threshold (`MLPPolicy.base`), and a tune judges clang's own
decisions at each of THRESHOLDS on the workload, and trains departures from the fastest
(`chain.based_start`). Tuned so on three programs, none was faster with confidence: the
reward prefers more inlining than the clock does (docs/records/inlining-speed.md).
"""

from __future__ import annotations

from mlgo.problems import with_advisor_flags
from mlgo.problems.inlining_size import PROBLEM as INLINING_SIZE

# LLVM's ML inliner stops inlining in a module grown to twice its size
# (-ml-advisor-size-increase-threshold, 2 by default), which clang's own -O2 inliner does
# not: with that cap, clang's own answers given back made cmark's utf8.c 18% smaller than
# clang -O2 does. Lifted, they build what clang builds.
UNCAPPED = ("-mllvm", "-ml-advisor-size-increase-threshold=1000")
# Around -O2's own 225 (without it: not given, it is the default), to the point past which
# cmark and serd grew by a fifth and more without running faster
THRESHOLDS = (150, 300, 400, 500, 700, 1000)

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
    base_switch="-inline-threshold",
    base_grid=THRESHOLDS,
)
