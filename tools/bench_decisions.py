"""What a build from decisions costs against plain clang (issue 59's figures).

    .venv/bin/python -m tools.bench_decisions SRC_DIR [--rounds 9] [--callgrind lparser.c]
    .venv/bin/python -m tools.bench_decisions --tune OUT [--rounds 9] [--instructions]

With --tune, OUT is a finished `mlgo tune` of an inlining problem: its project is built
from OUT/pristine with OUT/decisions' wrappers over plain clang, tested, and every object's
and program's machine code compared with the tune's kept build
(`mlgo.programs.decisions_figure`); then ROUNDS clean builds each of plain clang, plain
again (A/A), from the decisions, and with the tune's policy served to mlgo-cc as a build
gets it today (guarded for a size tune; the guard's memory cold, and remembered),
interleaved: build CPU from rusage (the service's own added for its builds) and the
linked programs' .text. With --instructions, also the instructions of one clean rebuild's
compiles and links, plain and from the decisions, counted by callgrind (deterministic).

Without it:
SRC_DIR is a small real C project's source directory (every *.c in it compiles alone with
-I SRC_DIR, as lua's src/ does). For -g0 and for -g, each file is compiled once with the
shipped size policy (ungated) in the plugin, its decisions recorded into a decisions directory
(mlgo.ship.decisions); then every round builds all files three ways in the order
`round_order` gives: plain clang-22, plain again (the A/A control) and through the
directory's `cc` wrapper (plain clang replaying the policy's decisions, with the location
flags for -g0). A build's CPU is the user + system seconds of its compiles (wait4's rusage,
wrapper included). Also said: how many objects the decisions build made identical to the
policy's. Reported per debug level: the median and interquartile range over rounds
of each variant's change against plain. With --callgrind FILE, also the instructions
valgrind counts for one compile of FILE each way (deterministic: the machine is shared).
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.data import shipped_policy
from mlgo.errors import MlgoError
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems.policy_files import load_policy
from mlgo.programs.measure import paired_change, round_order
from mlgo.ship import decisions
from mlgo.ship.plugin import inliner_plugin
from tools.lab.decisions_figure import (
    build_instructions,
    cpu_rounds,
    identity_build,
    tuned_project,
)

VARIANTS = ("plain", "plain A/A", "decisions")
DEBUG_LEVELS = ("-g0", "-g")
console = Console()


def build_cpu_s(compiler: str, root: Path, names: list[str], cflags: list[str], out: Path) -> float:
    """CPU seconds of compiling every file NAMES in ROOT with COMPILER, one at a time."""
    total = 0.0
    for name in names:
        cmd = [compiler, *cflags, "-I.", "-c", name, "-o", str(out / f"{name}.o")]
        proc = subprocess.Popen(cmd, cwd=root, stderr=subprocess.PIPE)
        _, status, usage = os.wait4(proc.pid, 0)
        stderr = proc.stderr.read() if proc.stderr else b""
        if os.waitstatus_to_exitcode(status) != 0 or stderr:
            raise RuntimeError(f"{compiler} on {name}: {stderr[:300]!r}")
        total += usage.ru_utime + usage.ru_stime
    return total


def instructions(command: list[str], cwd: Path) -> int:
    """Guest instructions of COMMAND and every program it executes, by callgrind."""
    with tempfile.TemporaryDirectory(prefix="bench-decisions-cg-") as d:
        cg = ["valgrind", "--tool=callgrind", "--trace-children=yes"]
        cg.append(f"--callgrind-out-file={d}/cg.%p")
        proc = subprocess.run([*cg, *command], cwd=cwd, capture_output=True, text=True)
        if proc.returncode != 0:
            raise RuntimeError(f"callgrind: {proc.stderr[-300:]}")
        return sum(
            int(n.replace(",", "")) for n in re.findall(r"Collected : ([\d,]+)", proc.stderr)
        )


def spread_row(change: dict) -> tuple[str, str]:
    """A `paired_change`'s median and IQR, as the tables print them."""
    return f"{change['median']:+.1%}", f"{change['q1']:+.1%}..{change['q3']:+.1%}"


