"""The block cost: each block's runs from the profile the build used, llvm-mca's cycles."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from mlgo.llvm.block_costs import BLOCK_MAP_FLAGS, block_map, workload_cycles
from mlgo.llvm.toolchain import Toolchain
from mlgo.runtime.commands import BuildError
from tests.conftest import DATA

SOURCE = DATA / "hot.c"


def profile(tc: Toolchain, tmp: Path) -> Path:
    """hot.c's profile of 5000 iterations."""
    instrumented = tmp / "instrumented"
    subprocess.run(
        [tc.clang, "-O2", "-fprofile-instr-generate", str(SOURCE), "-o", str(instrumented)],
        check=True,
    )
    env = {**os.environ, "LLVM_PROFILE_FILE": str(tmp / "hot.profraw")}
    subprocess.run([instrumented, "5000"], check=True, env=env, capture_output=True)
    merged = tmp / "hot.profdata"
    subprocess.run(
        [tc.tool("llvm-profdata"), "merge", "-o", str(merged), str(tmp / "hot.profraw")], check=True
    )
    return merged


def build(tc: Toolchain, out: Path, *flags: str) -> Path:
    cmd = [
        tc.clang,
        "-O2",
        "-fno-unroll-loops",
        "-fno-vectorize",
        *BLOCK_MAP_FLAGS,
        *flags,
        str(SOURCE),
    ]
    subprocess.run([*cmd, "-o", str(out)], check=True, capture_output=True)
    return out


def test_runs_come_from_the_profile_and_a_build_that_spills_costs_more(tc, tmp_path):
    use = f"-fprofile-instr-use={profile(tc, tmp_path)}"
    default = build(tc, tmp_path / "hot", use)
    runs = {b.name: b.runs for b in block_map(default, tc)}
    # the loop runs 5000 times over 100 calls: its frequency is the profile's branch
    # weights, each one more than counted (clang's smoothing), here 1% off
    assert max(r for (f, _, _), r in runs.items() if f == "mix") == pytest.approx(5000, rel=0.02)
    assert runs[("mix", 0, 0)] == pytest.approx(100) and runs[("main", 0, 0)] == pytest.approx(1)
    # the same program allowed four registers: spills in the loop
    spilling = build(tc, tmp_path / "hot4", use, "-mllvm", "-stress-regalloc=4")
    assert workload_cycles(spilling, tc) > 1.3 * workload_cycles(default, tc)


def test_a_program_without_its_block_map_or_profile_is_refused(tc, tmp_path):
    plain = tmp_path / "plain"
    subprocess.run([tc.clang, "-O2", str(SOURCE), "-o", str(plain)], check=True)
    with pytest.raises(BuildError, match="no block address map; build it with"):
        workload_cycles(plain, tc)
    unprofiled = build(tc, tmp_path / "unprofiled")
    with pytest.raises(BuildError, match="no block ran in its profile"):
        workload_cycles(unprofiled, tc)
