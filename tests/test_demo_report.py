"""The program report `mlgo demo`, `mlgo build` and `mlgo tune` write: a smaller program
that runs measurably slower is flagged; report.html has a plot for each kind of data the
report holds (built here from two real ELF trees and a real workload measurement), and
`mlgo report` shows it again."""

import base64
import json
import re
import subprocess
import sys
import time

import pytest
from rich.console import Console

from mlgo.llvm.sizes import SizeRow, compare_trees, text_size
from mlgo.packages.recipes import Recipe
from mlgo.programs.build import ProgramBuild
from mlgo.programs.measure import recipe_throughput
from mlgo.programs.report import (
    PER_FILE,
    TOP,
    directories,
    load_report,
    program_report,
    render_html,
    report_table,
    slower_but_smaller,
    top_changes,
    training_line,
    tune_cost,
    write_report,
    written_apart,
)
from mlgo.train.stages import Stage, StageRecord, run_stages
from tests.conftest import run_mlgo


def report(size_pct: float, iqr: list[float]) -> dict:
    return {
        "package": "zlib",
        "policy": "p",
        "size": {
            "baseline": 1000,
            "policy": round(1000 * (1 + size_pct / 100)),
            "change_pct": size_pct,
            "files": 3,
            "programs": {"minigzip": {"baseline": 500, "policy": 490, "change_pct": -2.0}},
        },
        "throughput": {"change_pct": sum(iqr) / 2, "iqr_pct": iqr},
        "tests": {"baseline": "passed", "policy": "passed"},
    }


@pytest.mark.parametrize(
    ("size_pct", "iqr", "flagged"),
    [
        (-2.0, [0.5, 1.5], True),  # smaller, and every middle round slower
        (-2.0, [-0.5, 1.5], False),  # slower within the noise
        (+1.0, [0.5, 1.5], False),  # larger: nothing was traded
        (-2.0, [-1.5, -0.5], False),  # smaller and faster
    ],
)
def test_a_smaller_but_measurably_slower_build_is_flagged(size_pct, iqr, flagged):
    r = report(size_pct, iqr)
    assert slower_but_smaller(r) is flagged
    console = Console(width=200, record=True)
    console.print(report_table(r))
    assert ("smaller but slower" in console.export_text()) is flagged


def test_linked_files_that_grew_are_named_even_when_the_total_shrank():
    r = report(-0.5, [-1.5, -0.5])
    grew = [("prog", 400, 404), ("tool", 100, 102), ("libx.so", 300, 301), ("t", 50, 51)]
    r["size"]["linked"] = {"baseline": 5850, "policy": 5808, "change_pct": -0.72, "files": 5,
                           "larger": [{"path": f"b/{p}", "baseline": b, "policy": n}
                                      for p, b, n in grew]}  # fmt: skip
    console = Console(width=200, record=True)
    console.print(report_table(r))
    text = console.export_text()
    assert "larger: 4 of them" in text  # the most bytes first, ties by path
    assert "b/prog +4 B (+1.00%), b/tool +2 B (+2.00%), b/libx.so +1 B (+0.33%) and 1 more" in text
    del r["size"]["linked"]["larger"]  # a report written before files were named
    console = Console(width=200, record=True)
    console.print(report_table(r))
    assert "larger" not in console.export_text()


def test_no_workload_no_throughput_row():
    r = report(-2.0, [0.5, 1.5])
    del r["throughput"]
    console = Console(width=200, record=True)
    console.print(report_table(r))
    assert not slower_but_smaller(r) and "IQR" not in console.export_text()