def bench_tune(out: Path, rounds: int, count: bool) -> None:
    """The figure on the finished tune at OUT (see the module doc)."""
    tc, out = find_toolchain(), out.resolve()
    recipe, problem = tuned_project(out)
    table = Table(
        "project", "build", "build CPU vs plain", "IQR", "service CPU a build", "programs' .text",
        title=f"{rounds} rounds each, interleaved",
    )  # fmt: skip
    with tempfile.TemporaryDirectory(prefix="bench-decisions-") as d:
        same = identity_build(recipe, out, Path(d), tc, problem)
        console.print(
            f"{recipe.name} ({problem.name}): tests passed; {same.same}/{same.compared} ELF "
            "files from decisions with the kept build's machine code"
            + (f"; differing: {', '.join(same.differing)}" if same.differing else "")
        )
        rows = cpu_rounds(recipe, out, Path(d), tc, problem, rounds)
        base = rows["plain"].programs_text
        for name, row in rows.items():
            change = ("", "") if name == "plain" else spread_row(row.change)
            text = row.programs_text / base - 1 if base else 0.0
            sizes = f"{row.programs_text:,}" + ("" if name == "plain" else f" ({text:+.2%})")
            table.add_row(recipe.name, name, *change, f"{row.service_cpu_s:.2f} s", sizes)
        if count:
            counts = build_instructions(recipe, out, Path(d) / "counted", tc, problem)
            plain, ours = counts["plain"], counts["decisions"]
            console.print(
                f"a clean rebuild's compiles and links, by callgrind: plain {plain:,} "
                f"instructions, from decisions {ours:,} ({ours / plain - 1:+.2%})"
            )
    console.print(table)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("src", type=Path, nargs="?", help="a directory of C files that compile alone")
    ap.add_argument("--tune", type=Path, help="a finished tune's OUT directory, instead of SRC")
    ap.add_argument("--rounds", type=int, default=9)
    ap.add_argument("--callgrind", help="one file of SRC to count instructions on")
    ap.add_argument(
        "--instructions", action="store_true", help="with --tune: count a rebuild's instructions"
    )
    args = ap.parse_args()
    if (args.src is None) == (args.tune is None):
        ap.error("give SRC_DIR or --tune OUT")
    if args.tune:
        try:
            bench_tune(args.tune, args.rounds, args.instructions)
        except MlgoError as e:
            sys.exit(f"bench_decisions: {e}")
        return
    tc, root = find_toolchain(), args.src.resolve()
    policy = replace(load_policy(shipped_policy("inlining-size")), departure_threshold=None)
    plugin = inliner_plugin(policy, tc)
    names = sorted(p.name for p in root.glob("*.c"))
    table = Table("debug", "variant", "median", "IQR", "rounds")
    with tempfile.TemporaryDirectory(prefix="bench-decisions-") as d:
        work = Path(d)
        for debug in DEBUG_LEVELS:
            cflags = ["-Oz", debug]
            directory, policys, built = (work / f"{k}{debug}" for k in ("dir", "policy", "out"))
            policys.mkdir()
            built.mkdir()
            files = {
                n: decisions.record_source(tc.clang, plugin, root, n, cflags, policys / f"{n}.o")
                for n in names
            }
            flags = decisions.compile_flags(cflags)
            decisions.write(directory, root, files, {}, flags, tc.major)
            compilers = dict(
                zip(VARIANTS, (tc.clang, tc.clang, str(directory / "cc")), strict=True)
            )
            cpu: dict[str, list[float]] = {v: [] for v in VARIANTS}
            for r in range(args.rounds):
                for v in round_order(r, VARIANTS):
                    cpu[v].append(build_cpu_s(compilers[v], root, names, cflags, built))
            build_cpu_s(compilers["decisions"], root, names, cflags, built)
            same = sum(
                (policys / f"{n}.o").read_bytes() == (built / f"{n}.o").read_bytes() for n in names
            )
            console.print(
                f"{debug}: {same}/{len(names)} objects from decisions identical to the policy's"
            )
            for v in VARIANTS[1:]:
                change = paired_change(cpu[v], cpu["plain"])
                table.add_row(debug, v, *spread_row(change), str(args.rounds))
            if args.callgrind:
                command = [*cflags, "-I.", "-c", args.callgrind, "-o", os.devnull]
                plain = instructions([tc.clang, *command], root)
                ours = instructions([compilers["decisions"], *command], root)
                console.print(
                    f"{debug} {args.callgrind}: plain {plain:,} instructions, through the "
                    f"decisions {ours:,} ({ours / plain - 1:+.2%})"
                )
    console.print(table)


if __name__ == "__main__":
    main()
