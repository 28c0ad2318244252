"""`mlgo corpus record`: corpora from real CMake, Meson and autotools builds of the small
projects in tests/data/record, and from their compilation databases."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
from contextlib import closing
from pathlib import Path

import pytest
import typer

from mlgo.corpus.extract import MLGO_UTILS_DIR
from mlgo.corpus.format import DESCRIPTION, Corpus, load_corpus
from mlgo.corpus.record import Recorded, record, record_from
from mlgo.corpus.stats import corpus_stats
from mlgo.llvm.toolchain import Toolchain
from mlgo.options import opt_level
from mlgo.problems import get_problem
from mlgo.problems.policy_files import load_policy
from mlgo.runtime.commands import BuildError
from mlgo.runtime.workers import LocalPool
from mlgo.traces.collect import collect
from mlgo.train.evaluate import evaluate
from tests.cli_helpers import POLICIES
from tests.conftest import DATA, run_mlgo

PROJECTS = DATA / "record"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Recording work directories and stats caches stay in the test's own directory."""
    monkeypatch.setenv("MLGO_CACHE", str(tmp_path / "cache"))


def project(name: str, tmp_path: Path) -> Path:
    return shutil.copytree(PROJECTS / name, tmp_path / name)


def sh(line: str) -> list[str]:
    return ["sh", "-c", line]


def check_corpus(result: Recorded, packages: dict[str, int]) -> Corpus:
    """The recording wrote the corpus it says, loadable, at -Oz, with nothing skipped."""
    assert result.packages == packages and result.skipped == []
    corpus = load_corpus(result.out)
    assert len(corpus.modules) == sum(packages.values())
    assert {m.opt_level for m in corpus.modules} == {"-Oz"}
    return corpus


@pytest.mark.slow  # a CMake project configured and built
def test_cmake_out_of_tree_c_and_cxx_is_recorded_and_collected(tc: Toolchain, tmp_path):
    src = project("cmake", tmp_path)
    result = record(
        sh("cmake -B build && cmake --build build"), tmp_path / "corpus", tc, source_dir=src
    )
    corpus = check_corpus(result, {"app": 1, "lib": 1})
    cxx = {m.name: "-fcxx-exceptions" in m.args for m in corpus.modules}
    assert cxx == {"app/summarize.cpp": True, "lib/stats.c": False}
    # The user's own build is whole: the program was linked and runs.
    run = subprocess.run([src / "build" / "summarize", "1", "3"], capture_output=True, text=True)
    assert run.stdout == "mean 2 var 1\n"
    with closing(LocalPool(2)) as pool:
        stats, failures = corpus_stats(corpus, tc.describe(), tc.clang, pool)
        manifest = collect(get_problem("inlining-size"), corpus, tmp_path / "traces", tc, pool)
    assert not failures and all(s["text_size"] > 0 for s in stats.values())
    assert not manifest.failed and set(manifest.modules) == set(cxx)
    assert sum(m["decisions"] for m in manifest.modules.values()) > 0


def test_meson_builddir_and_its_compilation_database_are_recorded(tc: Toolchain, tmp_path):
    src = project("meson", tmp_path)
    result = record(
        sh("meson setup builddir && ninja -C builddir"), tmp_path / "built", tc, source_dir=src
    )
    built = check_corpus(result, {"src": 2, "tools": 1})
    # Meson writes compile_commands.json by default: recompiling it records the same modules.
    from_db = record_from(src / "builddir" / "compile_commands.json", tmp_path / "db", tc, src)
    again = check_corpus(from_db, {"src": 2, "tools": 1})
    assert [m.name for m in again.modules] == [m.name for m in built.modules]
    for a, b in zip(built.modules, again.modules, strict=True):
        assert a.bitcode.read_bytes() == b.bitcode.read_bytes(), a.name


