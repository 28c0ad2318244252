"""The scripts in tools/: each one's figures computed from small made-up results, every one
answering --help as `python -m tools.NAME`, and their C peers compiling."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from mlgo.corpus.format import Module, load_corpus, write_description
from mlgo.data import shipped_policy
from mlgo.errors import UsageError
from mlgo.llvm.log_format import TensorSpec
from mlgo.llvm.sizes import TextParts
from mlgo.packages.recipes import Recipe
from mlgo.problems import get_problem
from mlgo.problems.policy_files import load_policy
from mlgo.programs.build import cleaned
from mlgo.programs.measure import Workload
from mlgo.records import ModuleRun
from mlgo.runtime.commands import BuildError
from mlgo.train import calibrate
from mlgo.train.evaluate import Evaluation
from mlgo.train.stages import StageRecord
from tools import (
    bench_collect,
    bench_guard,
    bench_guard_rebuild,
    bench_inline_reach,
    bench_inlining,
    bench_regalloc,
    bench_scale,
    bench_search_compile,
    bench_service,
    bench_speed_reward,
    bench_timing,
    bench_tune,
    bench_xla,
    bench_xla_baselines,
    eval_by_language,
    gate_directions,
    headroom_inlining,
    headroom_lto,
    linked_estimate,
    size_by_linkage,
)
from tools.lab.rebuilds import (
    AUTOTOOLS_CONFIGURE,
    BUILDS,
    CLOCKS,
    CMAKE_CONFIGURE,
    STEPS,
    changes,
    detected,
)
from tools.lab.recipe import load_policy_recipe, stage_packages
from tools.lab.yield_curve import (
    build_equivalents,
    found_at,
    sampled_share_interval,
    stalled_found,
    yield_curve,
)

ROOT = Path(__file__).resolve().parents[1]
GUARDED = ROOT / "policies" / "inlining-size-guarded"
SCRATCH = ROOT / "tools" / "recipes" / "inlining-size-scratch"  # tried, not shipped
SCRIPTS = sorted(p.stem for p in (ROOT / "tools").glob("*.py") if p.stem != "__init__")
C_SOURCES = sorted((ROOT / "tools").glob("*.c"))


def module(name: str) -> Module:
    return Module(name, Path(f"{name}.bc"), ("-cc1",))


def evaluation(
    problem: str, rows: dict[str, dict[str, float]], corpus: str = "corpus"
) -> Evaluation:
    ev = Evaluation(get_problem(problem), "clang 22", corpus)
    ev.modules = rows
    return ev


# --- inlining ---------------------------------------------------------------------------


@pytest.mark.unit
def test_collect_bench_compares_each_mode_with_plain_round_by_round():
    walls = {"plain": [10.0, 20.0], "native": [11.0, 21.0], "channel": [12.0, 30.0]}
    work = {"plain": [4.0, 4.0], "native": [5.0, 4.0], "channel": [6.0, 6.0]}
    o = bench_collect.overheads(walls, work)
    assert o["pass channel"]["min"] == pytest.approx(0.2)
    assert o["pass channel"]["max"] == pytest.approx(0.5)
    assert o["work native"]["runs"] == pytest.approx([0.25, 0.0])
    assert set(o) == {"pass native", "pass channel", "work native", "work channel"}

    modules = [module("zlib/a.o"), module("zlib/b.o"), module("lua/c.o")]
    channel = {
        "zlib/a.o": {"decisions": 3},
        "zlib/b.o": {"decisions": 4},
        "lua/c.o": {"decisions": 0},
    }
    plain = {
        "zlib/a.o": {"text_size": 10.0},
        "zlib/b.o": {"text_size": 5.0},
        "lua/c.o": {"text_size": 7.0},
    }
    assert bench_collect.package_totals(modules, channel, plain) == {
        "zlib": {"modules": 2, "decisions": 7, "text_size": 15},
        "lua": {"modules": 1, "decisions": 0, "text_size": 7},
    }


@pytest.mark.unit
def test_search_compile_bench_ratios_per_module_in_total_and_python_parts():
    C = bench_search_compile.Clocks
    turns = {
        "plain": [C(1.0, 0.8, 0.01), C(2.0, 1.0, 0.01)],
        "responder": [C(1.1, 0.9, 0.01), C(2.2, 1.1, 0.01)],
        "channel": [C(1.5, 0.9, 0.11), C(2.0, 1.1, 0.21)],
        "plugin": [C(1.2, 0.9, 0.01), C(2.4, 1.1, 0.01)],
    }
    m = bench_search_compile.module_figures(turns)
    assert m["ratio"]["channel wall"]["runs"] == pytest.approx([1.5, 1.0])
    assert m["ratio"]["channel cpu"]["runs"] == pytest.approx([1.01 / 0.81, 1.31 / 1.01])
    assert m["ratio"]["plugin wall"]["runs"] == pytest.approx([1.2, 1.2])
    assert m["median_s"]["channel"]["python"] == pytest.approx(0.16)
    t = bench_search_compile.totals({"a": m, "b": m})
    assert t["ratio_of_sums"]["channel wall"] == pytest.approx(1.75 / 1.5)
    assert t["per_module_ratio"]["responder cpu"]["median"] == pytest.approx(
        m["ratio"]["responder cpu"]["median"]
    )

    class Stats:  # pstats.Stats' two attributes that `parts` reads
        total_tt = 10.0
        stats = {
            ("/x/subprocess.py", 1, "__init__"): (1, 1, 0.5, 2.0, {}),
            ("/x/mlgo/train/bcmax.py", 9, "__call__"): (4, 4, 1.0, 4.0, {}),
            ("/x/mlgo/train/bcmax.py", 9, "moved"): (4, 4, 1.0, 1.0, {}),
        }

    got = bench_search_compile.parts(Stats(), 2)  # type: ignore[arg-type]
    assert got["process start"] == 1.0 and got["answers"] == 2.0
    assert got["rest"] == pytest.approx(2.0) and got["total"] == 5.0


@pytest.mark.unit
def test_inlining_bench_figures_from_an_evaluation_builds_and_runs(tmp_path):
    ev = evaluation("inlining-size", {
        "zlib/a.o": {"text_once": 90.0, "default_text_once": 100.0},
        "lua/b.o": {"text_once": 110.0, "default_text_once": 100.0},
    })  # fmt: skip
    figures = bench_inlining.evaluation_figures(ev)
    assert figures["total_delta_pct"] == pytest.approx(0.0)
    assert figures["packages_delta_pct"] == pytest.approx({"zlib": -10.0, "lua": 10.0})

    builds = [
        {"package": "lua", "variant": "plain", "text": {"lua": 200, "luac": 100}, "tests": "ok"},
        {"package": "lua", "variant": "mlgo", "text": {"lua": 190, "luac": 100}, "tests": "ok"},
    ]
    programs = bench_inlining.program_figures(builds)
    assert programs["programs"]["lua:lua"]["delta_pct"] == pytest.approx(-5.0)
    assert programs["total_delta_pct"] == pytest.approx(100 * (290 / 300 - 1))

    for name, seconds in (("bc", 1800), ("es", 5400)):
        (tmp_path / name).mkdir()
        state = {"algo": name, "seconds": seconds, "compiles": 10, "step": 2}
        (tmp_path / name / "state.json").write_text(json.dumps(state))
    cost = bench_inlining.training_cost([tmp_path / "bc", tmp_path / "es"])
    assert cost["total_hours"] == pytest.approx(2.0)

    rows = bench_inlining.summary_rows(
        {"train": figures, "heldout": figures, "linked_programs": programs, "training_cost": cost}
    )
    assert rows[0] == (
        "train: object .text vs -Oz (2 modules)",
        "+0.00% (worst package lua +10.00%)",
    )
    assert ("linked lua:lua", "-5.00% (tests ok/ok)") in rows and rows[-1][1] == "2.00 h"


@pytest.mark.unit
def test_the_rebuild_bench_cleans_as_make_clean_does(tmp_path):
    """Objects, archives and the recipe's programs go; sources and the rest stay."""
    recipe = Recipe("lua", "lua5.4", ("make",), programs=("src/lua",))
    made = ["src/lapi.o", "src/liblua.a", "src/lua"]
    kept = ["src/lapi.c", "src/Makefile", "src/lua.h"]
    for name in made + kept:
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_text("x")
    cleaned(recipe, tmp_path)
    assert sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*.*")) == sorted(
        ["src/lapi.c", "src/lua.h"]
    )
    assert (tmp_path / "src/Makefile").exists() and not (tmp_path / "src/lua").exists()


