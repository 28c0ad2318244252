"""A build's layouts: its links run again by lld with shuffled function order, each in its
own copy of the tree, and a change timed over them beside the change as built."""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from mlgo.corpus.extract import Invocation
from mlgo.llvm.sizes import text_size
from mlgo.packages.recipes import Recipe
from mlgo.programs.build import Building, ProgramBuild, Variant, build_program
from mlgo.programs.compare import variants
from mlgo.programs.layouts import layout_trees, over_layouts, policy_over_layouts, program_links
from mlgo.programs.measure import Timing, prepare_workload, recipe_workload, workload_output
from mlgo.programs.report import only_layout, program_report, report_table, write_report
from tests.conftest import DATA


# -- the statistics -----------------------------------------------------------------------
@pytest.mark.unit
def test_a_change_over_layouts_pools_each_layouts_paired_rounds():
    times = {
        "plain@1": [1.0, 1.0, 1.0],
        "plain@2": [2.0, 2.0, 2.0],
        "mlgo@1": [0.9, 0.95, 1.0],  # 10% and 5% faster, and the same
        "mlgo@2": [2.2, 2.1, 2.0],  # 10% and 5% slower, and the same
    }
    over = over_layouts(times, "mlgo", "plain", [1, 2])
    assert over["layouts"] == 2
    assert over["change_pct"] == pytest.approx(0.0)  # of -10, -5, 0, 0, +5, +10
    q1, q3 = over["iqr_pct"]
    assert q1 < 0 < q3  # faster at one layout, slower at the other: not surely faster
    assert over["per_layout_pct"] == pytest.approx([-5.0, 5.0])
    alike = over_layouts(times, "plain", "plain", [1, 2])
    assert alike["change_pct"] == 0.0 and alike["iqr_pct"] == [0.0, 0.0]


def speed_report(as_built: list[float], layouts: list[float] | None) -> dict:
    speed = {"change_pct": sum(as_built) / 2, "iqr_pct": as_built, "ratios_pct": as_built}
    speed |= {"control_change_pct": 0.1, "control_iqr_pct": [-0.5, 0.6]}
    if layouts is not None:
        speed["layouts"] = {
            "change_pct": sum(layouts) / 2, "iqr_pct": layouts, "layouts": 4,
            "control_change_pct": 0.2, "control_iqr_pct": [-0.4, 0.8],
        }  # fmt: skip
    return speed


@pytest.mark.unit
@pytest.mark.parametrize(
    ("as_built", "layouts", "named"),
    [
        ([-1.7, -1.2], [-3.0, 1.5], True),  # faster as built only: layout
        ([0.6, 1.2], [-0.5, 2.5], True),  # slower as built only: layout too
        ([-1.7, -1.2], [-2.0, -0.5], False),  # faster over layouts too
        ([-0.7, 1.2], [-3.0, 1.5], False),  # no change either way
        ([-1.7, -1.2], None, False),  # not timed over layouts
    ],
)
def test_the_report_says_layout_where_only_the_as_built_change_holds(as_built, layouts, named):
    speed = speed_report(as_built, layouts)
    assert only_layout(speed) == named
    report = {
        "package": "p", "problem": "inlining-speed", "tests": {"baseline": "-", "policy": "-"},
        "size": {"programs": {}, "files": 1, "baseline": 10, "policy": 10, "change_pct": 0.0},
        "throughput": speed,
    }  # fmt: skip
    console = Console(width=200, record=True)
    console.print(report_table(report))
    rows = {line.split("  ")[0].strip(" │┃"): line for line in console.export_text().splitlines()}
    cpu = next(line for name, line in rows.items() if name == "CPU time")
    assert cpu.rstrip(" │").endswith(" layout") == named
    if layouts:
        assert "CPU time over 4 layouts" in rows
        over = f"{sum(layouts) / 2:+.2f}% (IQR {layouts[0]:+.2f}..{layouts[1]:+.2f}%)"
        assert over in rows["CPU time over 4 layouts"]
        assert "+0.20% (IQR -0.40..+0.80%)" in rows["CPU time over 4 layouts, A/A control"]
    else:
        assert not any("layouts" in name for name in rows)


@pytest.mark.unit
def test_the_links_to_replay_are_the_last_link_of_each_program_left_in_the_tree(tmp_path):
    tree = tmp_path / "tree"
    (tree / "sub").mkdir(parents=True)
    for name in ("prog", "sub/libx.so", "a.out"):
        (tree / name).write_bytes(b"\x7fELF")
    (tree / "CMakeFiles").mkdir()
    (tree / "CMakeFiles" / "probe").write_bytes(b"\x7fELF")
    calls = [
        Invocation(tree, ["cc", "-O2", "-c", "x.c", "-o", "x.o"]),  # compiles only
        Invocation(tree, ["cc", "x.o", "-o", "prog", "-lm"]),
        Invocation(tree / "sub", ["cc", "-shared", "y.o", "-o", "libx.so"]),
        Invocation(tree, ["cc", "x.o", "-o", "gone"]),  # its output removed by the build
        Invocation(tree, ["cc", "probe.c", "-o", "CMakeFiles/probe"]),  # a probe
        Invocation(tmp_path, ["cc", "x.o", "-o", "outside"]),  # not in the tree
        Invocation(tmp_path, ["cc", "x.o", "-o", "tree/prog"]),  # linked from outside it
        Invocation(tree, ["cc", "x.o", "z.o", "-o", "prog"]),  # prog linked again: this one
        Invocation(tree, ["cc", "main.c"]),  # compiled and linked in one call, to a.out
    ]
    (tmp_path / "outside").write_bytes(b"\x7fELF")
    links = program_links(calls, tree)
    assert [(link.output, link.argv) for link in links] == [
        (tree / "sub/libx.so", calls[2].argv),
        (tree / "prog", calls[7].argv),
        (tree / "a.out", calls[8].argv),
    ]