@pytest.mark.slow
def test_autotools_configured_under_record_is_recorded(tc: Toolchain, tmp_path, monkeypatch):
    """Into an OUT named relative to here, as a user types it (`--out ../corpus`)."""
    src = project("autotools", tmp_path)
    monkeypatch.chdir(src)
    result = record(sh("autoreconf -i && ./configure && make"), Path("../corpus"), tc)
    check_corpus(result, {"src": 2})
    run = subprocess.run([src / "wc2", "two words", "three"], capture_output=True, text=True)
    assert run.stdout == "3\n"


def test_a_makefile_that_names_ar_itself_links_against_its_archive(tc: Toolchain, tmp_path):
    """A build that runs `ar` by name, not $(AR), gets LLVM's: GNU ar indexes the recorded
    objects through whichever LLVM's bfd plugin is installed, and an older one leaves the
    archive without symbols (seen on hiredis: undefined references linking its tests)."""
    src = shutil.copytree(DATA / "minipkg", tmp_path / "wordcount")
    build = (
        '"$CC" -c hash.c strbuf.c && ar rcs libwc.a hash.o strbuf.o && ranlib libwc.a '
        '&& "$CC" -c main.c && "$CC" main.o libwc.a -o wc'
    )
    check_corpus(record(sh(build), tmp_path / "corpus", tc, source_dir=src), {"wordcount": 3})
    run = subprocess.run([src / "wc"], input="a b a", capture_output=True, text=True)
    assert run.stdout == "words: 3 distinct: 2\n"