@pytest.mark.unit
def test_the_rebuild_bench_builds_a_package_without_a_recipe_as_its_tree_says(tmp_path):
    """configure (or configure.ac, autoreconf first) is autotools, cleaned by `make clean`;
    CMakeLists.txt alone is CMake; neither is one line naming the tree."""
    (tmp_path / "CMakeLists.txt").write_text("")
    cmake = detected("x", tmp_path)
    assert cmake.recipe.configure == (CMAKE_CONFIGURE,)
    assert cmake.clean == ("cmake --build build --target clean",)
    (tmp_path / "configure.ac").write_text("")
    assert detected("x", tmp_path).recipe.configure == ("autoreconf -fi", AUTOTOOLS_CONFIGURE)
    (tmp_path / "configure").write_text("")
    autotools = detected("x", tmp_path)
    assert autotools.recipe.configure == (AUTOTOOLS_CONFIGURE,)
    assert autotools.recipe.build == ("make -j2",) and autotools.clean == ("make clean",)
    with pytest.raises(UsageError, match="no configure, configure.ac or CMakeLists.txt"):
        detected("x", tmp_path / "empty")


@pytest.mark.unit
def test_the_rebuild_bench_reports_wall_and_cpu_against_plain():
    seconds = {s: {c: {"plain": [10.0, 10.0], "plain A/A": [10.0, 11.0], "mlgo-cc": [10.5, 11.0]}
                   for c in CLOCKS} for s in STEPS}  # fmt: skip
    against = {s: {c: {b: changes(seconds[s][c][b], seconds[s][c]["plain"]) for b in BUILDS[1:]}
                   for c in CLOCKS} for s in STEPS}  # fmt: skip
    assert against["rebuild"]["wall"]["mlgo-cc"]["change_pct"] == pytest.approx(7.5)
    table = bench_guard_rebuild.report(
        {"package": "x", "seconds": seconds, "against_plain": against}
    )
    assert table.row_count == len(STEPS) * len(BUILDS)
    with pytest.raises(BuildError, match="no paired rounds"):
        changes([], [])


@pytest.mark.unit
def test_guard_bench_sums_packages_and_names_objects_alike_in_every_build():
    hashed = Path("lib/conf_0123456789abcdef0123456789abcdef/zstd.o")
    assert bench_guard.object_key(hashed) == "/lib/conf/zstd.o"
    one = {"objects": 2, "plain_text": 100, "policy_text": 98, "guard_text": 97,
           "policy_larger": 1, "guard_larger": 0,
           "cpu_s": {"plain": 1.0, "policy": 1.5, "guard": 2.0}}  # fmt: skip
    total = bench_guard.summed({"zstd": one, "lua": one})
    assert total["plain_text"] == 200 and total["policy_larger"] == 2
    assert total["cpu_s"] == {"plain": 2.0, "policy": 3.0, "guard": 4.0}
    row = bench_guard.table_row("total", total)
    assert row[3:6] == ["-2.00%", "-3.00%", "2 / 0"]
    assert row[-1] == "+100.00% / +33.33%"
    assert bench_guard.pct(1.0, 0.0) == "n/a"