# -- report.html, from two real trees ----------------------------------------------------
PROGRAM = """#include <stdio.h>
static unsigned mix(unsigned h, unsigned x) { return (h ^ x) * 16777619u + (x << 3); }
int main(void) {
  unsigned h = 2166136261u;
  for (unsigned i = 0; i < 3000000; i++) h = mix(h, i % 251);
  printf("%u\\n", h);
  return 0;
}
"""
LIBRARY = "int sum(const int *a, int n) { int s = 0; for (int i = 0; i < n; i++) s += a[i] * i;"
LIBRARY += " return s; }\n"
# what ES's state.json history holds, one row per step (pool reward every few steps)
CURVE = [
    {"step": 1, "compiles": 48, "es/batch_reward_mean": -0.01, "es/batch_reward_max": 0.0},
    {"step": 2, "compiles": 96, "es/batch_reward_mean": 0.002, "es/pool_reward": 0.004},
]
PNG_IMG = re.compile(r'<img src="data:image/png;base64,([A-Za-z0-9+/=]+)">')


@pytest.fixture(scope="module")
def built(tc, tmp_path_factory):
    """Two trees of one small package (a program and a library object) compiled at -Oz
    (the baseline) and -O2 (standing in for the policy: other sizes, the same output),
    its workload measured on both, and the report of the pair."""
    root = tmp_path_factory.mktemp("tiny")
    (root / "prog.c").write_text(PROGRAM)
    (root / "sum.c").write_text(LIBRARY)
    trees = {"plain": root / "plain", "mlgo": root / "mlgo"}
    builds = []
    for (name, tree), level in zip(trees.items(), ("-Oz", "-O2"), strict=True):
        (tree / "lib").mkdir(parents=True)
        subprocess.run(
            [tc.clang, level, "-c", root / "sum.c", "-o", tree / "lib/sum.o"], check=True
        )
        subprocess.run([tc.clang, level, root / "prog.c", "-o", tree / "prog"], check=True)
        builds.append(
            ProgramBuild("tiny", name, 1.0, 1.0, {"prog": text_size(tree / "prog")}, "passed")
        )
    recipe = Recipe("tiny", "tiny", (), bench=("./prog",), bench_check="./prog | grep -qx '[0-9]*'")
    speed = recipe_throughput(recipe, trees, rounds=3, seconds=0.05)
    r = program_report(tuple(builds), trees, [root / "policy"], speed)
    r["training"] = {"steps": 2, "curve": CURVE}
    return root, r


def test_the_linked_files_are_counted_apart_from_the_objects(built):
    root, r = built
    linked = r["size"]["linked"]
    assert linked["files"] == 1  # prog; lib/sum.o is an object
    assert linked["baseline"] == text_size(root / "plain" / "prog")
    assert linked["policy"] == text_size(root / "mlgo" / "prog")
    console = Console(width=200, record=True)
    console.print(report_table(r))
    assert "1 programs and shared libraries" in console.export_text()


def pictures(page: str) -> list[bytes]:
    return [base64.b64decode(b) for b in PNG_IMG.findall(page)]


def test_report_html_has_every_plot_and_the_tables_numbers(built, tmp_path):
    _, r = built
    write_report(r, tmp_path)
    kept, per_file = written_apart(r)
    assert load_report(tmp_path) == kept == json.loads((tmp_path / "report.json").read_text())
    assert json.loads((tmp_path / PER_FILE).read_text()) == per_file and len(per_file) == 2
    page = (tmp_path / "report.html").read_text()
    for section in ("size", "throughput", "training"):
        assert f"<h2 id='{section}'>" in page
    pics = pictures(page)
    assert len(pics) == 3 and all(p.startswith(b"\x89PNG") for p in pics)
    size = r["size"]
    assert size["files"] == 2 and size["baseline"] != size["policy"]
    assert f"{size['baseline']:,}" in page and f"{size['change_pct']:+.2f}%" in page
    speed = r["throughput"]
    assert len(speed["ratios_pct"]) == 3 and "instructions_change_pct" in speed
    assert f"{speed['change_pct']:+.2f}%" in page and r["policy"] in page
    # the A/A control beside it: the baseline against itself, in the same rounds
    assert len(speed["control_iqr_pct"]) == 2 and "CPU time, A/A control" in page