# -- a real build relinked ----------------------------------------------------------------
WORDCOUNT = Recipe(
    "wordcount",
    "",
    (
        '"$CC" -c hash.c -o hash.o && "$CC" -c strbuf.c -o strbuf.o',
        '"$AR" rc libwords.a hash.o strbuf.o',
        '"$CC" main.c libwords.a -o wordcount',  # compiled and linked in one call
    ),
    programs=("wordcount",),
    bench_prepare=("for i in 1 2 3 4 5 6 7 8; do cat *.c; done > input.txt",),
    bench=("sh -c './wordcount < input.txt'",),
)
FLAGS = ["-O2", "-g0", "-Qunused-arguments"]


def functions(program: Path) -> dict[str, tuple[int, int]]:
    """Each function's address and size in PROGRAM, by name (llvm-nm, defined text symbols)."""
    out = subprocess.run(
        ["llvm-nm-22", "--defined-only", "-S", program], capture_output=True, text=True
    )
    symbols = (line.split() for line in out.stdout.splitlines())
    return {s[3]: (int(s[0], 16), int(s[1], 16)) for s in symbols if len(s) == 4 and s[2] in "tT"}


@pytest.fixture(scope="module")
def placed(tc, tmp_path_factory):
    """The small word counter built plainly, and its two layouts."""
    work = tmp_path_factory.mktemp("layouts")
    pristine = shutil.copytree(DATA / "minipkg", work / "pristine")
    plain = variants(tc, {}, ("plain", ""))[0]
    built = build_program(
        WORDCOUNT,
        pristine,
        work / "plain",
        tc,
        Variant("plain", plain.compilers, {}),
        FLAGS,
        Building(tests=False),
    )
    relative = Path(os.path.relpath(work))  # as a tool's --work may be given
    return (
        work,
        pristine,
        plain,
        built,
        layout_trees(WORDCOUNT, pristine, relative, tc, plain, FLAGS, 2),
    )


def test_each_layout_orders_the_functions_anew_with_the_same_code_and_output(placed):
    work, _, _, built, trees = placed
    assert sorted(trees) == [1, 2]
    programs = {seed: tree / "wordcount" for seed, tree in trees.items()}
    # the same functions, each its own size, in another order: .text differs by the
    # padding between functions (each aligned to 16 bytes), no more
    placed = {seed: functions(p) for seed, p in programs.items()}
    built_with_sections = functions(work / "plain-sections" / "wordcount")
    assert {"main", "map_incr", "strbuf_append"} <= set(placed[1])
    sizes = [
        {f: size for f, (_, size) in fs.items()} for fs in [*placed.values(), built_with_sections]
    ]
    assert sizes[0] == sizes[1] == sizes[2]
    order = [sorted(fs, key=lambda f: fs[f][0]) for fs in [*placed.values(), built_with_sections]]
    assert order[0] != order[1] and order[2] not in order[:2]
    texts = [text_size(p) for p in programs.values()]
    assert abs(texts[0] - texts[1]) < 16 * len(sizes[0])
    # the build as the user makes it is left alone: its sizes are the report's
    assert built.text["wordcount"] == text_size(work / "plain" / "wordcount")
    workload = recipe_workload(WORDCOUNT)
    prepare_workload(WORDCOUNT, work / "plain", "wordcount: bench")
    printed = {workload_output(workload, tree) for tree in [work / "plain", *trees.values()]}
    assert len(printed) == 1 and re.fullmatch(r"words: \d+ distinct: \d+\n", printed.pop())
    log = (work / "plain-layouts.log").read_text()
    assert "--shuffle-sections=.text*=1" in log and "--shuffle-sections=.text*=2" in log


def test_the_report_carries_the_change_over_layouts(placed, tc, tmp_path):
    """The same build as both sides of a pair (the policy's build standing in): its change
    over layouts, the A/A control's, each of the two layouts timed."""
    work, pristine, plain, built, _ = placed
    pair = (plain, Variant("mlgo", plain.compilers, {}))
    builds = [(v, FLAGS) for v in pair]
    over = policy_over_layouts(WORDCOUNT, pristine, tmp_path, tc, builds, Timing(3, 0.05, 2))
    assert over["layouts"] == 2 and over["rounds"] == 3 and len(over["per_layout_pct"]) == 2
    for of in ("", "control_"):
        q1, q3 = over[f"{of}iqr_pct"]
        assert q1 <= over[f"{of}change_pct"] <= q3
    speed = {"change_pct": 0.0, "iqr_pct": [-1.0, 1.0], "ratios_pct": [0.0], "layouts": over}
    mlgo = ProgramBuild("wordcount", "mlgo", 1.0, 1.0, built.text, "not run")
    trees = {"plain": work / "plain", "mlgo": work / "plain"}
    write_report(program_report((built, mlgo), trees, [tmp_path / "p"], speed), tmp_path)
    saved = json.loads((tmp_path / "report.json").read_text())["throughput"]["layouts"]
    assert {"change_pct", "iqr_pct", "layouts"} <= set(saved) and saved["layouts"] == 2
    assert "CPU time over 2 layouts" in (tmp_path / "report.html").read_text()