@pytest.mark.unit
def test_tune_bench_row_shows_a_report_and_a_stopped_project():
    report = {
        "size": {"change_pct": -1.0, "files": 9,
                 "linked": {"change_pct": -2.0, "files": 3, "larger": ["a"]}},
        "training": {"headroom_pct": -2.5, "headroom_captured": 0.8, "chosen": "trained",
                     "seconds": 3600},
        "throughput": {"change_pct": 1.0, "iqr_pct": [0.5, 1.5], "control_change_pct": 0.1,
                       "control_iqr_pct": [-0.5, 0.5], "instructions_change_pct": -0.25},
        "tests": {"baseline": "passed", "policy": "passed"},
    }  # fmt: skip
    row = bench_tune.row("cmark", {"language": "C", "seconds": 4200, "report": report})
    assert row[:5] == ["cmark (C)", "-2.00% (3 files, 1 larger)", "-1.00% (9)",
                       "-2.50% (80%)", "trained"]  # fmt: skip
    cpu = "+1.00% (IQR +0.50..+1.50%); A/A +0.10% (IQR -0.50..+0.50%)"
    assert row[5:] == [cpu, "-0.25%", "passed / passed", "60 min", "70 min"]
    stopped = bench_tune.row("jq", {"language": "C", "error": "its tests failed"})
    assert stopped[1] == "[red]stopped: its tests failed" and len(stopped) == len(row)


def test_inline_reach_sets_each_threshold_beside_its_a_a_control():
    speed = {
        "change_pct": -1.5,
        "iqr_pct": [-2.0, -1.0],
        "control_change_pct": 0.2,
        "control_iqr_pct": [-0.3, 0.4],
        "instructions": {},
        "instructions_change_pct": -3.0,
    }
    result = {"thresholds": {500: {"text_pct": 4.0, "cost_pct": -2.5, "throughput": speed}}}
    table = bench_inline_reach.table("cmark", result)
    cells = [c._cells[0] for c in table.columns]
    assert cells == ["500", "+4.00%", "-2.50%", "-3.00%", "-1.50% (IQR -2.00..-1.00%)",
                     "+0.20% (IQR -0.30..+0.40%)"]  # fmt: skip
    assert table.title == "cmark: inlining's reach at -O2 (against plain clang -O2)"
    # on top of PGO: plain -O2 without the profile is one more row, against the PGO build
    row = result["thresholds"][500]
    pgo = {"thresholds": {"500": row, "no profile": row}, "pgo": True}
    table = bench_inline_reach.table("cmark", pgo)
    assert [c._cells[1] for c in table.columns][0] == "no profile"
    assert (
        table.title
        == "cmark: inlining's reach at -O2 (against clang -O2 with the workload's profile)"
    )


@pytest.mark.unit
def test_language_tool_reads_each_modules_language_from_its_corpus(tmp_path):
    corpus = tmp_path / "corpus"
    for name, source in (("mixed/a.o", "a.c"), ("mixed/b.o", "b.cpp")):
        (corpus / name).parent.mkdir(parents=True, exist_ok=True)
        (corpus / f"{name}.bc").write_bytes(b"")
        (corpus / f"{name}.cmd").write_bytes(f"-cc1\0-main-file-name\0{source}".encode())
    write_description(corpus, ["mixed/a.o", "mixed/b.o"])
    ev = evaluation("inlining-size", {
        "mixed/a.o": {"text_once": 90.0, "default_text_once": 100.0},
        "mixed/b.o": {"text_once": 120.0, "default_text_once": 100.0},
    }, str(corpus))  # fmt: skip
    language = eval_by_language.module_languages(ev)
    assert language == {"mixed/a.o": "C", "mixed/b.o": "C++"}
    f = eval_by_language.figures(ev, language)
    assert (f["total"], f["C"], f["C++"]) == ("+5.000%", "-10.000%", "+20.000%")
    assert (f["total (guard)"], f["C++ (guard)"]) == ("-5.000%", "+0.000%")
    assert f["larger"] == "mixed +5.00% (+10)"


@pytest.mark.unit
def test_language_tool_gives_the_objects_whole_text_beside_the_reward():
    """A C++ package whose objects grow by the copies of an inline function while the
    package, each copy counted once, shrinks: each metric says so, and neither is assumed."""
    ev = evaluation("inlining-size", {
        "pp/a.o": {"text_once": 95.0, "default_text_once": 100.0,
                   "text_size": 130.0, "default_text_size": 120.0},
    })  # fmt: skip
    language = {"pp/a.o": "C++"}
    once, whole = (eval_by_language.figures(ev, language, m) for m in (None, "text_size"))
    assert (once["C++"], once["larger"]) == ("-5.000%", "")
    assert (whole["C++"], whole["larger"]) == ("+8.333%", "pp +8.33% (+10)")
    assert ev.metrics == ["text_once", "text_size"]


@pytest.mark.unit
def test_language_tool_falls_back_to_the_splits_without_the_corpus(tmp_path, capsys):
    ev = evaluation("inlining-size", {"zlib/a.o": {"text_once": 1.0, "default_text_once": 1.0}},
                    str(tmp_path / "gone"))  # fmt: skip
    assert eval_by_language.module_languages(ev) == {"zlib/a.o": "C"}
    assert "languages by package" in capsys.readouterr().err


