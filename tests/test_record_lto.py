"""`mlgo corpus record --lto full|thin`: a corpus of a real make build's LTO links: the merged
module of each program or shared library, or each ThinLTO backend's module after import."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from mlgo.corpus.format import load_corpus
from mlgo.corpus.lto import linked_texts
from mlgo.corpus.record import record
from mlgo.llvm.sizes import text_size
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import get_problem
from mlgo.runtime.commands import BuildError
from tests.conftest import DATA, run_mlgo

# Sixty distinct functions, so that what a link adds of its own (crt, PLT: a few hundred
# bytes) is small beside the program's code.
OPS = r"""
#define OP(n) \
  long op##n(long x, int k) { \
    switch ((k + n) % 12) { \
    case 0: return x * (n + 3) + 7; \
    case 1: return (x ^ (n * 2654435761u)) >> 3; \
    case 2: return x / (n + 1) - x % (n + 5); \
    case 3: return (x << (n % 13)) | (x >> 7); \
    case 4: return x > n ? x - n * 11 : x + n * 13; \
    case 5: return x * x % (n * 97 + 1); \
    case 6: return (x & 0xffff) * (n + 17) + (x >> 16); \
    case 7: return x % 1009 * (n | 1) - 3; \
    case 8: return (x ^ (x >> 11)) * (n + 29); \
    case 9: return x < 0 ? -x * n : x * (n + 2) / 3; \
    case 10: return (x + n) * (x - n) % 65521; \
    default: return x + k * (n + 1); \
    } \
  }
