"""What a program's machine code costs on its own workload: each basic block's cycles, as
llvm-mca estimates them for this machine's CPU, times the number of times the workload
ran the block, summed over the blocks.

The counts are measured once, on the default build: callgrind counts every instruction's
executions, and the block address map (`-fbasic-block-address-map`, which leaves `.text`
as it is) names each block by its function and machine block number. Another build of the
same program (another eviction policy) is costed under the same names: the default's
workload run through that build's code. This is the trace-based cost MLGO's team moved to
after the frequency-weighted spill count did not predict run time. Register allocation
leaves the blocks as they are, so the names carry over; a block the default never ran
costs nothing.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

from elftools.elf.elffile import ELFFile

from mlgo.llvm.toolchain import Toolchain
from mlgo.runtime.commands import BuildError

# add to a build's flags so that its blocks can be named (it changes no instruction)
BLOCK_MAP_FLAGS = ("-fbasic-block-address-map",)
# llvm-mca's default of 100 cycles a call would drown every other instruction; a call's
# callee is costed in its own blocks
CALL_CYCLES = 2

BlockName = tuple[str, int, int]  # function, which of the functions so named, block number


@dataclass(frozen=True)
class Block:
    name: BlockName
    address: int
    size: int


def block_map(binary: Path, tc: Toolchain) -> list[Block]:
    """Every block of a linked BINARY built with BLOCK_MAP_FLAGS, at its address."""
    cmd = [tc.tool("llvm-readobj"), "--elf-output-style=JSON", "--bb-addr-map", str(binary)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise BuildError(f"{binary}: llvm-readobj failed: {proc.stderr.strip()[-200:]}")
    (file,) = json.loads(proc.stdout)
    if not file.get("BBAddrMap"):
        raise BuildError(f"{binary}: no block address map; build it with {BLOCK_MAP_FLAGS[0]}")
    seen: Counter[str] = Counter()
    blocks = []
    for entry in file["BBAddrMap"]:
        function = entry["Function"]
        name = function["Name"]
        which = seen[name]
        seen[name] += 1
        for ranges in function["BB Ranges"]:
            base = ranges["Base Address"]
            for bb in ranges["BB Entries"]:
                blocks.append(Block((name, which, bb["ID"]), base + bb["Offset"], bb["Size"]))
    return blocks


def _function_starts(binary: Path) -> dict[str, int]:
    with binary.open("rb") as f:
        symbols = ELFFile(f).get_section_by_name(".symtab")
        if symbols is None:
            raise BuildError(f"{binary}: stripped; its blocks cannot be named")
        return {
            s.name: s["st_value"]
            for s in symbols.iter_symbols()
            if s["st_info"]["type"] == "STT_FUNC" and s["st_value"]
        }


_COST_LINE = re.compile(r"^(0x[0-9a-f]+) (\d+)")


def _callgrind_counts(out: Path, binary: Path) -> tuple[dict[int, int], dict[str, int]]:
    """From one callgrind output (--dump-instr=yes, uncompressed): each executed
    instruction of BINARY's own code, at its run-time address, and how often it ran; and
    each function's lowest run-time address seen (its entry, for a function entered)."""
    counts: dict[int, int] = defaultdict(int)
    lowest: dict[str, int] = {}
    ours = skip_next = False
    function = ""
    for line in out.read_text(errors="replace").splitlines():
        if line.startswith("ob="):
            ours = Path(line[3:]).resolve() == binary.resolve()
        elif line.startswith("fn="):
            function = line[3:]
        elif line.startswith("calls="):
            skip_next = True  # the next cost line is the call's inclusive cost
        elif m := _COST_LINE.match(line):
            if skip_next:
                skip_next = False
            elif ours:
                address = int(m[1], 16)
                counts[address] += int(m[2])
                lowest[function] = min(lowest.get(function, address), address)
    return counts, lowest


def execution_counts(
    binary: Path, commands: list[list[str]], cwd: Path, tc: Toolchain
) -> dict[BlockName, int]:
    """How many times COMMANDS (run in CWD, under callgrind) ran each block of BINARY."""
    binary = binary.resolve()
    counts: dict[int, int] = defaultdict(int)
    lowest: dict[str, int] = {}
    with tempfile.TemporaryDirectory(prefix="mlgo-blocks-") as tmp:
        for i, argv in enumerate(commands):
            cmd = [
                *("valgrind", "--tool=callgrind", "--trace-children=yes", "--dump-instr=yes"),
                *("--dump-line=no", "--compress-pos=no", "--compress-strings=no", "--demangle=no"),
                f"--callgrind-out-file={tmp}/{i}.%p.out",
                f"--log-file={tmp}/{i}.%p.log",
                *argv,
            ]
            proc = subprocess.run(cmd, cwd=cwd, capture_output=True)
            if proc.returncode != 0:
                raise BuildError(f"{' '.join(argv)} failed under callgrind in {cwd}")
        for out in Path(tmp).glob("*.out"):
            some, entries = _callgrind_counts(out, binary)
            for address, n in some.items():
                counts[address] += n
            lowest.update(entries)
    starts = _function_starts(binary)
    shifts = Counter(lowest[f] - starts[f] for f in lowest if f in starts)
    if not shifts:
        raise BuildError(f"the workload never ran {binary}")
    shift = shifts.most_common(1)[0][0]  # where the program was loaded
    return {
        b.name: counts[b.address + shift]
        for b in block_map(binary, tc)
        if counts.get(b.address + shift)
    }


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
    binary: Path, names: set[BlockName], tc: Toolchain, known: dict[Code, float] | None = None
) -> dict[BlockName, float]:
    """llvm-mca's cycles per run of each of BINARY's blocks in NAMES, for this machine.
    KNOWN: cycles of code seen before (another build's), read and added to."""
    known = {} if known is None else known
    instructions = _instructions(binary, tc)
    by_address = sorted(instructions)
    codes: dict[BlockName, Code] = {}
    for b in block_map(binary, tc):
        if b.name in names:
            code = tuple(instructions[a] for a in by_address if b.address <= a < b.address + b.size)
            if code:
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


def workload_cycles(
    binary: Path,
    counts: dict[BlockName, int],
    tc: Toolchain,
    known: dict[Code, float] | None = None,
) -> float:
    """The cycles BINARY's blocks take when each runs as often as COUNTS says (KNOWN: as
    `block_cycles`)."""
    cycles = block_cycles(binary, set(counts), tc, known)
    return sum(n * cycles.get(name, 0.0) for name, n in counts.items())
