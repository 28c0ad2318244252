"""What a program's machine code costs on its own workload: each basic block's cycles, as
llvm-mca estimates them for this machine's CPU, times the number of times the workload
runs the block, summed over the blocks.

The counts come from the build itself. A program compiled with the workload's profile
(`-fprofile-instr-use`) and BLOCK_MAP_FLAGS carries, for each function, its measured entry
count and each machine block's frequency relative to the entry, as the code generator saw
them after every pass: a block's runs are the two multiplied. So each build (each eviction
policy) is costed on its own blocks, whatever the passes after register allocation
duplicated or merged; counts measured once on one build and mapped onto another build's
blocks by their numbers lose what was duplicated or merged differently (tried first: on
lua a policy's build looked 12% cheaper by blocks it no longer had).

This is the trace-based cost MLGO's team moved to once the frequency-weighted spill count
did not predict run time: a measured workload through each candidate's own code.
"""

from __future__ import annotations

import json
import re
import subprocess
from bisect import bisect_left
from dataclasses import dataclass
from pathlib import Path

from mlgo.llvm.toolchain import Toolchain
from mlgo.runtime.commands import BuildError

# Add to a profile-using build's flags: the block address map with each block's frequency
# and each function's entry count (they change no instruction).
BLOCK_MAP_FLAGS = (
    "-fbasic-block-address-map",
    "-mllvm",
    "-pgo-analysis-map=func-entry-count,bb-freq",
)
# llvm-mca's default of 100 cycles a call would drown every other instruction; a call's
# callee is costed in its own blocks
CALL_CYCLES = 2

BlockName = tuple[str, int, int]  # function, which of the functions so named, block number


@dataclass(frozen=True)
class Block:
    name: BlockName
    address: int
    size: int
    runs: float  # how often the profiled workload runs it


def block_map(binary: Path, tc: Toolchain) -> list[Block]:
    """Every block of a linked BINARY built with BLOCK_MAP_FLAGS and a profile, at its
    address, with its runs."""
    cmd = [tc.tool("llvm-readobj"), "--elf-output-style=JSON", "--bb-addr-map", str(binary)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{binary}: llvm-readobj failed: {proc.stderr.strip()[-200:]}")
    (file,) = json.loads(proc.stdout)
    if not file.get("BBAddrMap"):
        raise BuildError(f"{binary}: no block address map; build it with {BLOCK_MAP_FLAGS[0]}")
    seen: dict[str, int] = {}
    blocks = []
    for entry in file["BBAddrMap"]:
        function = entry["Function"]
        name = function["Name"]
        which = seen[name] = seen.get(name, -1) + 1
        entries = [bb for ranges in function["BB Ranges"] for bb in ranges["BB Entries"]]
        bases = [r["Base Address"] for r in function["BB Ranges"] for _ in r["BB Entries"]]
        pgo = function.get("PGO analyses", {})
        # a function compiled without the profile: no runs known, none counted
        frequencies = [b["Frequency"] for b in pgo.get("PGO BB entries", [])] or [0] * len(entries)
        per_entry = pgo.get("FuncEntryCount", 0) / frequencies[0] if frequencies[0] else 0.0
        for bb, base, frequency in zip(entries, bases, frequencies, strict=True):
            runs = frequency * per_entry
            blocks.append(Block((name, which, bb["ID"]), base + bb["Offset"], bb["Size"], runs))
    if not any(b.runs for b in blocks):
        raise BuildError(
            f"{binary}: no block ran in its profile; build it with {' '.join(BLOCK_MAP_FLAGS)} "
            "and -fprofile-instr-use"
        )
    return blocks


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


def workload_cycles(binary: Path, tc: Toolchain, known: dict[Code, float] | None = None) -> float:
    """The cycles BINARY's blocks take on its profiled workload (KNOWN: as `block_cycles`)."""
    ran = [b for b in block_map(binary, tc) if b.runs > 0]
    cycles = block_cycles(binary, ran, tc, known)
    return sum(b.runs * cycles.get(b.name, 0.0) for b in ran)
