"""A real Debian source package end to end: apt-get source, build, extract, replay; and
`mlgo demo`'s whole loop on it (`mlgo tune` on its source): record, train, build twice,
test, measure, report. Those are the long tier (marked slow); the refusals run in the
default one."""

import json
import shutil
from pathlib import Path

import pytest

from mlgo.corpus.compile import replay_matches_default
from mlgo.corpus.format import load_corpus
from mlgo.llvm.sizes import text_size
from mlgo.packages.recipes import RECIPES
from mlgo.problems import get_problem
from tests.cli_helpers import mlgo
from tests.conftest import run_mlgo


@pytest.fixture(scope="module")
def zlib_demo(tmp_path_factory):
    """README's main job, `mlgo demo`, on zlib with one training iteration and a few workload
    rounds: its source and corpus, then the policy, both builds and report.json (in
    ROOT/tune, as `mlgo tune` writes them)."""
    root = tmp_path_factory.mktemp("zlib")
    r = run_mlgo(
        "demo", "--package", "zlib", "--out", str(root), "--train-steps", "1",
        "--bench-rounds", "4", timeout=900,
    )  # fmt: skip
    assert r.returncode == 0, r.stderr + r.stdout
    return root / "tune", r.stdout


@pytest.fixture(scope="module")
def zlib_corpus(zlib_demo):
    root, _ = zlib_demo
    return load_corpus(root / "corpus")


@pytest.mark.slow
def test_the_demo_records_the_package_and_collects_nothing_it_does_not_read(zlib_demo, zlib_corpus):
    """The corpus of every module; no traces of clang's own decisions, as training starts
    from the shipped policy and clones none."""
    root, out = zlib_demo
    assert len(zlib_corpus.modules) >= 15 and not (root / "traces").exists()
    assert "zlib" in out and "recording the corpus of zlib's build at -Oz" in out


def elf_text_total(tree: Path) -> int:
    return sum(
        text_size(p)
        for p in tree.rglob("*")
        if p.is_file() and not p.is_symlink() and p.read_bytes()[:4] == b"\x7fELF"
    )


@pytest.mark.slow
def test_the_demo_reports_size_throughput_and_tests_of_both_builds(zlib_demo):
    root, out = zlib_demo
    report = json.loads((root / "report.json").read_text())
    assert report["tests"] == {"baseline": "passed", "policy": "passed"}
    assert (Path(report["policy"]) / "policy.npz").is_file()
    assert report["training"]["steps"] == 1
    training = report["training"]
    assert {"default", "shipped", "trained"} <= set(training["corpus_change_pct"])
    changes = training["candidates_change_pct"]
    assert changes["default"] == 0.0 and changes[training["chosen"]] == min(changes.values())
    size = report["size"]
    trees = {v: root / "programs" / v for v in ("plain", "mlgo")}
    assert size["baseline"] == elf_text_total(trees["plain"])
    assert size["policy"] == elf_text_total(trees["mlgo"])
    assert size["change_pct"] == pytest.approx(100 * (size["policy"] / size["baseline"] - 1))
    assert set(size["programs"]) == {"minigzip", "example", "minigzipsh", "examplesh"}
    for prog, r in size["programs"].items():
        assert (r["baseline"], r["policy"]) == tuple(text_size(t / prog) for t in trees.values())
    speed = report["throughput"]
    q1, q3 = speed["iqr_pct"]
    assert q1 <= speed["change_pct"] <= q3 and speed["rounds"] == 4
    assert abs(speed["change_pct"]) < 50  # the same code, give or take inlining
    assert "instructions_change_pct" in speed  # valgrind is installed here
    assert "CPU time" in out and "ELF files" in out and "passed" in out
    assert "trained on" in out


@pytest.mark.slow
def test_the_demo_says_where_its_page_of_plots_is(zlib_demo):
    root, out = zlib_demo
    assert str(root / "report.html") in " ".join(out.split())
    page = (root / "report.html").read_text()
    report = json.loads((root / "report.json").read_text())
    # the per-file plot shows the files whose .text changed: with one step of training,
    # zlib may have none, and then that plot is left out
    every = json.loads((root / "per_file.json").read_text())  # apart from report.json
    changed = any(f["policy"] != f["baseline"] for f in every)
    assert "per_file" not in report["size"]
    assert ("<h2 id='size'>" in page) is changed
    assert "<h2 id='throughput'>" in page and "<h2 id='training'>" in page
    assert page.count('<img src="data:image/png;base64,') == 2 + changed


