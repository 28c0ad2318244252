"""`mlgo corpus record` on a tree with a file whose name is not UTF-8 (b"caf\\xe9.c", Latin-1):
the build passes as it does without mlgo, everything else is recorded, and that file is
named on one `skipped` line. Under bear 3 the whole build failed ("gRPC call failed": bear
sends each exec's arguments as protobuf strings, which must be UTF-8)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from mlgo.corpus.format import load_corpus
from mlgo.corpus.record import record, work_dir
from mlgo.llvm.toolchain import Toolchain
from tests.conftest import run_mlgo

LATIN1 = b"caf\xe9"


@pytest.fixture(autouse=True)
def private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MLGO_CACHE", str(tmp_path / "cache"))


def latin1_project(root: Path) -> Path:
    """caf\\xe9.c and main.c, compiled and linked by a Makefile that names them as bytes."""
    root.mkdir()
    (root / os.fsdecode(LATIN1 + b".c")).write_text("int cafe(void) { return 7; }\n")
    (root / "main.c").write_text("int cafe(void);\nint main(void) { return cafe(); }\n")
    (root / "Makefile").write_bytes(
        b"prog: " + LATIN1 + b".o main.o\n\t$(CC) -o prog " + LATIN1 + b".o main.o\n"
    )
    return root


def test_a_file_name_that_is_not_utf8_is_skipped_and_the_rest_recorded(tc: Toolchain, tmp_path):
    plain = latin1_project(tmp_path / "plain")
    made = subprocess.run(["make", f"CC={tc.clang}"], cwd=plain, capture_output=True)
    assert made.returncode == 0, made.stderr

    src = latin1_project(tmp_path / "shop")
    result = record(["make"], tmp_path / "corpus", tc, source_dir=src)
    assert result.packages == {"shop": 1}
    assert [m.name for m in load_corpus(result.out).modules] == ["shop/main.c"]
    assert result.skipped == [f"{src}/caf\\xe9.c: its file name is not UTF-8, not recorded"]
    # the user's build is whole: both files compiled, the program linked and runs
    assert subprocess.run([src / "prog"]).returncode == 7
    assert not (work_dir(tmp_path / "corpus") / "compiles").exists()


def test_the_command_names_the_file_on_one_line_and_records_the_rest(tc: Toolchain, tmp_path):
    src = latin1_project(tmp_path / "shop")
    out = tmp_path / "corpus"
    r = run_mlgo(
        "corpus", "record", "--out", str(out), "--source-dir", str(src), "--", "make", timeout=120
    )
    assert r.returncode == 0, r.stderr
    assert "1 modules: shop (1)" in r.stdout
    skipped = [line for line in r.stderr.splitlines() if "not recorded" in line]
    assert skipped == [f"not recorded {src}/caf\\xe9.c: its file name is not UTF-8, not recorded"]


def test_the_recording_wrapper_compiles_after_the_recording(tc: Toolchain, tmp_path):
    """A build configured under `record` names the wrapper; once the recording is over it
    compiles as the compiler does, logging nothing."""
    src = shutil.copytree(Path(__file__).parent / "data" / "minipkg", tmp_path / "wordcount")
    record(["sh", "-c", '"$CC" -c hash.c'], tmp_path / "corpus", tc, source_dir=src)
    wrapper = work_dir(tmp_path / "corpus") / "cc"
    again = subprocess.run([wrapper, "-c", "strbuf.c", "-o", "later.o"], cwd=src)
    assert again.returncode == 0 and (src / "later.o").is_file()
    assert not (work_dir(tmp_path / "corpus") / "compiles").exists()
