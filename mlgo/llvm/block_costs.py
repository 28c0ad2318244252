"""What a program's machine code costs on its own workload: each basic block's cycles, as
llvm-mca estimates them for this machine's CPU, and the 64-byte lines of code it spans,
which the front end fetches each time (LINE_BYTES), times the number of times the
workload runs the block, summed over the blocks.

llvm-mca models the back end only: where a block lies does not change its estimate. But
a block that straddles a line boundary costs a second fetch every time it runs, and on
lua, whose time is an interpreter loop, builds with the same cycles ran 2-7% apart as the
lines their hot blocks span said. The reward counts a line as a cycle: on lua and zstd,
where it was chosen, the sum ranked run time better than either part alone; on sqlite3,
held out, the lines alone did (docs/records/regalloc-eviction.md).

The blocks come from the build itself: compiled with BLOCK_MAP_FLAGS, a program lists each
function's machine blocks at their addresses, as the code generator left them after every
pass. Their runs are counted on that same program: the workload runs once under callgrind
(CALLGRIND_OPTIONS), which reports how often each instruction ran, and a block runs as often
as its first instruction. So each build (each eviction policy) is costed on its own blocks
with exact counts.

Two designs came first and failed. Counts measured once on one build and mapped onto
another build's blocks by their numbers lose what was duplicated or merged differently (on
lua a policy's build looked 12% cheaper by blocks it no longer had). The block frequencies
a profile-using build records beside its map (`-pgo-analysis-map=bb-freq`) are LLVM's
estimates, not counts: in an interpreter's dispatch loop, whose control flow is
irreducible, they put lua's `luaV_execute` at 60,874 block runs where callgrind counts
422,918,909, so the function that is most of lua's time weighed nothing.

This is the trace-based cost MLGO's team moved to once the frequency-weighted spill count
did not predict run time: a measured workload through each candidate's own code.
"""

from __future__ import annotations

import json
import re
import subprocess
from bisect import bisect_left
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from mlgo.llvm.toolchain import Toolchain
from mlgo.runtime.commands import BuildError

# Add to a build's flags: the block address map (it changes no instruction).
BLOCK_MAP_FLAGS = ("-fbasic-block-address-map",)
# valgrind's options for a workload whose instructions are counted one by one: each
# instruction's count by its address in its object, uncompressed (`executions` reads them)
CALLGRIND_OPTIONS = (
    "--tool=callgrind",
    "--dump-instr=yes",
    "--compress-pos=no",
    "--compress-strings=no",
)
# llvm-mca's default of 100 cycles a call would drown every other instruction; a call's
# callee is costed in its own blocks
CALL_CYCLES = 2

# The front end fetches code and caches decoded instructions by aligned 64-byte lines.
LINE_BYTES = 64

BlockName = tuple[str, int, int]  # function, which of the functions so named, block number


@dataclass(frozen=True)
class Block:
    name: BlockName
    address: int
    size: int

    @property
    def lines(self) -> int:
        """The LINE_BYTES lines of code the block spans."""
        return (self.address + self.size - 1) // LINE_BYTES - self.address // LINE_BYTES + 1


