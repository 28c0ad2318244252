"""The block cost: callgrind's counts named by the block address map, llvm-mca's cycles."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mlgo.llvm.block_costs import BLOCK_MAP_FLAGS, execution_counts, workload_cycles
from mlgo.llvm.toolchain import Toolchain
from mlgo.runtime.commands import BuildError
from tests.conftest import DATA


def build(tc: Toolchain, out: Path, *flags: str) -> Path:
    cmd = [tc.clang, "-O2", "-fno-unroll-loops", *BLOCK_MAP_FLAGS, *flags, str(DATA / "hot.c")]
    subprocess.run([*cmd, "-o", str(out)], check=True)
    return out


def test_counts_name_each_block_and_a_build_that_spills_costs_more(tc, tmp_path):
    default = build(tc, tmp_path / "hot")
    counts = execution_counts(default, [["./hot", "5000"]], tmp_path, tc)
    mix = {block: n for (function, _, block), n in counts.items() if function == "mix"}
    assert max(mix.values()) == 5000  # the loop's block, once per iteration
    assert counts[("main", 0, 0)] == 1
    # the same program allowed four registers: the same blocks, with spills in the loop
    spilling = build(tc, tmp_path / "hot4", "-mllvm", "-stress-regalloc=4")
    assert workload_cycles(spilling, counts, tc) > 1.3 * workload_cycles(default, counts, tc)


def test_a_program_without_its_block_map_is_refused(tc, tmp_path):
    plain = tmp_path / "plain"
    subprocess.run([tc.clang, "-O2", str(DATA / "hot.c"), "-o", str(plain)], check=True)
    with pytest.raises(BuildError, match="no block address map; build it with"):
        workload_cycles(plain, {("mix", 0, 0): 1}, tc)