@pytest.mark.unit
def test_recipe_trains_es_on_c_packages_and_reports_the_kept_thresholds_languages(tmp_path):
    corpus = tmp_path / "corpus"
    names = {"c/a.o": "a.c", "mixed/a.o": "a.c", "mixed/b.o": "b.cc", "pp/a.o": "a.cpp"}
    for name, source in names.items():
        (corpus / name).parent.mkdir(parents=True, exist_ok=True)
        (corpus / f"{name}.bc").write_bytes(b"")
        (corpus / f"{name}.cmd").write_bytes(f"-cc1\0-main-file-name\0{source}".encode())
    write_description(corpus, list(names))
    assert stage_packages(load_corpus(corpus), "c") == ["c"]
    assert stage_packages(load_corpus(corpus), "all") == ["c", "mixed", "pp"]
    assert stage_packages(load_corpus(corpus), ("pp", "c")) == ["pp", "c"]
    names = [s.name for s in load_policy_recipe(SCRATCH).stages]
    calibration = {"threshold": 0.6, "languages": ["c"], "sweep": [
        {"threshold": 0.5, "change": -0.01, "packages_larger": [], "failed": []},
        {"threshold": 0.6, "change": -0.004, "packages_larger": ["pp"], "failed": [],
         "by_language": {"c": {"change": -0.002, "packages_larger": []}}},
    ]}  # fmt: skip
    kept = calibrate.kept(calibration)
    assert (kept["change_pct"], kept["packages_larger"]) == (-0.2, [])
    never = calibrate.kept({**calibration, "threshold": 1.0, "languages": None})
    assert (never["change_pct"], never["packages_larger"]) == (0.0, [])
    stages = StageRecord.load(tmp_path / "recipe.json", names, {"validation": kept})
    stages.seconds, stages.finished = {"calibrate": 60.0, "bc": 120.0}, ["calibrate"]
    record = stages.summary()
    assert list(record["seconds"]) == ["bc", "calibrate"] and record["total_minutes"] == 3.0
    (tmp_path / "recipe.json").write_text(json.dumps(record))
    again = StageRecord.load(tmp_path / "recipe.json", names)
    assert (again.seconds, again.finished) == ({"bc": 120.0, "calibrate": 60.0}, ["calibrate"])
    # a record read back says what it said: its total is of the seconds as written
    stages.seconds = {"calibrate": 0.06, "bc": 26.86}
    record = stages.summary()
    (tmp_path / "recipe.json").write_text(json.dumps(record))
    again = StageRecord.load(tmp_path / "recipe.json", names, {"validation": kept})
    assert again.summary() == record and record["total_minutes"] == 0.5


