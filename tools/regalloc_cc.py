"""A CC wrapper for tools/bench_regalloc.py: clang whose eviction decisions a policy answers.

    MLGO_RA_CLANG=clang-22 MLGO_RA_POLICY=runs/ra/policy MLGO_RA_FLAGS="-O2 -g0" \\
        python tools/regalloc_cc.py -c x.c -o x.o

Each single-source `-c` compile opens the regalloc channel and the policy (numpy, loaded
in this process) answers it; every answer is checked against the mask before clang sees
it. Other invocations (links, preprocessing, several sources at once, where several cc1
jobs would share one channel) run clang with the default allocator. Without
MLGO_RA_POLICY every invocation is plain: the baseline build uses the same wrapper.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".i")


def channel_compile(clang: str, args: list[str]) -> bool:
    """Only single-source compiles to an object can be served over one channel."""
    sources = [a for a in args if a.endswith(SOURCE_SUFFIXES) and not a.startswith("-")]
    return "-c" in args and len(sources) == 1 and not {"-E", "-M", "-MM"} & set(args)


def main() -> int:
    clang = os.environ["MLGO_RA_CLANG"]
    args = [*sys.argv[1:], *os.environ.get("MLGO_RA_FLAGS", "").split()]
    policy_dir = os.environ.get("MLGO_RA_POLICY")
    if not policy_dir or not channel_compile(clang, args):
        os.execvp(clang, [clang, *args])
    from mlgo.channel import ChannelError, compile_interactive
    from mlgo.policy import MLPPolicy
    from mlgo.problems import get_problem

    problem = get_problem("regalloc-eviction")
    policy = MLPPolicy.load(Path(policy_dir))
    try:
        result = compile_interactive(
            [clang, *args], policy, problem.channel_flags, 1800.0, problem.validate
        )
    except ChannelError as e:
        print(f"regalloc_cc: {e}", file=sys.stderr)
        return 1
    sys.stderr.write(result.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