def block_map(binary: Path, tc: Toolchain) -> list[Block]:
    """Every block of a linked BINARY built with BLOCK_MAP_FLAGS, at its address (none
    without them)."""
    cmd = [tc.tool("llvm-readobj"), "--elf-output-style=JSON", "--bb-addr-map", str(binary)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{binary}: llvm-readobj failed: {proc.stderr.strip()[-200:]}")
    (file,) = json.loads(proc.stdout)
    seen: dict[str, int] = {}
    blocks = []
    for entry in file.get("BBAddrMap", []):
        name = entry["Function"]["Name"]
        which = seen[name] = seen.get(name, -1) + 1
        for ranges in entry["Function"]["BB Ranges"]:
            for bb in ranges["BB Entries"]:
                address = ranges["Base Address"] + bb["Offset"]
                blocks.append(Block((name, which, bb["ID"]), address, bb["Size"]))
    return blocks


def executions(outputs: Iterable[Path], tree: Path) -> dict[Path, Counter[int]]:
    """How often each instruction ran, by address, in each object of the build TREE (its
    programs and shared libraries, resolved) that a workload run with CALLGRIND_OPTIONS
    ran, from its callgrind OUTPUTS (one per process; the system's programs and libraries
    are not the build's). The line after a `calls=` line is the call's inclusive cost, the
    callee's instructions, not the call's own: skipped."""
    counts: dict[Path, Counter[int]] = {}
    inside: dict[str, Counter[int] | None] = {}
    root = tree.resolve()
    for output in outputs:
        mine: Counter[int] | None = None
        after_call = False
        with open(output, errors="replace") as lines:
            for line in lines:
                if after_call:
                    after_call = False
                elif line.startswith("ob="):
                    obj = line[3:].strip()
                    if obj not in inside:
                        path = Path(obj).resolve()
                        ours = path.is_relative_to(root) and path.is_file()
                        inside[obj] = counts.setdefault(path, Counter()) if ours else None
                    mine = inside[obj]
                elif line.startswith("calls="):
                    after_call = True
                elif mine is not None and line.startswith("0x"):
                    address, _line, count = line.split()
                    mine[int(address, 16)] += int(count)
    return {path: ran for path, ran in counts.items() if ran}


_OPERAND_NOISE = re.compile(r"\s*(<[^>]*>|#.*)$")


def _instructions(binary: Path, tc: Toolchain) -> dict[int, str]:
    """BINARY's instructions by address, in AT&T syntax as llvm-mca reads it."""
    cmd = [tc.tool("llvm-objdump"), "-d", "--no-show-raw-insn", str(binary)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{binary}: llvm-objdump failed: {proc.stderr.strip()[-200:]}")
    out = {}
    for line in proc.stdout.splitlines():
        address, sep, text = line.partition(":")
        if sep and text.startswith(" ") and re.fullmatch(r"\s*[0-9a-f]+", address):
            out[int(address, 16)] = _OPERAND_NOISE.sub("", text.strip())
    return out


Code = tuple[str, ...]  # a block's instructions


def block_cycles(
    binary: Path, blocks: list[Block], tc: Toolchain, known: dict[Code, float] | None = None
) -> dict[BlockName, float]:
    """llvm-mca's cycles per run of each of BINARY's BLOCKS, for this machine. KNOWN:
    cycles of code seen before (another build's), read and added to."""
    known = {} if known is None else known
    instructions = _instructions(binary, tc)
    by_address = sorted(instructions)
    codes: dict[BlockName, Code] = {}
    for b in blocks:
        first = bisect_left(by_address, b.address)
        last = bisect_left(by_address, b.address + b.size)
        if code := tuple(instructions[a] for a in by_address[first:last]):
            codes[b.name] = code
    new = sorted({c for c in codes.values() if c not in known})
    if new:
        known.update(zip(new, _mca_cycles(new, binary, tc), strict=True))
    return {name: known[code] for name, code in codes.items()}


def _mca_cycles(codes: list[Code], binary: Path, tc: Toolchain) -> list[float]:
    text = "".join(
        f"# LLVM-MCA-BEGIN b{i}\n" + "".join(f"\t{c}\n" for c in code) + "# LLVM-MCA-END\n"
        for i, code in enumerate(codes)
    )
    cmd = [
        *(tc.tool("llvm-mca"), "-mcpu=native", "-json", f"-call-latency={CALL_CYCLES}"),
        "-skip-unsupported-instructions=lack-sched",
    ]
    proc = subprocess.run(cmd, input=text, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{binary}: llvm-mca failed: {proc.stderr.strip()[-300:]}")
    summaries = [r["SummaryView"] for r in json.loads(proc.stdout)["CodeRegions"]]
    return [s["TotalCycles"] / s["Iterations"] for s in summaries]


@dataclass(frozen=True)
class WorkloadCost:
    """A program's blocks on its workload: llvm-mca's cycles and the lines fetched."""

    cycles: float
    lines: int

    @property
    def cycles_and_lines(self) -> float:
        """The reward: a line fetched costs a cycle, on top of the blocks' own."""
        return self.cycles + self.lines


def workload_cost(
    ran: dict[Path, Counter[int]], tc: Toolchain, known: dict[Code, float] | None = None
) -> WorkloadCost:
    """What the blocks of a build's objects cost on the workload that ran each of their
    instructions RAN[object][address] times (`executions`), summed over the objects;
    KNOWN: as `block_cycles`. An object without a block map (a prebuilt library in the
    tree) is left out, but one of them must have it."""
    cycles, lines, mapped = 0.0, 0, False
    for binary, executed in ran.items():
        blocks = block_map(binary, tc)
        mapped |= bool(blocks)
        # an empty block (a label the code generator kept) shares its address with the next
        runs = {b: executed[b.address] for b in blocks if b.size and executed[b.address]}
        if runs:
            per_run = block_cycles(binary, list(runs), tc, known)
            cycles += sum(n * per_run.get(b.name, 0.0) for b, n in runs.items())
            lines += sum(n * b.lines for b, n in runs.items())
    where = ", ".join(sorted(p.name for p in ran)) or "no program of the build"
    if not mapped:
        raise BuildError(f"{where}: no block address map; build it with {BLOCK_MAP_FLAGS[0]}")
    if not lines:
        raise BuildError(f"{where}: none of its blocks ran in the workload counted")
    return WorkloadCost(cycles, lines)