@pytest.mark.slow
def test_recipe_runs_each_stage_from_the_one_before_and_skips_them_when_rerun(
    mini_corpus, tmp_path
):
    """The whole recipe on the small corpus, with the second ES stage: each run starts
    from the one before, the mixed one with the per-package penalty; the calibrated policy
    and every stage's seconds are recorded, a stopped one's too; a rerun trains nothing again."""
    corpus, out = str(mini_corpus.root), tmp_path / "recipe"
    cmd = [sys.executable, "-m", "tools.reproduce_policy", str(SCRATCH), "--out", str(out)]
    cmd += ["--corpus", f"train={corpus}", "--corpus", f"validation={corpus}"]
    cmd += ["--packages", "es=minipkg", "--packages", "es-mix=minipkg"]
    cmd += ["--minutes", "es=0.05", "--minutes", "es-mix=0.05", "--minutes", "bcmax=0.1"]
    unknown = [*cmd, "--packages", "es-mix=nosuch"]  # refused before any stage runs
    r = subprocess.run(unknown, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and r.stderr.splitlines()[-1].endswith(
        "no package(s) nosuch in corpus"
    )
    assert not out.exists()
    stopped = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    while not (out / "bc").exists():  # a stopped job: its stage's seconds still count
        assert stopped.poll() is None, "finished before its first stage was seen"
        time.sleep(0.05)
    time.sleep(0.5)  # the record keeps tenths: a stage stopped at once would count 0.0
    assert stopped.poll() is None, "finished before it could be stopped"
    stopped.send_signal(signal.SIGTERM)
    assert stopped.wait(120) == 128 + signal.SIGTERM
    stopped_record = json.loads((out / "recipe.json").read_text())
    assert stopped_record["seconds"]["bc"] > 0 and stopped_record["finished"] == []
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    record = json.loads((out / "recipe.json").read_text())
    names = [s.name for s in load_policy_recipe(SCRATCH).stages]
    assert list(record["seconds"]) == record["finished"] == names
    assert not any((out / stage / "eval").exists() for stage in record["finished"])
    assert record["validation"]["packages_larger"] == []
    for run, init, penalty in (("es", "bc", 0.0), ("es-mix", "es", 1.0), ("bcmax", "es-mix", None)):
        config = json.loads((out / run / "state.json").read_text())["extra"]["config"]
        assert (config["init"], config.get("regression_penalty")) == (str(out / init), penalty)
    assert (out / "policy" / "calibration.json").is_file()
    again = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and json.loads(again.stdout) == record


@pytest.mark.unit
@pytest.mark.parametrize(
    "text",
    ['{"seconds": ', '{"seconds": {"bc": 1.0}}', '{"seconds": {}, "finished": ["nosuch"]}'],
)
def test_recipe_refuses_a_record_it_cannot_read_in_one_line_and_keeps_it(tmp_path, text):
    record = tmp_path / "recipe.json"
    record.write_text(text)
    cmd = [sys.executable, "-m", "tools.reproduce_policy", str(SCRATCH), "--out", str(tmp_path)]
    r = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and f"{record}: not this tool's record" in r.stderr.splitlines()[-1]
    assert record.read_text() == text


@pytest.mark.unit
def test_one_way_gate_departs_only_from_one_of_clangs_answers():
    policy = load_policy(shipped_policy("inlining-size"))
    logits = np.array([[0.0, 5.0], [5.0, 0.0]], np.float32)  # confident: inline; do not
    default = np.array([0, 1])  # clang: does not inline; inlines
    both_ways = gate_directions.one_way(policy, 0.5, depart_from=1)
    assert both_ways.departure_threshold == 0.5 and both_ways.weights is policy.weights
    assert both_ways.gate(logits, default).tolist() == [0, 0]  # refuses only
    inline_only = gate_directions.one_way(policy, 0.5, depart_from=0)
    assert inline_only.gate(logits, default).tolist() == [1, 1]


@pytest.mark.unit
def test_headroom_tool_sums_search_and_policy_per_package():
    modules = [module("zlib/a.o"), module("zlib/b.o"), module("lua/c.o"), module("lua/crash.o")]
    default = {"zlib/a.o": 100.0, "zlib/b.o": 50.0, "lua/c.o": 10.0}
    found = {"zlib/a.o": (90.0, 3)}  # b: the search failed on it
    packages = headroom_inlining.package_sizes(modules, default, found, {"lua/c.o": 12.0})
    assert packages == {
        "zlib": {"default": 150.0, "search": 140.0, "policy": 150.0, "moves": 3},
        "lua": {"default": 10.0, "search": 10.0, "policy": 12.0, "moves": 0},
    }


@pytest.mark.unit
def test_the_yield_curve_reads_each_search_at_a_budget_and_counts_its_compiles():
    """A search's best after k compiles, summed; one that stopped early keeps its last
    best, one that never beat the default found nothing; a compile at 1.2x plain is 1.2
    build-equivalents a module."""
    base = {"a": 100.0, "b": 50.0, "c": 10.0}
    curves = {"a": [100.0, 96.0, 96.0, 90.0], "b": [50.0, 48.0], "c": [10.0, 12.0]}
    assert found_at(curves["a"], 100.0, 0) == 0.0
    assert yield_curve(base, curves, (1, 2, 4, 8)) == {1: 0.0, 2: 6.0, 4: 12.0, 8: 12.0}
    seconds, compiles, plain = {"a": 2.4, "b": 1.2}, {"a": 4, "b": 2}, {"a": 0.5, "b": 0.5}
    assert build_equivalents(seconds, compiles, plain) == pytest.approx(1.2)


@pytest.mark.unit
def test_a_sampled_ceilings_spread_holds_its_share_and_widens_with_uneven_modules():
    """Modules alike give an interval of one point, their share; one module holding all the
    gain gives a wide one around the sample's share, from nothing up."""
    totals = {f"m{i}": 100.0 for i in range(20)}
    even = {n: 1.0 for n in totals}
    assert sampled_share_interval(even, totals) == pytest.approx((0.01, 0.01))
    lone = {"m0": 20.0}
    lo, hi = sampled_share_interval(lone, totals)
    assert lo == 0.0 < 0.01 < hi and hi > 0.02


@pytest.mark.unit
def test_a_module_that_stopped_giving_gives_its_compiles_to_the_others():
    """Six compiles a module's CPU: uniformly, "late" finds 5 bytes by its sixth; a budget
    that stops "flat" once it went 4 compiles finding nothing gives its compiles to
    "late", which finds 30 at its seventh; at a patience of 2, "late" stops too early."""
    base = {"flat": 100.0, "late": 100.0}
    curves = {"flat": [100.0] * 8, "late": [100.0, 100.0, 95.0, 95.0, 95.0, 95.0, 70.0]}
    cost = {"flat": 1.0, "late": 1.0}
    assert yield_curve(base, curves, (6,)) == {6: 5.0}
    assert stalled_found(base, curves, cost, 12.0, patience=4) == 30.0
    assert stalled_found(base, curves, cost, 12.0, patience=2) == 5.0
    assert stalled_found(base, curves, cost, 4.0, patience=4) == 0.0  # the starts alone


@pytest.mark.unit
def test_lto_headroom_row_sets_each_search_beside_its_own_baseline():
    search = {"default": 1000.0, "search": 980.0, "policy": 1000.0, "moves": 3, "compiles": 50}
    row = {
        "recipe": "lua",
        "per_file_text": 2000,
        "lto_text": 1980,
        "lto_objects_text": 1001,
        "link_search": search,
        "file_search": dict(search, search=990.0, compiles=48),
        "tests": {"per-file": "passed", "lto": "passed"},
    }
    cells = [c._cells for c in headroom_lto.table([row]).columns]
    assert [c[0] for c in cells] == [
        "lua",
        "2,000",
        "1,980 (-1.00%)",
        "1,000 (lto.o 1,001)",
        "-2.00% (50 compiles)",
        "-1.00% (48 compiles)",
    ]


@pytest.mark.unit
def test_linked_estimate_counts_a_shared_group_three_ways():
    parts = {"a.o": TextParts(10, {"f": 6}), "b.o": TextParts(20, {"f": 6, "g": 4})}
    defined_in = Counter({"f": 2, "g": 1})
    assert linked_estimate.totals(parts, defined_in) == {
        "objects": 46,
        "linked once": 40,
        "1/n": pytest.approx(40.0),
    }


@pytest.mark.unit
def test_size_by_linkage_sums_the_change_per_binding():
    before = {"f": ("weak", 10), "g": ("global", 20), "gone": ("local", 5)}
    after = {"f": ("weak", 14), "g": ("global", 20), "new": ("local", 3)}
    row = size_by_linkage.linkage_change(before, after)
    assert (row["weak"], row["global"], row["local"]) == (4, 0, -2)
    assert row["weak_functions_changed"] == 1 and row["global_functions_changed"] == 0
    assert row["local_functions_changed"] == 2 and row["default_functions"] == 35


# --- serving, scale-out, the wrapper ----------------------------------------------------


@pytest.mark.unit
def test_service_bench_summaries():
    reps = [[100, 5000, 9000, 20000], [100, 7000, 11000, 30000], [100, 6000, 10000, 25000]]
    assert bench_service.rtt_summary(reps) == {
        "decisions_per_rep": 100,
        "p50_us": 6.0,
        "p90_us": 10.0,
        "p99_us": 25.0,
        "p50_us_range": [5.0, 7.0],
    }
    times = {"plain": [10.0, 10.0], "mlgo-cc": [11.0, 12.0]}
    cpu = {"plain": [20.0, 10.0], "mlgo-cc": [22.0, 12.0]}
    build = bench_service.build_summary(times, cpu)["mlgo-cc"]
    assert build["overhead_pct"] == pytest.approx(15.0)
    assert build["cpu_overhead_pct"] == pytest.approx(13.333, abs=1e-3)
    assert build["paired_cpu_overhead_pct"]["median"] == pytest.approx(15.0)
    status = "Name:\tmlgo\nVmRSS:\t  1234 kB\nThreads:\t7\n"
    assert bench_service.memory_and_threads(status) == {"rss_kb": 1234, "threads": 7}


@pytest.mark.unit
def test_service_bench_writes_what_the_channel_driver_reads():
    spec = TensorSpec("callee_users", "int64_t", (1,))
    run = ModuleRun("m", (spec,), features={"callee_users": np.array([[3], [4]])},
                    advice=np.zeros(2, np.int64))  # fmt: skip
    data = bench_service.chunk_file([run], "inlining_decision")
    first, rest = data.split(b"\n", 1)
    assert first == b"8 3"  # 8-byte advice; the header and two observations
    chunks = []
    while rest:
        size = int.from_bytes(rest[:4], "little")
        chunks.append(rest[4 : 4 + size])
        rest = rest[4 + size :]
    assert json.loads(chunks[0])["advice"]["name"] == "inlining_decision"
    assert chunks[2] == b'{"observation": 1}\n' + np.int64(4).tobytes() + b"\n"


@pytest.mark.unit
def test_scale_bench_busy_fraction_counts_only_the_window():
    spans = [(0.0, 10.0), (5.0, 20.0)]  # the second runs past the window's end
    assert bench_scale.busy_fraction(spans, 0.0, 10.0, 2) == pytest.approx(0.75)
    assert bench_scale.busy_fraction(spans, 10.0, 10.0, 2) == 0.0


@pytest.mark.unit
def test_wrapper_bench_changes_are_per_round_against_the_baseline():
    rounds = [{"baseline": 1.0, "new": 1.01}, {"baseline": 2.0, "new": 2.0},
              {"baseline": 1.0, "new": 0.98}]  # fmt: skip
    from tools.lab.wrappers import changes

    median, q1, q3 = changes(rounds, "new")
    assert median == pytest.approx(0.0) and q1 < 0 < q3


@pytest.mark.unit
def test_regalloc_bench_heldout_and_overhead_figures():
    costs = ("spill_reload_cost", "copies_cost", "regalloc_cost", "text_size")
    row = {**{k: 90.0 for k in costs}, **{f"default_{k}": 100.0 for k in costs}}
    ev = evaluation(
        "regalloc-eviction", {"zlib/a.o": row, "lua/b.o": {**row, "spill_reload_cost": 110.0}}
    )
    figures = bench_regalloc.heldout_figures(ev)
    assert figures["spill_reload_cost"] == {"policy": 200.0, "default": 200.0, "delta": 0.0}
    assert figures["spill_reload_by_package"] == pytest.approx({"zlib": -0.1, "lua": 0.1})

    cpu = {"plain": [10.0, 10.0], "direct": [10.5, 10.4], "service": [11.0, 10.8]}
    clang = {"plain": [10.0, 10.0], "direct": [10.2, 10.2], "service": [10.2, 10.2]}
    o = bench_regalloc.overhead_summary(cpu, clang, cpu, control=[0.2, 0.2])
    assert set(o["cpu_overhead"]) == {"direct", "service"}
    assert o["cpu_overhead"]["service"]["median"] == pytest.approx(0.09)
    assert o["parts"] == pytest.approx(
        {"clang ML mode": 0.02, "policy server": 0.05, "service (lease, control plane)": 0.02}
    )


# --- XLA --------------------------------------------------------------------------------


@pytest.mark.unit
def test_xla_bench_ratios_and_summary():
    assert bench_xla.ratio([2.0, 2.0, 2.0], [1.0, 2.0, 4.0]) == {"median": 1.0, "iqr": 0.75}
    medians = {bench_xla.AA: 1.0, "tuned": 1.1, "tuned verify": 0.9, "tuned top3": 1.0}
    row = {
        "vs_jit": {name: {"median": m} for name, m in medians.items()},
        "tuning_overhead_s": {"tuned": 1.0, "tuned verify": 2.0, "tuned top3": 3.0},
        "exhaustive_s": 10.0,
        "ceiling": 1.21,
    }  # fmt: skip
    summary = bench_xla.summary([row, {**row, "ceiling": 1.0}])
    assert summary["tuned geomean"] == pytest.approx(1.1)
    assert summary["tuned verify worst"] == pytest.approx(0.9)
    assert summary["tuned top3 tuning vs exhaustive"] == pytest.approx(0.3)
    assert summary["ceiling geomean"] == pytest.approx(1.1)
    assert f"{bench_xla.AA} tuning vs exhaustive" not in summary


@pytest.mark.unit
def test_xla_baselines_give_each_tile_three_ways_and_name_a_bad_one():
    runs, invalid = bench_xla_baselines.runs_for(["8:8:2", "8:8:99"])
    assert runs["mlgo:8:8:2"] == ("", "8:8:2") and runs["default"] == ("", "")
    assert runs["xla_flags:8:8:2"][0].endswith("xla_llvm_ir_gemm_tile_size=8:8:2")
    assert set(invalid) == {"mlgo:8:8:99"} and "N = 99" in invalid["mlgo:8:8:99"]


# --- every script -------------------------------------------------------------------------


def test_the_tools_are_found():
    assert len(SCRIPTS) >= 15 and len(C_SOURCES) >= 2


@pytest.mark.parametrize("script", SCRIPTS)
def test_each_script_answers_help(script):
    r = subprocess.run(
        [sys.executable, "-m", f"tools.{script}", "--help"],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert r.returncode == 0, r.stderr
    assert "usage" in r.stdout.lower()


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (["--reps", "0"], "error: --reps 0: at least 1 repeat is needed"),
        (["--policy", "absent"], "error: absent/policy.json: missing (not a policy directory)"),
    ],
)
def test_the_service_benchmark_refuses_bad_input_before_any_build(args, says, tmp_path):
    """One line, and nothing made: neither its work directory nor its JSON."""
    out, work = tmp_path / "service.json", tmp_path / "work"
    r = subprocess.run(
        [sys.executable, "-m", "tools.bench_service", "--parts", "build", *args,
         "--work", str(work), "--out", str(out)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert r.returncode == 1 and r.stderr == says + "\n" and not r.stdout
    assert not out.exists() and not work.exists()


@pytest.mark.parametrize("tool", ["retime_tune", "bench_profile_inputs"])
@pytest.mark.parametrize(
    ("files", "says"),
    [
        ({}, "has no tune.json (not a tune's directory)"),
        ({"tune.json": "{}"}, "has no report.json (not a finished tune)"),
        ({"tune.json": "{}", "report.json": "{}"}, "report.json (no 'package')"),
    ],
)
def test_a_tool_given_what_is_not_a_finished_speed_tune_says_so_in_one_line(
    tool, files, says, tmp_path
):
    for name, text in files.items():
        (tmp_path / name).write_text(text)
    r = subprocess.run(
        [sys.executable, "-m", f"tools.{tool}", str(tmp_path)],
        capture_output=True, text=True, timeout=60, cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )  # fmt: skip
    assert r.returncode == 1 and r.stderr.count("\n") == 1 and says in r.stderr, r.stderr
    assert r.stderr.startswith(f"{tool}: {tmp_path}") and not r.stdout
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(files)


def test_the_timing_bench_times_one_build_against_itself_both_ways(tmp_path):
    """Each method gives one A/A ratio a round; a workload that fails is one line."""
    true = Workload("true", (), (("true",),))
    aa = bench_timing.aa_rounds(true, tmp_path, rounds=3, seconds=0.01)
    assert aa["loops"] >= 1
    assert len(aa["blocks"]["runs"]) == len(aa["turns"]["runs"]) == 3
    out = tmp_path / "timing.json"
    r = subprocess.run(
        [sys.executable, "-m", "tools.bench_timing", "--tree", str(tmp_path), "--rounds", "2",
         "--json", str(out), "--", "false"],
        capture_output=True, text=True, timeout=60, cwd=ROOT,
    )  # fmt: skip
    assert r.returncode == 1 and r.stderr.startswith("error: false failed in") and not out.exists()


@pytest.mark.toolchain
@pytest.mark.parametrize("source", C_SOURCES, ids=lambda p: p.name)
def test_each_c_peer_compiles_without_warnings(source, tmp_path):
    # the benchmarks build these with the system's cc, as a user's machine would
    cc = shutil.which("cc")
    assert cc, "no C compiler (cc) on PATH"
    r = subprocess.run(
        [cc, "-O2", "-Wall", "-Wextra", "-Werror", "-o", str(tmp_path / source.stem), str(source)],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    assert (tmp_path / source.stem).stat().st_size > 0


@pytest.mark.unit
def test_the_reward_is_ranked_against_the_measured_change():
    """Spearman's rho of (reward change, measured change) pairs; none below three pairs or
    when one side never moves."""
    assert bench_speed_reward.rank([(0.01, 0.02), (0.05, 0.03), (0.30, 0.15)]) == 1.0
    assert bench_speed_reward.rank([(0.01, 0.15), (0.05, 0.03), (0.30, 0.02)]) == -1.0
    assert bench_speed_reward.rank([(0.0, 0.01), (0.0, 0.02), (0.0, 0.03)]) is None
    assert bench_speed_reward.rank([(0.01, 0.02), (0.05, 0.03)]) is None


@pytest.mark.unit
def test_a_measured_change_is_paired_by_round_and_split_in_halves():
    """Each clock's change against the default round by round, and the medians of the
    first and the second half of the rounds apart: how well the measure agrees with itself."""
    default = [1.0, 2.0, 1.0, 2.0]
    times = {
        "cpu": {"default": default, "x": [1.1, 2.2, 0.9, 1.8]},
        "user": {"default": default, "x": default},
    }
    change = bench_speed_reward.measured(times, "x")
    assert change["cpu"]["halves"] == pytest.approx([0.1, -0.1])
    assert change["cpu"]["median"] == pytest.approx(0.0)
    assert change["user"]["median"] == 0.0 and change["user"]["halves"] == [0.0, 0.0]


@pytest.mark.unit
def test_link_recipe_card_shows_every_candidate_the_test_and_the_commands_that_rebuild_it():
    """The shipped link-time policy's card, from its recipe's record and data
    (`modelcard.chosen_card`): the kept candidate marked, each package's test change, the
    links without the guard, and the run with the options it was made with."""
    from dataclasses import replace

    from mlgo.train.modelcard import chosen_card
    from tools.lab.reproduce import CHOICE_HOW

    policy = replace(load_policy(shipped_policy("inlining-size-link")), guard="size")

    def judged(change: float, larger: list[str]) -> dict:
        packages = {"zlib": change}
        return {"change_pct": change, "packages_larger": larger, "packages": packages,
                "by_language_pct": {"C": change}}  # fmt: skip

    result = {
        "validation": {"shipped per-file policy": judged(-1.0, []), "trained": judged(-2, ["a"])},
        "chosen": "shipped per-file policy",
        "test": judged(-0.773, []),
        "test, the policy alone": judged(-0.736, ["cmark"]),
    }
    how = {"spent": 56.0, "train": -0.494, "guarded": ", served guarded"}
    lines = load_policy_recipe(shipped_policy("inlining-size-link")).reproduce_lines()
    card = chosen_card(policy, result, CHOICE_HOW.format(**how), lines)
    assert "BC-Max trained 56 minutes" in card and "each program, served guarded;" in card
    assert "| shipped per-file policy (kept) | -1.000% | - |" in card
    assert "| trained | -2.000% | a |" in card
    assert "| all | -0.773% |\n| all C | -0.773% |\n| zlib | -0.773% |" in card
    assert "without the guard: -0.736%, larger: cmark." in card
    assert "mlgo corpus build --lto full zlib bzip2 lz4 " in card
    assert "reproduce_policy policies/inlining-size-link --release\n```\n" in card


def test_the_lab_projects_and_workloads_are_recipes_of_the_one_format():
    """tools/projects/ and tools/workloads/ hold recipes the product's loader reads: every
    project has a language and a shell workload, every workload extends a shipped recipe
    (its build) with commands of its own."""
    from mlgo.packages.recipes import load_recipe
    from tools.lab.projects import PROJECTS, project_recipe
    from tools.lab.workloads import PROGRAMS, WORKLOADS_DIR

    assert len(PROJECTS) >= 15 and len(PROGRAMS) >= 4
    for name in PROJECTS:
        recipe = project_recipe(name)
        assert recipe.language in ("C", "C++") and recipe.bench[0].startswith("sh -c ")
        assert recipe.build and recipe.source
    for name, workload in PROGRAMS.items():
        extended = load_recipe(name, WORKLOADS_DIR)
        assert extended.build == load_recipe(workload.recipe).build and workload.commands


@pytest.mark.unit
def test_every_shipped_recipe_loads_and_its_card_reproduces_it_by_that_recipe():
    """Each policies/*/recipe.toml loads whole, and its policy's card's "Reproduce" section
    is the recipe's lines: its corpora's builds and the one command that runs it."""
    from mlgo.train.modelcard import reproduce_section, with_reproduce

    recipes = sorted((ROOT / "policies").glob("*/recipe.toml"))
    assert [r.parent.name for r in recipes] == ["inlining-size-guarded", "inlining-size-link"]
    for path in recipes:
        recipe = load_policy_recipe(path.parent)
        assert recipe.release == Path("policies") / path.parent.name
        card = (path.parent / "MODEL_CARD.md").read_text()
        lines = recipe.reproduce_lines()
        assert reproduce_section(card) == lines
        assert (
            lines[-1] == f"python -m tools.reproduce_policy policies/{path.parent.name} --release"
        )
        assert all(c.command() in lines for c in recipe.corpora.values())
        assert with_reproduce(card, lines) == card  # nothing else in the card changes
    link = load_policy_recipe(shipped_policy("inlining-size-link"))
    assert link.stage("train").minutes == 55 and link.stage("choose").guard == "size"
    assert link.stage("choose").gates == (0.6, 0.8, 0.95, 0.98, 0.99, 0.995, 0.999)
    guarded = load_policy_recipe(GUARDED)  # the chain that made the shipped weights
    bcmax = guarded.stage("bcmax")
    assert (bcmax.start, bcmax.steps, bcmax.minutes) == ("inlining-size", 3, 60.0)
    assert bcmax.options["search_budget"] == 24 and guarded.stage("calibrate").guard == "size"
    scratch = load_policy_recipe(SCRATCH)
    assert [(s.name, getattr(s, "minutes", None)) for s in scratch.stages] == [
        ("bc", 0.0), ("es", 30.0), ("es-mix", 20.0), ("bcmax", 85.0), ("calibrate", None)
    ]  # fmt: skip


@pytest.mark.unit
def test_a_recipe_changed_by_the_tools_flags_says_so_in_its_reproduce_line(tmp_path):
    """Per-stage changes (the old tools' flags) reach the stages and the card's line."""
    from mlgo.train.modelcard import reproduce_section, with_reproduce
    from tools.lab.recipe import overridden

    recipe = overridden(
        load_policy_recipe(SCRATCH),
        {"bcmax": 45.0},
        0.5,
        {"es": "c", "es-mix": "tinyxml,snappy"},
        {"train": tmp_path / "t"},
    )
    minutes = [s.minutes for s in recipe.stages if hasattr(s, "minutes")]
    assert minutes == [0.0, 15.0, 10.0, 45.0]
    assert [getattr(s, "packages", None) for s in recipe.stages][1:3] == [
        "c",
        ("tinyxml", "snappy"),
    ]
    assert f"--split train --out {tmp_path / 't'}" in recipe.corpora["train"].command()
    flags = ["--minutes", "bcmax=45"]
    card = "# p\n\n## Reproduce\n\n```sh\nold\n```\n\n## Measured\n\nrows\n"
    changed = with_reproduce(card, recipe.reproduce_lines(flags))
    assert changed.endswith("```\n\n## Measured\n\nrows\n") and changed.startswith("# p\n\n")
    assert reproduce_section(changed)[-1].endswith(
        "reproduce_policy tools/recipes/inlining-size-scratch --minutes bcmax=45 --release"
    )
    unguarded = overridden(
        load_policy_recipe(shipped_policy("inlining-size-link")), guards={"choose": "none"}
    )
    assert unguarded.stage("choose").guard is None


@pytest.mark.unit
def test_a_tunes_memory_peaks_are_taken_by_stage_over_its_whole_process_tree():
    """tools/bench_memory: a process's tree is it and every descendant; a sample counts in
    the first stage that ended after it, and each stage keeps its largest sample."""
    from datetime import datetime

    from tools.lab.memory import Sample, peaks_by_stage, sample, tree

    assert tree(1, {2: 1, 3: 2, 4: 9, 5: 3}) == {1, 2, 3, 5}
    me = sample(os.getpid(), 0.0)
    assert 0 < me.largest <= me.total
    t = datetime(2026, 12, 2, 16, 0, 0).timestamp()
    ended = {"record": "2026-12-02T16:00:10", "train": "2026-12-02T16:01:00"}
    taken = [Sample(t + 5, 7, 3), Sample(t + 9, 9, 4), Sample(t + 30, 5, 5), Sample(t + 99, 1, 1)]
    peaks = peaks_by_stage(taken, ended)
    assert peaks == {"record": taken[1], "train": taken[2], "after": taken[3]}