def test_from_compile_commands_names_what_it_could_not_record(tc: Toolchain, tmp_path):
    """CMake's database (configured with the system compiler, never built) plus an entry
    that does not compile and one that is not C or C++; all under one --package."""
    src = project("cmake", tmp_path)
    subprocess.run(
        ["cmake", "-B", "build", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"],
        cwd=src,
        check=True,
        capture_output=True,
    )
    database = src / "build" / "compile_commands.json"
    entries = json.loads(database.read_text())
    (src / "lib" / "broken.c").write_text("int broken(void) { return }\n")
    (src / "lib" / "start.s").write_text(".globl start\nstart:\n ret\n")
    for name in ("broken.c", "start.s"):
        entries.append(
            {"directory": str(src), "file": f"lib/{name}", "command": f"cc -c lib/{name}"}
        )
    database.write_text(json.dumps(entries))
    result = record_from(database, tmp_path / "corpus", tc, source_dir=src, package="mine")
    assert result.packages == {"mine": 2}
    assert [m.name for m in load_corpus(result.out).modules] == [
        "mine/app/summarize.cpp",
        "mine/lib/stats.c",
    ]
    assert len(result.skipped) == 2
    assert result.skipped[0].endswith("lib/start.s: not C or C++, not recorded")
    assert "lib/broken.c: compile failed (" in result.skipped[1]
    assert "error:" in result.skipped[1] and "\n" not in result.skipped[1]
    # The user's build tree got no object of ours.
    assert not list((src / "build").rglob("*.o"))


def gcc_by_path() -> str:
    """gcc named by its path, the one way past the wrappers' masquerade."""
    gcc = shutil.which("gcc")
    if gcc is None:
        pytest.skip("no gcc")
    return shlex.quote(gcc)


def test_objects_without_bitcode_or_from_outside_are_named(tc: Toolchain, tmp_path):
    src = shutil.copytree(DATA / "minipkg", tmp_path / "wordcount")
    (tmp_path / "outside.c").write_text("int outside(void) { return 1; }\n")
    gcc = gcc_by_path()
    build = f'"$CC" -c hash.c -o hash.o && {gcc} -c main.c -o main.o && "$CC" -c ../outside.c'
    result = record(sh(build), tmp_path / "corpus", tc, source_dir=src)
    # A file at the top of the source directory is in the package named after it.
    assert result.packages == {"wordcount": 1}
    assert [m.name for m in load_corpus(result.out).modules] == ["wordcount/hash.c"]
    assert len(result.skipped) == 2
    assert "outside.c: outside the source directory" in result.skipped[0]
    assert "main.o: no bitcode (not compiled by the recording CC/CXX" in result.skipped[1]


def test_a_makefile_that_sets_cc_itself_is_recorded_or_told_how(tc: Toolchain, tmp_path):
    """`CC = gcc` in a hand-written Makefile runs the wrappers, first on PATH under gcc's
    name (clang behind them, never the wrapper again); gcc named by its path is told how to
    record. The build writes into its tree what a plain build does."""
    gcc = gcc_by_path()
    src = shutil.copytree(DATA / "minipkg", tmp_path / "wordcount")
    plain = shutil.copytree(src, tmp_path / "plain")
    objs = "main.o hash.o strbuf.o"
    for tree in (src, plain):
        (tree / "Makefile").write_text(f"CC=gcc\nwc: {objs}\n\t$(CC) -o wc {objs}\n")
    check_corpus(record(["make"], tmp_path / "corpus", tc, source_dir=src), {"wordcount": 3})
    subprocess.run(["make"], cwd=plain, check=True, capture_output=True)
    assert sorted(p.name for p in src.iterdir()) == sorted(p.name for p in plain.iterdir())
    run = subprocess.run([src / "wc"], input="a b a", capture_output=True, text=True)
    assert run.stdout == "words: 3 distinct: 2\n"
    (src / "Makefile").write_text(f"CC={gcc}\nwc: {objs}\n\t$(CC) -o wc {objs}\n")
    with pytest.raises(BuildError) as e:
        record(["make", "-B"], tmp_path / "corpus", tc, source_dir=src)
    assert "nothing to record (3 objects skipped, the first: " in str(e.value)
    assert "no bitcode" in str(e.value) and "`make -e`" in str(e.value)
    assert record(["make", "-B", "-e"], tmp_path / "corpus", tc, source_dir=src).packages == {
        "wordcount": 3
    }


def test_a_failed_or_empty_recording_keeps_the_previous_corpus(tc: Toolchain, tmp_path):
    src = shutil.copytree(DATA / "minipkg", tmp_path / "src")
    out = tmp_path / "corpus"
    record(sh('"$CC" -c hash.c -o hash.o'), out, tc, source_dir=src)
    before = sorted(p.name for p in out.iterdir())
    with pytest.raises(BuildError, match=r"failed \(.*log: ") as failed:
        record(sh('"$CC" -c missing.c -o m.o'), out, tc, source_dir=src)
    with pytest.raises(BuildError, match="an up-to-date build compiles nothing"):
        record(["true"], out, tc, source_dir=src)
    assert "\n" not in str(failed.value)
    assert sorted(p.name for p in out.iterdir()) == before
    assert [m.name for m in load_corpus(out).modules] == ["src/hash.c"]


@pytest.mark.unit
def test_an_out_that_is_not_a_corpus_is_refused_untouched(tmp_path):
    out = tmp_path / "notes"
    out.mkdir()
    (out / "todo.txt").write_text("mine")
    with pytest.raises(BuildError, match="exists and is not a corpus"):
        record(["make"], out, None, source_dir=tmp_path)  # type: ignore[arg-type]
    assert (out / "todo.txt").read_text() == "mine"


@pytest.mark.unit
@pytest.mark.parametrize(
    "content, message",
    [
        (None, "compile_commands.json: not found"),
        ("{not json", "compile_commands.json: not valid JSON (Expecting property name"),
        ('{"file": "a.c"}', "not a compilation database (needs a non-empty list)"),
    ],
)
def test_a_bad_compilation_database_is_one_line(tmp_path, content, message):
    database = tmp_path / "compile_commands.json"
    if content is not None:
        database.write_text(content)
    with pytest.raises(BuildError, match=r"^[^\n]*$") as e:
        record_from(database, tmp_path / "out", None, tmp_path)  # type: ignore[arg-type]
    assert message in str(e.value)
    assert not (tmp_path / "out").exists()


def test_an_extract_ir_corpus_from_compile_commands_loads_in_stats_and_eval(
    tc: Toolchain, tmp_path
):
    """A corpus LLVM's own extract_ir wrote from a compile_commands.json, without mlgo's
    recording, is a corpus for `mlgo corpus stats` and `mlgo eval`."""
    src = shutil.copytree(DATA / "minipkg", tmp_path / "src")
    entries = []
    for c in sorted(src.glob("*.c")):
        cmd = [tc.clang, "-Oz", "-Xclang", "-fembed-bitcode=all", "-c", c.name, "-o", f"{c.stem}.o"]
        subprocess.run(cmd, cwd=src, check=True)
        entries.append({"directory": str(src), "file": c.name, "arguments": cmd})
    (src / "compile_commands.json").write_text(json.dumps(entries))
    extract_ir = [
        *(sys.executable, "-S", "-m", "mlgo.corpus.extract_ir", "--input_type", "json"),
        *("--input", str(src / "compile_commands.json"), "--output_dir", str(tmp_path / "c")),
        *("--llvm_objcopy_path", tc.tool("llvm-objcopy")),
    ]
    env = dict(os.environ, PYTHONPATH=str(MLGO_UTILS_DIR))
    subprocess.run(extract_ir, check=True, env=env, capture_output=True, cwd=tmp_path)
    assert (tmp_path / "c" / DESCRIPTION).is_file()
    corpus = load_corpus(tmp_path / "c")
    assert [m.name for m in corpus.modules] == ["hash.o", "main.o", "strbuf.o"]
    policy = load_policy(POLICIES / "inlining-size")
    with closing(LocalPool(2)) as pool:
        stats, failures = corpus_stats(corpus, tc.describe(), tc.clang, pool)
        ev = evaluate(policy, corpus, tc, pool, policy.problem)
    assert not failures and len(stats) == 3
    assert not ev.failed and ev.totals()["modules"] == 3


@pytest.mark.unit
def test_the_opt_level_option_takes_only_clangs_levels():
    assert opt_level("-O2") == "-O2"
    with pytest.raises(typer.BadParameter, match="'O2' is not one of -O0..-O3, -Os, -Oz"):
        opt_level("O2")


def test_a_failed_build_is_one_line_that_ends_with_its_log(tmp_path):
    """The build's error line is cut, never the path of the log that holds the rest."""
    why = "error: " + "x" * 400
    build = f"echo {why} >&2; exit 1"
    r = run_mlgo(
        "corpus", "record", "--out", str(tmp_path / "c"), "--", "sh", "-c", build, timeout=60
    )
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    log = Path(r.stderr.rsplit("log: ", 1)[1].removesuffix(")\n"))
    assert log.name == "build.log" and why in log.read_text()
    assert not (tmp_path / "c").exists()


def test_the_command_records_a_compilation_database_and_refuses_no_build(tc, tmp_path):
    """`mlgo corpus record` as a user runs it: --from a CMake database; and with neither a
    build command nor --from, one line and exit 2."""
    src = project("cmake", tmp_path)
    subprocess.run(
        ["cmake", "-B", "build", "-DCMAKE_EXPORT_COMPILE_COMMANDS=ON"],
        cwd=src,
        check=True,
        capture_output=True,
    )
    out = tmp_path / "corpus"
    database = src / "build" / "compile_commands.json"
    args = ["corpus", "record", "--out", str(out), "--from", str(database)]
    r = run_mlgo(*args, "--source-dir", str(src), timeout=300)
    assert r.returncode == 0, r.stderr
    assert "2 modules: app (1), lib (1)" in r.stdout
    assert len(load_corpus(out).modules) == 2
    r = run_mlgo("corpus", "record", "--out", str(tmp_path / "none"), timeout=60)
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert "build command" in r.stderr and not (tmp_path / "none").exists()