#define TEN(m) OP(m##0) OP(m##1) OP(m##2) OP(m##3) OP(m##4) \
  OP(m##5) OP(m##6) OP(m##7) OP(m##8) OP(m##9)
#define NAMES(m) op##m##0, op##m##1, op##m##2, op##m##3, op##m##4, \
  op##m##5, op##m##6, op##m##7, op##m##8, op##m##9,
TEN(1) TEN(2) TEN(3) TEN(4) TEN(5) TEN(6)
static long (*const ops[])(long, int) = {NAMES(1) NAMES(2) NAMES(3) NAMES(4) NAMES(5) NAMES(6)};
long mix(long x, int rounds) {
  for (int i = 0; i < rounds; i++) x = ops[(x & 0x7fffffff) % 60](x, i);
  return x;
}
"""
MAIN = r"""
#include <stdio.h>
#include <stdlib.h>
long mix(long x, int rounds);
int main(int argc, char **argv) {
  for (int i = 1; i < argc; i++) printf("%ld\n", mix(atol(argv[i]), 100));
  return 0;
}
"""
# A program, a shared library, and a program one of whose objects the build removes once
# linked: its link cannot be replayed.
MAKEFILE = """\
all: bin/mix lib/libops.so tool

bin/mix: main.o ops.o
\tmkdir -p bin
\t$(CC) -o $@ main.o ops.o

lib/libops.so: ops.c
\tmkdir -p lib
\t$(CC) -fPIC -c ops.c -o ops.pic.o
\t$(CC) -shared -o $@ ops.pic.o

tool: tool.o ops.o
\t$(CC) tool.o ops.o -o tool && rm tool.o
"""
PROJECT = {
    "Makefile": MAKEFILE,
    "main.c": MAIN,
    "ops.c": OPS,
    "tool.c": "long mix(long x, int rounds);\nint main(void) { return mix(1, 2) > 0; }\n",
}


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLGO_CACHE", str(tmp_path / "cache"))


def project(root: Path) -> Path:
    root.mkdir()
    for name, text in PROJECT.items():
        (root / name).write_text(text)
    return root


def files(tree: Path) -> set[str]:
    return {str(p.relative_to(tree)) for p in tree.rglob("*")}


@pytest.mark.slow
def test_each_linked_output_is_one_module_near_the_links_text(tc: Toolchain, tmp_path):
    """Recorded through the command; the user's tree gets only what a plain build writes,
    and the link that cannot be replayed is one line."""
    src, plain = project(tmp_path / "calc"), project(tmp_path / "plain")
    subprocess.run(["make", f"CC={tc.clang}"], cwd=plain, check=True, capture_output=True)
    out = tmp_path / "corpus"
    args = ["corpus", "record", "--lto", "full", "--out", str(out), "--source-dir", str(src)]
    r = run_mlgo(*args, "--package", "calc", "--", "make", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "2 modules: calc (2)" in r.stdout
    assert r.stderr.count("\n") == 1, r.stderr
    assert f"{src / 'tool'}: its link failed again (" in r.stderr
    assert files(src) == files(plain)
    corpus = load_corpus(out)
    assert corpus.stage == "link"
    assert corpus.require(get_problem("inlining-size-link")) is corpus
    assert [m.name for m in corpus.modules] == ["calc/bin/mix", "calc/lib/libops.so"]
    for m in corpus.modules:
        assert m.opt_level == "-Oz"
        obj = tmp_path / "module.o"
        subprocess.run(m.compile_command(tc.clang, obj), check=True)
        linked = text_size(src / m.name.split("/", 1)[1])
        assert abs(text_size(obj) / linked - 1) < 0.03, (m.name, text_size(obj), linked)
    stats = run_mlgo("corpus", "stats", str(out), timeout=120)
    assert stats.returncode == 0 and "link stage" in stats.stdout, stats.stderr


def test_the_last_link_of_an_output_is_recorded_and_a_build_of_no_link_is_refused(
    tc: Toolchain, tmp_path
):
    src = project(tmp_path / "calc")
    build = (
        '"$CC" -c ops.c main.c && "$CC" -shared -o prog ops.o && '
        '"$CC" -o prog main.o ops.o && "$CC" -shared -o libops.so ops.o'
    )
    out = tmp_path / "corpus"
    result = record(["sh", "-c", build], out, tc, source_dir=src, package="p", stage="link")
    assert result.packages == {"p": 2} and result.skipped == []
    # prog was linked twice, a library first: the one recorded is the program, with main.
    assert "main" in (out / "p" / "prog.bc").read_bytes().decode("latin-1")
    with pytest.raises(BuildError, match="linked no program or shared library"):
        record(["sh", "-c", '"$CC" -c ops.c'], out, tc, source_dir=src, stage="link")
    assert len(load_corpus(out).modules) == 2


@pytest.mark.unit
def test_lto_is_full_or_thin(tmp_path):
    r = run_mlgo("corpus", "record", "--lto", "x", "--out", str(tmp_path), "--", "make", timeout=60)
    assert r.returncode == 2 and "use --lto full or --lto thin" in r.stderr


def test_thin_lto_records_each_backend_module_under_its_link(tc: Toolchain, tmp_path):
    """`--lto thin`: lld writes a backend's temporaries beside its input, and the user's tree
    still gets only what a plain build writes. Each backend module after import is named
    under its link; a link's modules, optimized and compiled as lld's backends do and
    linked once (`linked_texts`), land near the real link's `.text`."""
    src, plain = project(tmp_path / "calc"), project(tmp_path / "plain")
    subprocess.run(["make", f"CC={tc.clang}"], cwd=plain, check=True, capture_output=True)
    out = tmp_path / "corpus"
    args = ["corpus", "record", "--lto", "thin", "--out", str(out), "--source-dir", str(src)]
    r = run_mlgo(*args, "--package", "calc", "--", "make", timeout=120)
    assert r.returncode == 0, r.stderr
    assert "3 modules: calc (3)" in r.stdout and f"{src / 'tool'}: its link failed" in r.stderr
    assert files(src) == files(plain)
    corpus = load_corpus(out)
    assert corpus.stage == "thin-link"
    assert corpus.require(get_problem("inlining-size-thin")) is corpus
    assert [m.name for m in corpus.modules] == [
        "calc/bin/mix/001-main.o",
        "calc/bin/mix/002-ops.o",
        "calc/lib/libops.so/001-ops.pic.o",
    ]
    linked = linked_texts(tc, corpus)
    assert set(linked) == {"calc/bin/mix", "calc/lib/libops.so"}
    for name, size in linked.items():
        real = text_size(src / name.split("/", 1)[1])
        assert abs(size / real - 1) < 0.03, (name, size, real)


def test_a_cmake_build_archives_bitcode_with_this_llvm(tc: Toolchain, tmp_path):
    """CMake runs `llvm-ar` by that name for clang; Debian's unversioned one is an older
    LLVM that cannot read this clang's bitcode: the wrappers' own comes first on PATH."""
    src = tmp_path / "cmake"
    subprocess.run(["cp", "-r", str(DATA / "record" / "cmake"), str(src)], check=True)
    out = tmp_path / "corpus"
    build = "cmake -B build > /dev/null && cmake --build build"
    result = record(["sh", "-c", build], out, tc, source_dir=src, package="p", stage="link")
    assert result.packages == {"p": 1}
    assert [m.name for m in load_corpus(out).modules] == ["p/build/summarize"]


@pytest.mark.slow
def test_corpus_build_lto_full_records_a_debian_package_s_links(tmp_path):
    """`mlgo corpus build --lto full`: a recipe's Debian build, its links' merged modules a
    package of a corpus of the link stage, as for a split to train a link-time policy on."""
    out, work = tmp_path / "corpus", tmp_path / "build"
    args = ["corpus", "build", "zlib", "--lto", "full", "--out", str(out), "--work", str(work)]
    r = run_mlgo(*args, timeout=900)
    assert r.returncode == 0, r.stderr
    corpus = load_corpus(out)
    assert corpus.stage == "link"
    names = {m.name for m in corpus.modules}
    assert {"zlib/minigzip", "zlib/example"} <= names and all(n.startswith("zlib/") for n in names)
    again = run_mlgo(*args, timeout=300)  # a finished package is reused, as per file
    assert again.returncode == 0 and "reused zlib" in again.stderr, again.stderr


def test_a_program_compiled_and_linked_in_one_call_is_a_full_lto_link(tc: Toolchain, tmp_path):
    """`cc -o prog a.c b.c` links its sources' bitcode in lld's LTO too: replayed, it compiles
    them again. Not for ThinLTO (a backend's temporaries would land beside the driver's own
    objects), nor once its output is gone (a configure test's)."""
    src = project(tmp_path / "calc")
    build = '"$CC" -o one main.c ops.c && "$CC" -o gone main.c ops.c && rm gone'
    out = tmp_path / "corpus"
    result = record(["sh", "-c", build], out, tc, source_dir=src, package="p", stage="link")
    assert result.packages == {"p": 1} and result.skipped == []
    assert [m.name for m in load_corpus(out).modules] == ["p/one"]
    with pytest.raises(BuildError, match="linked no program or shared library"):
        record(["sh", "-c", build], tmp_path / "thin", tc, source_dir=src, stage="thin-link")
