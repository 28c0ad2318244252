"""The PGO row: the build a performance engineer makes anyway (instrumented, the workload
run once apart from the timed runs, the profile merged, the build with it tested), timed
beside the plain build and the policy's; left out in one line when the workload reaches
none of the project's code."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from rich.console import Console

from mlgo.llvm.profiles import hot_functions
from mlgo.llvm.replay import Decision
from mlgo.llvm.toolchain import Toolchain
from mlgo.packages.recipes import project
from mlgo.problems import STAGE_FLAGS
from mlgo.programs.build import (
    ProgramBuild,
    Variant,
    build_program,
    level_flags,
    plain_compilers,
)
from mlgo.programs.layouts import policy_over_layouts
from mlgo.programs.measure import Timing, recipe_throughput
from mlgo.programs.pgo import UNPROFILED, PGORow, hot_departures, pgo_row
from mlgo.programs.report import (
    PGO_ROW,
    hot_line,
    program_report,
    render_html,
    report_table,
    table_rows,
)
from mlgo.ship import decisions
from mlgo.ship.decisions import UnitDecisions
from tests.conftest import DATA

FLAGS = level_flags("-O2")
# the program, and the library of its hash map and buffer (which a program may load)
BUILD = (
    'for f in *.c; do "$CC" -fPIC -c "$f" || exit 1; done && "$CC" -o wordcount *.o && '
    '"$CC" -shared -o libwc.so hash.o strbuf.o'
)
TEST = "echo 'a b a' | ./wordcount | grep -qx 'words: 3 distinct: 2'"
WORKLOAD = "./wordcount < main.c"


def built(recipe, pristine: Path, tree: Path, tc: Toolchain, flags: list[str]) -> ProgramBuild:
    compilers = plain_compilers(tc)
    return build_program(recipe, pristine, tree, tc, Variant(tree.name, compilers, {}), flags)


@pytest.fixture(scope="module")
def wordcount(tc, tmp_path_factory):
    """The word counter built plain at -O2, and its PGO row from a workload that counts
    the words of its own main.c."""
    root = tmp_path_factory.mktemp("pgo")
    pristine = shutil.copytree(DATA / "minipkg", root / "pristine")
    recipe = project("wordcount", [], [BUILD], [TEST], WORKLOAD)
    work = root / "programs"
    plain = built(recipe, pristine, work / "plain", tc, FLAGS)
    return recipe, pristine, work, plain, pgo_row(recipe, pristine, work / "plain", tc, FLAGS, True)


def entry_counts(tc: Toolchain, profile: Path) -> dict[str, int]:
    """How often each function was entered in the run PROFILE is of, by its profile name
    (a static one's prefixed with its file's name)."""
    show = [tc.tool("llvm-profdata"), "show", "--all-functions", "--counts", profile]
    shown = subprocess.run(show, capture_output=True, text=True, check=True).stdout
    return {
        f: int(n)
        for f, n in re.findall(r"^  (\S+):\n(?:    .*\n)*?    Function count: (\d+)", shown, re.M)
    }


def sections(tc: Toolchain, obj: Path) -> set[str]:
    shown = subprocess.run(
        [tc.tool("llvm-readelf"), "-S", "-W", obj], capture_output=True, text=True, check=True
    ).stdout
    return set(re.findall(r"\] (\.text\S*)", shown))


def test_the_profile_is_of_one_run_of_the_workload_apart_from_the_timed_ones(tc, wordcount):
    _, pristine, work, _, row = wordcount
    assert not row.left_out, row.left_out
    assert Path(row.profile) == (work / "profile" / "default.profdata").resolve()
    # one run, one process: main entered once, map_incr once per word of main.c
    words = re.findall(r"[A-Za-z0-9_]+", (pristine / "main.c").read_text())
    counts = entry_counts(tc, Path(row.profile))
    assert counts["main"] == 1 and counts["map_incr"] == len(words)
    assert counts["main.c:is_word"] > len(words)  # a static function, by its file's name
    # the instrumented build and the raw profiles are gone, their logs kept
    kept = {p.name for p in (work / "profile").iterdir() if not p.name.startswith(".")}
    assert kept == {"default.profdata", "instrumented.log", "profile.log"}


def test_the_pgo_build_is_built_with_the_profile_and_tested(tc, wordcount):
    _, _, work, _, row = wordcount
    assert row.tests == "passed" and Path(row.tree) == work / "pgo"
    assert row.flags == (
        f"-fprofile-instr-use={row.profile}",
        *("-Wno-profile-instr-unprofiled", "-Wno-profile-instr-out-of-date"),
    )
    # the profile sends what the run never entered to cold text, the hot loop to hot text
    assert ".text.unlikely." in sections(tc, work / "pgo" / "strbuf.o")
    assert ".text.hot." in sections(tc, work / "pgo" / "main.o")
    assert sections(tc, work / "plain" / "strbuf.o") == sections(tc, work / "plain" / "main.o")
    assert sections(tc, work / "plain" / "main.o") == {".text"}


def test_a_decisions_directory_with_the_profile_makes_every_compile_use_it(tc, wordcount, tmp_path):
    """The profile and the decisions together are what a tuned build on top of PGO needs:
    a directory written with the profile carries it, and its `cc` adds it to every
    compile, a file without decisions too; one written without adds nothing."""
    _, pristine, _, _, row = wordcount
    made = {}
    for name, profile in (("with", Path(row.profile)), ("without", None)):
        directory = decisions.write(
            tmp_path / name, pristine, {}, {}, [], tc.major, profile=profile
        )
        obj = tmp_path / f"{name}.o"
        compile_ = [directory / "cc", *FLAGS, "-c", pristine / "main.c", "-o", obj]
        subprocess.run(compile_, check=True, cwd=pristine, capture_output=True)
        made[name] = sections(tc, obj)
    assert (tmp_path / "with" / "default.profdata").read_bytes() == Path(row.profile).read_bytes()
    assert not (tmp_path / "without" / "default.profdata").exists()
    assert ".text.hot." in made["with"] and ".text.hot." not in made["without"]


def test_the_hot_code_of_the_profile_is_what_clangs_inliner_calls_hot_and_the_decisions_in_it(
    tc, wordcount, tmp_path
):
    """What a tune on top of PGO reports of where the profile and the policy meet: the
    functions whose counts reach the profile summary's 99% count (as clang's inliner
    reads hotness), a static one by its file; per kept file, its departures from clang's
    own in all callers and in the hot ones."""
    _, pristine, _, _, row = wordcount
    profile = Path(row.profile)
    hot, functions = hot_functions(tc, profile)
    counts = entry_counts(tc, profile)
    assert hot > 0 and {"main.c:is_word", "main.c:next_word", "main"} <= set(functions)
    assert counts["strbuf.c:hexdigit"] == 0 and "strbuf.c:hexdigit" not in functions
    decision = Decision("next_word", "main.c:1:1", "is_word", False)
    unit = UnitDecisions([decision], departures={"next_word": 2, "usage": 1})
    other = UnitDecisions([decision], departures={"next_word": 1})  # not main.c's static
    directory = tmp_path / "decisions"
    units = {"main.c": unit, "hash.c": other, "domain.c": other}  # whole names: not main.c
    decisions.write(directory, pristine, units, {}, [], tc.major)
    found = hot_departures(profile, directory, tc)
    assert found["hot_count"] == hot and found["hot_functions"] == sorted(functions)
    assert found["files"] == {
        "main.c": {"departures": 3, "in_hot_callers": {"next_word": 2}},
        "hash.c": {"departures": 1, "in_hot_callers": {}},
        "domain.c": {"departures": 1, "in_hot_callers": {}},
    }
    line = hot_line(found)
    assert line.endswith("5 sites departing from clang's own, 2 in 1 hot callers")


def test_the_report_times_the_pgo_build_beside_plain_and_the_policy(tc, wordcount):
    recipe, pristine, work, plain, row = wordcount
    # the policy's build stands in: clang's own decisions at another inline threshold
    ml = built(recipe, pristine, work / "mlgo", tc, [*FLAGS, "-mllvm", "-inline-threshold=500"])
    trees = {"plain": work / "plain", "mlgo": work / "mlgo"}
    speed = row.into(recipe_throughput(recipe, {**trees, **row.timed()}, 2, 0.05))
    pgo = speed["pgo"]
    q1, q3 = pgo["iqr_pct"]
    assert q1 <= pgo["change_pct"] <= q3 and len(pgo["ratios_pct"]) == 2
    assert "instructions_change_pct" in pgo  # valgrind is installed here
    assert (pgo["profile"], pgo["tests"], pgo["flags"]) == (row.profile, "passed", [*row.flags])
    assert speed["ratios_pct"] != pgo["ratios_pct"]  # the policy's change is its own
    report = program_report((plain, ml), trees, [Path("policy")], speed)
    rows = {label: change for label, _, _, change, _ in table_rows(report)}
    assert rows[PGO_ROW].startswith(f"{pgo['change_pct']:+.2f}% (IQR {q1:+.2f}..{q3:+.2f}%)")
    assert PGO_ROW in render_html(report) and "pgo_left_out" not in speed


@pytest.mark.slow
def test_the_pgo_build_is_timed_over_the_same_layouts_as_plain_and_the_policy(tc, wordcount):
    recipe, pristine, work, plain, row = wordcount
    # clang's own decisions stand in for the policy's
    pair = (Variant("plain", plain_compilers(tc), {}), Variant("mlgo", plain_compilers(tc), {}))
    at = work / "layouts"
    trees = {"plain": work / "plain", "mlgo": work / "plain"}
    speed = recipe_throughput(recipe, {**trees, **row.timed()}, 2, 0.05)
    builds = [(v, FLAGS) for v in pair]
    beside = row.over_layouts(pair[0], FLAGS)
    timing = Timing(2, 0.05, 2)
    speed["layouts"] = policy_over_layouts(recipe, pristine, at, tc, [*builds, *beside], timing)
    speed = row.into(speed)
    over = speed["pgo"]["layouts"]
    q1, q3 = over["iqr_pct"]
    assert q1 <= over["change_pct"] <= q3 and over["layouts"] == 2
    assert len(over["per_layout_pct"]) == 2 and "pgo" not in speed["layouts"]
    assert speed["layouts"]["layouts"] == 2  # the policy's figures stay where they were
    # the PGO layouts were built with the profile, at the same seeds as the others
    assert (at / "pgo-layout-1" / "wordcount").is_file()
    assert ".text.hot.main" in sections(tc, at / "pgo-sections" / "main.o")
    assert ".text.hot.main" not in sections(tc, at / "plain-sections" / "main.o")
    report = program_report((plain, plain), trees, [Path("policy")], speed)
    rows = {label: change for label, _, _, change, _ in table_rows(report)}
    assert (
        rows[f"{PGO_ROW}, over 2 layouts"]
        == f"{over['change_pct']:+.2f}% (IQR {q1:+.2f}..{q3:+.2f}%)"
    )
    assert rows[PGO_ROW].startswith(f"{speed['pgo']['change_pct']:+.2f}%")


@pytest.mark.parametrize(
    ("bench", "why"),
    [
        ("echo a b a | md5sum", "the workload ran none of its code (no raw profile)"),
        # the library is loaded, and none of its functions called
        (
            "LD_PRELOAD=./libwc.so /bin/true",
            "the workload reached none of its functions (no count in its profile)",
        ),
    ],
)
def test_a_workload_that_reaches_none_of_the_project_leaves_the_row_out_in_one_line(
    tc, tmp_path, bench, why
):
    pristine = shutil.copytree(DATA / "minipkg", tmp_path / "pristine")
    recipe = project("wordcount", [], [BUILD], [TEST], bench)
    work = tmp_path / "programs"
    plain = built(recipe, pristine, work / "plain", tc, FLAGS)
    row = pgo_row(recipe, pristine, work / "plain", tc, FLAGS, True)
    assert row.left_out == f"the PGO row is left out: wordcount: {why}"
    assert row.timed() == {} and not (work / "pgo").exists()
    assert not (work / "profile" / "default.profdata").exists()
    trees = {"plain": work / "plain", "mlgo": work / "plain"}
    speed = row.into(recipe_throughput(recipe, trees, 1, 0.01))
    assert "pgo" not in speed and speed["pgo_left_out"] == row.left_out
    report = program_report((plain, plain), trees, [Path("policy")], speed)
    assert PGO_ROW not in {label for label, *_ in table_rows(report)}
    console = Console(width=300, record=True)
    console.print(report_table(report))
    assert row.left_out in " ".join(console.export_text().split())  # its caption, wrapped


def test_under_full_lto_the_profile_is_made_and_used_there(tc, tmp_path):
    pristine = shutil.copytree(DATA / "minipkg", tmp_path / "pristine")
    recipe = project("wordcount", [], [BUILD], [TEST], WORKLOAD)
    flags = [*FLAGS, *STAGE_FLAGS["link"]]
    built(recipe, pristine, tmp_path / "plain", tc, flags)
    row = pgo_row(recipe, pristine, tmp_path / "plain", tc, flags, True)
    assert not row.left_out and row.tests == "passed", row.left_out
    # the objects are bitcode for the link, and carry the profile's counts into it
    ir = subprocess.run(
        [tc.tool("llvm-dis"), tmp_path / "pgo" / "hash.o", "-o", "-"],
        capture_output=True, text=True, check=True,
    ).stdout  # fmt: skip
    assert "function_entry_count" in ir


@pytest.mark.unit
def test_a_row_left_out_or_never_made_adds_nothing_to_time():
    assert PGORow().timed() == {} and PGORow().into({"change_pct": 1.0}) == {"change_pct": 1.0}


@pytest.mark.unit
def test_on_top_of_pgo_the_baselines_own_gain_is_the_build_without_it_inverted_round_by_round():
    """Under --pgo the baseline is the PGO build and the row is the build without the
    profile: PGO's change against it is each round's ratio inverted, not the median's
    inverse (with an even count of rounds they differ)."""
    row = PGORow("t", "p.profdata", ("-O2",), "passed", name=UNPROFILED)
    layouts = {UNPROFILED: {"change_pct": 5.0, "ratios_pct": [25.0, -20.0, 0.0], "layouts": 2}}
    speed = row.into({UNPROFILED: {"ratios_pct": [25.0, 5.0]}, "layouts": layouts})
    assert speed["pgo_change_pct"] == pytest.approx(100 * ((1 / 1.25 - 1) + (1 / 1.05 - 1)) / 2)
    assert speed["pgo_layouts"] == {
        "change_pct": 0.0,
        "iqr_pct": pytest.approx([-20, 25]),
        "layouts": 2,
    }
    assert speed[UNPROFILED]["layouts"]["change_pct"] == 5.0 and speed["layouts"] == {}
    base = Variant("plain", ("cc", "c++"), {"A": "1"})
    ((unprofiled, flags),) = row.over_layouts(base, ["-O2", "-fprofile-instr-use=p"])
    assert (unprofiled, flags) == (Variant(UNPROFILED, base.compilers, base.env), ["-O2"])
    ((pgo, flags),) = PGORow("t", "p", ("-fprofile-instr-use=p",)).over_layouts(base, ["-O2"])
    assert (pgo.name, flags) == ("pgo", ["-O2", "-fprofile-instr-use=p"])
    assert PGORow().over_layouts(base, ["-O2"]) == []