@pytest.mark.parametrize("absent", ["size", "throughput", "training"])
def test_a_plot_without_its_data_is_left_out(built, tmp_path, absent):
    _, r = built
    r = json.loads(json.dumps(r))
    if absent == "size":  # no file changed
        r["size"]["top_files"] = top_changes([])
    else:
        del r[absent]
    write_report(r, tmp_path)
    page = (tmp_path / "report.html").read_text()
    assert f"<h2 id='{absent}'>" not in page and len(pictures(page)) == 2
    assert "tests" in page and r["policy"] in page


def test_a_report_that_cannot_be_drawn_leaves_the_old_one_alone(built, tmp_path):
    _, r = built
    (tmp_path / "report.json").write_text("the old report")
    broken = dict(r, size={"per_file": []})  # no totals: the table cannot be made
    with pytest.raises(KeyError):
        write_report(broken, tmp_path)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["report.json"]
    assert (tmp_path / "report.json").read_text() == "the old report"


def test_mlgo_report_shows_a_program_report_again(built, tmp_path):
    root, r = built
    write_report(r, root / "out")
    html, js = tmp_path / "r.html", tmp_path / "r.json"
    cmd = ("report", str(root / "out"), "--html", str(html), "--json", str(js))
    done = run_mlgo(*cmd, timeout=120)
    assert done.returncode == 0, done.stderr
    assert "ELF files" in done.stdout and "CPU time" in done.stdout
    assert json.loads(js.read_text()) == written_apart(r)[0]
    assert len(pictures(html.read_text())) == 3
    again = run_mlgo("report", str(js), timeout=120)  # the JSON it wrote is a report too
    assert again.returncode == 0 and "ELF files" in again.stdout, again.stderr


def test_mlgo_report_on_a_directory_with_no_report_says_so(tmp_path):
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "report.json").write_text('{"package": "x"}')
    for where, says in ((tmp_path, "holds neither a report.json nor an eval.json"),
                        (tmp_path / "bad", "not a program report")):  # fmt: skip
        done = run_mlgo("report", str(where), "--html", str(tmp_path / "r.html"), timeout=60)
        assert done.returncode == 2 and says in done.stderr, done.stderr
        assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert not (tmp_path / "r.html").exists()
    # `mlgo build`'s output: one report per package, and the line says where
    done = run_mlgo("report", str(tmp_path), timeout=60)
    assert f"one per package: {tmp_path / 'bad'}" in " ".join(done.stderr.split())


def test_objects_in_directories_named_by_a_configuration_hash_are_counted(tc, tmp_path):
    # zstd's objects are in obj/conf_<md5 of CC and flags>/, which differs between the two
    # builds: they were left out, and zstd's size was its one program's alone
    (tmp_path / "sum.c").write_text(LIBRARY)
    a, b, c = "2aecd475cc1814de22821cd69cdfb9cc", "8fe0857422e822bada0dfafbc06a910c", "0" * 32
    dirs = {
        "plain": ("lib/conf_" + a, "twice/conf_" + a, "short/conf_abc"),
        "mlgo": ("lib/conf_" + b, "twice/conf_" + b, "twice/conf_" + c, "short/conf_def"),
    }
    for (tree, where), level in zip(dirs.items(), ("-Oz", "-O2"), strict=True):
        for d in where:
            (tmp_path / tree / d).mkdir(parents=True)
            out = tmp_path / tree / d / "sum.o"
            subprocess.run([tc.clang, level, "-c", tmp_path / "sum.c", "-o", out], check=True)
    sizes = [text_size(tmp_path / t / dirs[t][0] / "sum.o") for t in ("plain", "mlgo")]
    assert sizes[0] != sizes[1]
    # twice/: two candidates in one tree, short/: not a hash; neither is paired
    rows = compare_trees(tmp_path / "mlgo", tmp_path / "plain")
    assert rows == [SizeRow("lib/conf_*/sum.o", *sizes)]


