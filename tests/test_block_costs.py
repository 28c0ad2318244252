"""The block cost: each block of a build's own map, its runs counted under callgrind on
that build, llvm-mca's cycles and the lines it spans."""

from __future__ import annotations

import subprocess
from collections import Counter
from pathlib import Path

import pytest

from mlgo.llvm.block_costs import (
    BLOCK_MAP_FLAGS,
    CALLGRIND_OPTIONS,
    Block,
    block_map,
    executions,
    workload_cost,
)
from mlgo.llvm.toolchain import Toolchain
from mlgo.runtime.commands import BuildError
from tests.conftest import DATA

SOURCE = DATA / "hot.c"
ITERATIONS = 5000  # hot.c's loop, over 100 calls of mix


def build(tc: Toolchain, out: Path, *flags: str) -> Path:
    cmd = [tc.clang, "-O2", "-fno-unroll-loops", "-fno-vectorize", *BLOCK_MAP_FLAGS, *flags]
    subprocess.run([*cmd, str(SOURCE), "-o", str(out)], check=True, capture_output=True)
    return out


def callgrind(binary: Path, tmp: Path) -> Path:
    """Callgrind's output of BINARY on hot.c's workload."""
    out = tmp / f"{binary.name}.callgrind"
    cmd = ["valgrind", *CALLGRIND_OPTIONS, f"--callgrind-out-file={out}", "-q"]
    subprocess.run([*cmd, str(binary), str(ITERATIONS)], check=True, capture_output=True)
    return out


def counted(binary: Path, tmp: Path) -> dict[Path, Counter[int]]:
    """How often each of BINARY's instructions ran on hot.c's workload, by its path."""
    return executions([callgrind(binary, tmp)], binary.parent)


def test_runs_are_counted_exactly_and_a_build_that_spills_costs_more(tc, tmp_path):
    default = build(tc, tmp_path / "hot")
    ran = counted(default, tmp_path)
    assert list(ran) == [default.resolve()]  # the build's program alone: not libc's code
    runs = {b.name: ran[default][b.address] for b in block_map(default, tc)}
    assert max(n for (f, _, _), n in runs.items() if f == "mix") == ITERATIONS
    # an entry runs as often as its function is called, the calls' callees not counted in
    assert runs[("mix", 0, 0)] == 100 and runs[("main", 0, 0)] == 1
    # the same program allowed four registers: spills in the loop
    (tmp_path / "spilling").mkdir()
    spilling = build(tc, tmp_path / "spilling" / "hot", "-mllvm", "-stress-regalloc=4")
    spilled = workload_cost(counted(spilling, tmp_path), tc)
    cost = workload_cost(ran, tc)
    assert spilled.cycles > 1.3 * cost.cycles and spilled.lines > cost.lines
    # each run of a block fetches the lines it spans
    blocks = block_map(default, tc)
    assert cost.lines == sum(ran[default][b.address] * b.lines for b in blocks if b.size)
    assert cost.cycles_and_lines == cost.cycles + cost.lines


def test_a_program_without_its_block_map_or_its_counts_is_refused(tc, tmp_path):
    plain = tmp_path / "plain"
    subprocess.run([tc.clang, "-O2", str(SOURCE), "-o", str(plain)], check=True)
    with pytest.raises(BuildError, match="plain: no block address map; build it with"):
        workload_cost(counted(plain, tmp_path), tc)
    (tmp_path / "mapped").mkdir()
    mapped = build(tc, tmp_path / "mapped" / "hot")
    with pytest.raises(BuildError, match="hot: none of its blocks ran"):
        workload_cost({mapped: Counter({1: 1})}, tc)
    # another tree's program counts nothing in this tree, however alike their addresses
    (tmp_path / "other").mkdir()
    other = build(tc, tmp_path / "other" / "hot")
    assert counted(other, tmp_path) and not executions([callgrind(other, tmp_path)], mapped.parent)


@pytest.mark.unit
def test_a_block_spans_the_lines_its_bytes_touch():
    assert Block(("f", 0, 0), 0, 64).lines == 1 and Block(("f", 0, 0), 60, 8).lines == 2
    assert Block(("f", 0, 0), 64, 1).lines == 1 and Block(("f", 0, 0), 63, 66).lines == 3