@pytest.mark.slow
def test_build_measures_the_workload_of_lua(tmp_path, monkeypatch):
    """`mlgo build lua`: both builds run the recipe's Lua script (its check passes on
    both, and both print the same), and the table, build.json and lua's report hold the
    paired change of its CPU time, as built and over two shuffled layouts of each build,
    and that of lua built with the script's profile."""
    args = ["--bench-rounds", "2", "--layouts", "2"]
    monkeypatch.setenv("COLUMNS", "200")  # the table's rows each on one line, to be read
    r = run_mlgo("build", "lua", "--out", str(tmp_path), *args, timeout=900)
    assert r.returncode == 0, r.stderr + r.stdout
    assert "CPU time" in r.stdout and "IQR" in r.stdout
    speed = json.loads((tmp_path / "build.json").read_text())["throughput"]["lua"]
    assert len(speed["ratios_pct"]) == 2 and speed["workload"] == ["src/lua bench.lua"]
    report = json.loads((tmp_path / "lua" / "report.json").read_text())
    assert report["throughput"] == speed and report["tests"]["policy"] == "passed"
    assert "<h2 id='throughput'>" in (tmp_path / "lua" / "report.html").read_text()
    over = speed["layouts"]
    assert over["layouts"] == 2 and over["rounds"] == 2 and len(over["per_layout_pct"]) == 2
    assert over["iqr_pct"][0] <= over["change_pct"] <= over["iqr_pct"][1]
    layouts = tmp_path / "lua" / "layouts"
    assert {"plain-layout-1", "mlgo-layout-2"} <= {p.name for p in layouts.iterdir()}
    pgo = speed["pgo"]
    assert pgo["tests"] == "passed" and len(pgo["ratios_pct"]) == 2
    assert pgo["profile"] == str((tmp_path / "lua" / "profile" / "default.profdata").resolve())
    assert "lua: PGO from your workload" in r.stdout


def test_the_demo_refuses_an_unknown_package_before_building(tmp_path):
    r = run_mlgo("demo", "--out", str(tmp_path / "d"), "--package", "no-such-pkg", timeout=60)
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "no recipe no-such-pkg.toml" in r.stderr and "Traceback" not in r.stderr
    assert not (tmp_path / "d").exists()


@pytest.mark.slow
def test_zlib_builds_and_extracts(zlib_corpus):
    names = {m.name for m in zlib_corpus.modules}
    assert {"zlib/deflate.c", "zlib/inflate.c", "zlib/trees.c"} <= names
    assert len(names) >= 15


@pytest.mark.slow
def test_default_replay_reproduces_plain_oz_byte_for_byte(zlib_corpus, tc):
    problem = get_problem("inlining-size")
    mismatched = [
        m.name for m in zlib_corpus.modules if not replay_matches_default(problem, m, tc.clang)
    ]
    assert mismatched == []


def test_unknown_recipe_fails_alone(tmp_path):
    r = run_mlgo(
        "corpus",
        "build",
        "no-such-pkg",
        "--out",
        str(tmp_path / "c"),
        "--work",
        str(tmp_path / "b"),
        timeout=300,
    )
    assert r.returncode == 1
    assert "failed no-such-pkg: no recipe no-such-pkg.toml" in " ".join(r.stderr.split())


@pytest.mark.slow
def test_a_split_builds_its_packages_names_a_failure_and_reuses_what_was_built(tmp_path):
    """`corpus build --split` reads splits.toml; a failing package is named and the others
    go on; a second run reuses the finished package instead of building it again."""
    data = tmp_path / "data"
    (data / "recipes").mkdir(parents=True)
    shutil.copy(RECIPES / "zlib.toml", data / "recipes")
    (data / "recipes" / "broken.toml").write_text('source = "zlib"\nbuild = ["false"]\n')
    (data / "splits.toml").write_text(
        '[train]\nzlib = { language = "C", domain = "compression" }\n'
        'broken = { language = "C", domain = "compression" }\n[validation]\n[test]\n'
    )
    out, work = tmp_path / "corpus", tmp_path / "build"
    args = ("corpus", "build", "--split", "train", "--out", str(out), "--work", str(work))
    first = mlgo(*args, env={"MLGO_DATA": str(data)}, timeout=600)
    assert first.returncode == 1, first.stderr
    lines = first.stderr.splitlines()
    built = [line for line in lines if line.startswith("built zlib: ")]
    assert built and any(line.startswith("failed broken: broken: build failed") for line in lines)
    assert lines[-1] == "1 of 2 failed: broken"
    modules = sorted(p.name for p in (out / "zlib").glob("*.bc"))
    assert len(modules) >= 15 and not (out / "broken").exists()
    log = (work / "zlib" / "build.log").read_text()
    shutil.rmtree(out / "zlib")  # a lost corpus comes back from the finished build
    again = mlgo(*args, env={"MLGO_DATA": str(data)}, timeout=600)
    assert again.returncode == 1
    assert built[0].replace("built", "reused") in again.stderr.splitlines()
    assert sorted(p.name for p in (out / "zlib").glob("*.bc")) == modules
    assert (work / "zlib" / "build.log").read_text() == log  # nothing was built again