@pytest.mark.unit
def test_the_training_line_says_when_no_judged_candidate_beat_clangs_own():
    training = {
        "corpus_change_pct": {"shipped": -1.0, "trained": -3.0},
        "metric": "spill_reload_cost against -O2", "chosen": "shipped", "note": "on its code",
        "judged_by": "the workload", "judged_change_pct": {"shipped": 0.4, "trained": 1.2},
    }  # fmt: skip
    line = training_line(training)
    assert "chosen by the workload: shipped +0.40%, trained +1.20%" in line
    assert "none was cheaper than clang's own by it" in line
    training["judged_change_pct"]["shipped"] = -0.1
    assert "none was cheaper" not in training_line(training)


# -- a report of thousands of files, and what a tune cost ---------------------------------
def many_files(count: int) -> dict:
    """A size report of COUNT made-up object files in COUNT/10 directories: every 7th
    grown by its index in bytes, the others smaller by theirs, so that the largest of each
    are the last files."""
    per_file = [
        {"path": f"d{i % (count // 10)}/f{i}.o", "baseline": 10_000,
         "policy": 10_000 + (i if i % 7 == 0 else -i)}
        for i in range(1, count + 1)
    ]  # fmt: skip
    base, ours = sum(f["baseline"] for f in per_file), sum(f["policy"] for f in per_file)
    return {
        "baseline": base, "policy": ours, "change_pct": 100 * (ours / base - 1),
        "files": count, "programs": {}, "per_file": per_file,
        "top_files": top_changes(per_file), "top_directories": top_changes(directories(per_file)),
    }  # fmt: skip


@pytest.mark.unit
def test_a_report_of_thousands_of_files_names_the_top_ten_and_its_table_does_not_grow(tmp_path):
    tables = {}
    for count in (100, 5000):
        r = dict(report(-1.0, [-1.5, -0.5]), size=many_files(count))
        console = Console(width=400, record=True)
        console.print(report_table(r))
        tables[count] = console.export_text()
    assert len(tables[100].splitlines()) == len(tables[5000].splitlines())
    text = tables[5000]
    # 714 of the 5000 grew (every 7th): the most by bytes first, each a regression, in red
    assert "files larger: 714 of 5,000" in text and "files smaller: 4,286 of 5,000" in text
    assert "d498/f4998.o +4,998 B (+49.98%), d491/f4991.o +4,991 B" in text
    assert "d0/f5000.o -5,000 B (-50.00%), d499/f4999.o -4,999 B" in text
    assert (
        "and 711 more" in text
        and "and 4,283 more" in text
        and "directories smaller: 500 of 500" in text
    )
    size = r["size"]
    top = size["top_files"]
    assert len(top["saved"]) == len(top["grown"]) == TOP
    assert [f["path"] for f in top["grown"][:2]] == ["d498/f4998.o", "d491/f4991.o"]
    assert all(f["policy"] > f["baseline"] for f in top["grown"])
    dirs = size["top_directories"]["saved"]
    assert (dirs[0]["path"], dirs[0]["files"]) == ("d495", 10)
    # report.json keeps the lists and totals; every file goes to per_file.json beside it
    write_report(r, tmp_path)
    kept = json.loads((tmp_path / "report.json").read_text())
    assert "per_file" not in kept["size"] and kept["size"]["top_files"] == top
    assert json.loads((tmp_path / PER_FILE).read_text()) == size["per_file"]
    assert load_report(tmp_path) == kept == written_apart(r)[0]
    page = (tmp_path / "report.html").read_text()
    assert "10 of the 714 files larger" in page and "10 of the 500 directories smaller" in page
    assert page.count("<tr>") < 100 and "d498/f4998.o" in page and PER_FILE in page
    # a report.json from before the lists, every file inline: its files' rows as well
    old = dict(r, size={k: v for k, v in size.items() if not k.startswith("top_")})
    console = Console(width=400, record=True)
    console.print(report_table(old))
    assert "files larger: 714 of 5,000" in console.export_text()
    assert "directories" not in console.export_text()


