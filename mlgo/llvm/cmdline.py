"""What a clang command line writes: its object (or a link's program), and the files it
writes beside it (dependency files, time traces, optimization records, statistics, link
maps). A second compile or link of the same command (the size guard's, a recording's) must
write only its own output."""

from __future__ import annotations

from mlgo.llvm.driver import joined_output

# What MLGO_GUARD, or a policy's own `guard`, may name: `size`, the smaller of the policy's
# and the default's output kept (mlgo.serve.guard does it).
GUARDS = ("size",)
# How a compile by a gated policy's clang plugin tells the size guard that it made clang's
# own object: the plugin appends DEPARTED to the file DEPARTURES_ENV names (a name starting
# DEPARTURES_PREFIX, never created by it) at its first departure from LLVM's decision, and
# ADVISED when an advisor of it is done. ADVISED without DEPARTED: no second compile.
DEPARTURES_ENV = "MLGO_DEPARTURES"
DEPARTURES_PREFIX = "mlgo-departures-"
DEPARTED, ADVISED = "d", "."


def made_default_object(marks: str) -> bool:
    """Did the compile that left MARKS (what its plugin wrote) decide as clang would?"""
    return ADVISED in marks and DEPARTED not in marks


# Options that write a file besides the object, and those among them that take their value
# as the next argument.
SIDE_OUTPUTS = {"-MD", "-MMD", "-MP", "-MG", "-ftime-trace", "-fsave-optimization-record"}
SIDE_OUTPUTS_WITH_VALUE = {"-MF", "-MT", "-MQ", "-MJ", "--serialize-diagnostics"}
SIDE_OUTPUT_PREFIXES = (
    "-MF",
    "-MT",
    "-MQ",
    "-MJ",
    "-ftime-trace=",
    "-fsave-optimization-record=",
    "-foptimization-record-file=",
    "-save-stats",
    "--save-stats",
)


# lld options that write a file besides the program, or keep state between links (a ThinLTO
# cache), by their beginnings: a second link must write only its own output.
LINKER_SIDE_OUTPUTS = (
    "-M",  # -Map, -M: the link map
    "--Map",
    "--print-map",
    "--save-temps",
    "-save-temps",
    "--out-implib",
    "--thinlto-",
    "--cache-dir",
    "--lto-obj-path",
    "--lto-emit-asm",
    "--plugin-opt",
    "-plugin-opt",
    "--reproduce",
    "--dependency-file",
    "--why-extract",
)


def linker_options(args: list[str]) -> list[str]:
    """What ARGS pass to the linker: each -Wl,A,B's A and B, and each -Xlinker's value."""
    out: list[str] = []
    rest = iter(args)
    for a in rest:
        if a.startswith("-Wl,"):
            out += a.split(",")[1:]
        elif a == "-Xlinker":
            out.append(next(rest, ""))
    return out


def without_outputs(args: list[str]) -> list[str]:
    """ARGS without `-o` and every option that writes another file."""
    kept: list[str] = []
    rest = iter(args)
    for a in rest:
        if a == "-o" or a in SIDE_OUTPUTS_WITH_VALUE:
            next(rest, None)
        elif not (
            a in SIDE_OUTPUTS
            or joined_output(a)
            or a.startswith(SIDE_OUTPUT_PREFIXES)
            or (a.startswith("-Wp,") and any(p.startswith("-M") for p in a.split(",")[1:]))
        ):
            kept.append(a)
    return kept
