"""Clang's instrumentation profiles (`-fprofile-instr-generate`): the flags that make and use
one, where each process writes its raw profile, and `llvm-profdata` merging and reading them.

A profile is made by a run of an instrumented build; what uses it (a corpus recorded with
its counts, a PGO build) compiles the same source with `-fprofile-instr-use`.
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path
from typing import BinaryIO

from mlgo.llvm.toolchain import Toolchain
from mlgo.runtime.commands import BuildError, run_logged
from mlgo.runtime.files import open_regular

INSTRUMENT_FLAGS = ["-fprofile-instr-generate"]
# clang's warnings that some functions have no counts (the run never reached them) or
# counts of another version of their code are expected of a profile from one run.
PROFILE_USE_FLAGS = ["-Wno-profile-instr-unprofiled", "-Wno-profile-instr-out-of-date"]
PROFILE_USE = "-fprofile-instr-use="
MERGED = "default.profdata"  # a merged profile's name in the directory that holds it
# What an indexed profile (llvm-profdata merge's) starts with, and the largest one used:
# a large program's profile is some megabytes; clang reads it whole into memory.
INDEXED_MAGIC = b"\xfflprofi\x81"
MAX_PROFILE_BYTES = 1 << 30


def open_profile(path: Path) -> BinaryIO | str:
    """PATH opened as an indexed profile, or why it is not one mlgo uses: a regular file
    (opened without blocking), the user's or root's, of at most MAX_PROFILE_BYTES, that
    starts with INDEXED_MAGIC (the decisions wrappers check the same in sh)."""
    try:
        f = open_regular(path)
    except OSError as e:
        return f"cannot be read ({e.strerror})"
    if f is None:
        return "not a regular file"
    st = os.fstat(f.fileno())
    problem = (
        "not yours or root's" if st.st_uid not in (os.getuid(), 0)
        else f"larger than {MAX_PROFILE_BYTES >> 20} MiB" if st.st_size > MAX_PROFILE_BYTES
        else "not an indexed profile" if f.read(len(INDEXED_MAGIC)) != INDEXED_MAGIC
        else None
    )  # fmt: skip
    if problem is not None:
        f.close()
        return problem
    f.seek(0)
    return f


def use_flags(profile: Path) -> list[str]:
    """What a compile adds to be optimized with PROFILE's counts."""
    return [f"{PROFILE_USE}{profile.resolve()}", *PROFILE_USE_FLAGS]


def raw_pattern(raw: Path) -> str:
    """LLVM_PROFILE_FILE for an instrumented run: each process (%p) and each instrumented
    program or library in it (%m) writes a raw profile of its own into the directory RAW,
    so that a workload of several processes loses none."""
    return str(raw.resolve() / "%m-%p.profraw")


def merge_profiles(tc: Toolchain, raws: list[Path], merged: Path, log: Path, what: str) -> Path:
    """RAWS merged by llvm-profdata into MERGED, which appears whole or not at all; a
    failure is a BuildError naming WHAT and LOG."""
    tmp = merged.with_name(f".{merged.name}.tmp")
    merge = [tc.tool("llvm-profdata"), "merge", "-o", str(tmp), *map(str, raws)]
    run_logged(merge, merged.parent, log, 600, what=f"{what}: llvm-profdata merge")
    tmp.replace(merged)
    return merged


def most_counted(tc: Toolchain, profile: Path) -> int:
    """The largest count of any function entry or block in the merged PROFILE: 0 when the
    run reached none of the instrumented code (a library loaded and never called)."""
    cmd = [tc.tool("llvm-profdata"), "show", str(profile)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{profile}: llvm-profdata show failed: {proc.stderr.strip()[-200:]}")
    counts = re.findall(r"^Maximum (?:function|internal block) count: (\d+)$", proc.stdout, re.M)
    if not counts:
        raise BuildError(f"{profile}: llvm-profdata show printed no maximum count")
    return max(map(int, counts))


# LLVM's ProfileSummaryInfo calls a count hot from the one above which 99% of all counts lie
# (-profile-summary-cutoff-hot=990000): the line of `llvm-profdata show --detailed-summary`.
HOT_LINE = re.compile(r"with count >= (\d+) account for 99% of the total counts")
FUNCTION = re.compile(
    r"^  (\S+):\n(?:    .*\n)*?    Function count: (\d+)\n(?:    Block counts: \[([\d, ]*)\])?",
    re.M,
)


def hot_functions(tc: Toolchain, profile: Path) -> tuple[int, dict[str, int]]:
    """The count PROFILE's summary calls hot, as clang's inliner reads it (HOT_LINE), and
    the functions with an entry or block that hot, by name (a static one's as the profile
    names it, `file.c:name`), with their largest count."""
    cmd = [tc.tool("llvm-profdata"), "show", "--detailed-summary", "--all-functions", "--counts"]
    proc = subprocess.run([*cmd, str(profile)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{profile}: llvm-profdata show failed: {proc.stderr.strip()[-200:]}")
    line = HOT_LINE.search(proc.stdout)
    if line is None:
        raise BuildError(f"{profile}: llvm-profdata show printed no 99% line in its summary")
    hot = int(line[1])
    counted = {
        name: max([int(entry), *(int(b) for b in (blocks or "").split(",") if b.strip())])
        for name, entry, blocks in FUNCTION.findall(proc.stdout)
    }
    return hot, {name: n for name, n in counted.items() if n >= hot}