def burn(run: None) -> None:
    """A stage that compiles, as far as the clock can tell: a child busy for 0.3 CPU s."""
    subprocess.run([sys.executable, "-c", BUSY], check=True)


BUSY = "import time\nend = time.process_time() + 0.3\nwhile time.process_time() < end: pass"


@pytest.mark.unit
def test_a_tunes_report_says_what_its_out_holds_and_its_peak_memory(tmp_path):
    """OUT's parts by bytes on disk (a link is not followed: its own size, not its
    target's) and this run's peak memory, in the notes under the table."""
    from mlgo.programs.report import cost_lines, disk_use, peak_memory
    from mlgo.programs.tune_run import TuneDir

    out = TuneDir(tmp_path / "out")
    (out.corpus / "pkg").mkdir(parents=True)
    (out.corpus / "pkg" / "a.bc").write_bytes(b"x" * 3_000_000)
    out.train.mkdir()
    (out.train / "checkpoint.npz").write_bytes(b"y" * 1_000_000)
    (out.train / "big").symlink_to(out.corpus / "pkg" / "a.bc")
    disk = disk_use(out)
    assert disk["corpus"] == 3_000_000 and disk["pristine"] == 0
    assert 1_000_000 < disk["train"] < 1_000_100
    peak = peak_memory()
    assert peak["tune"] > 10_000_000  # this Python, at least
    cost = {
        "seconds": 60.0,
        "build_cpu_seconds": 1.0,
        "stages": {},
        "disk": disk,
        "peak_memory": peak,
    }
    lines = cost_lines({"cost": cost})
    assert "OUT holds 4.0 MB (corpus 3.0 MB, train 1.0 MB)" in lines
    assert any(line.startswith("peak memory of this run: the tune ") for line in lines)


@pytest.mark.unit
def test_a_tunes_cost_is_each_stages_wall_and_cpu_in_builds_and_its_searchs_compiles(tmp_path):
    stages = [Stage("build", burn), Stage("wait", lambda run: time.sleep(0.2)),
              Stage("report", burn)]  # fmt: skip
    record = StageRecord(tmp_path / "stages.json", [s.name for s in stages])
    run_stages(stages, record, None, "test")
    summary = json.loads((tmp_path / "stages.json").read_text())
    assert summary["cpu_seconds"]["build"] >= 0.3 > summary["cpu_seconds"]["wait"]
    again = StageRecord.load(tmp_path / "stages.json", record.names)
    assert again.summary() == summary  # read back, it says the same
    training = {"compiles": 87, "compiles_per_build": 2.0}
    cost = tune_cost(summary, 0.1, training)
    assert set(cost["stages"]) == {"build", "wait"}  # the report's own is running
    build = cost["stages"]["build"]
    assert build["builds"] == round(summary["cpu_seconds"]["build"] / 0.1, 2) >= 3.0
    assert cost["seconds"] == round(summary["seconds"]["build"] + summary["seconds"]["wait"], 1)
    assert cost["search"] == {"compiles": 87, "builds": 43.5}
    r = dict(report(-1.0, [-1.5, -0.5]), cost=cost)
    console = Console(width=300, record=True)
    console.print(report_table(r))
    text = " ".join(console.export_text().split())
    assert f"build {build['seconds']:.1f} s ({build['builds']:.1f} builds)" in text
    assert "training's search: 87 compiles, 43.5 builds" in text and "minutes of wall time" in text
    page = render_html(r)
    assert "<h2 id='cost'>" in page and "43.50" in page
    # a record from before CPU was kept: the wall seconds alone, no build-equivalents
    old = tune_cost({"seconds": summary["seconds"]}, 0.1, {})
    assert "builds" not in old["stages"]["build"] and "search" not in old
    console = Console(width=300, record=True)
    console.print(report_table(dict(r, cost=old)))
    assert re.search(r"\d builds", console.export_text()) is None
