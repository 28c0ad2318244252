"""mlgo-cc decides on what clang reads: `@file` response files expanded, and inputs that `-x c`
or `-x c++` makes sources whatever their suffix. Otherwise such compiles would silently skip the
policy. The compiler itself still gets the user's arguments as they are."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import pytest

import mlgo.serve.cc as cc_module
from mlgo.llvm.driver import (
    RESPONSE_FILE_DEPTH,
    SEPARATE_VALUE_OPTIONS,
    compile_language,
    expand_response_files,
    link_output,
    link_stage,
    links_with_lld,
    opt_level,
    source_files,
    split_response_file,
    typed_sources,
)
from mlgo.serve.cc import optimizes, run
from mlgo.serve.native_wrapper import build_native_wrapper
from tests import test_service
from tests.test_service import SOURCES

native = test_service.native  # the running service, as its own tests start it
INSTALLED_CC = Path(sys.executable).parent / "mlgo-cc"  # `mlgo install-wrappers` puts it here


@pytest.fixture
def cwd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A working directory with a C source, a text file, a header and a directory in it."""
    monkeypatch.chdir(tmp_path)
    for name in ("x.c", "f.txt", "g.txt", "cfg.h", "out.txt"):
        (tmp_path / name).write_text("int f(void) { return 1; }\n")
    (tmp_path / "dir").mkdir()
    return tmp_path


@pytest.mark.unit
def test_response_files_split_as_clang_splits_them() -> None:
    # What clang-22 -### shows for this file: backslashes escape inside single quotes too,
    # a quoted empty string is no argument, an unclosed quote runs to the end.
    assert split_response_file("-D'A\\'B' \"-DC\\xD\" -DE\\ F '' -DG'H") == [
        "-DA'B",
        "-DCxD",
        "-DE F",
        "-DGH",
    ]
    assert split_response_file("-Oz\n\t-c  x.c\r\n-o x.o\n") == ["-Oz", "-c", "x.c", "-o", "x.o"]
    assert split_response_file("a\\") == ["a\\"]
    assert split_response_file("") == []


@pytest.mark.unit
def test_response_files_expand_nested_and_leave_the_unreadable(cwd: Path) -> None:
    (cwd / "sub").mkdir()
    (cwd / "sub" / "a.rsp").write_text("-Oz @b.rsp")  # nested names are the cwd's, as clang's
    (cwd / "sub" / "b.rsp").write_text("-DFROM_SUB")
    (cwd / "b.rsp").write_text("-c 'my file.c'")
    (cwd / "bom.rsp").write_bytes(b"\xef\xbb\xbf-O2")
    assert expand_response_files(["@sub/a.rsp", "-g"]) == ["-Oz", "-c", "my file.c", "-g"]
    assert expand_response_files(["@bom.rsp"]) == ["-O2"]
    assert expand_response_files(["@missing", "@", "@dir", "x@y"]) == [
        "@missing",
        "@",
        "@dir",
        "x@y",
    ]


@pytest.mark.unit
def test_response_file_recursion_is_bounded(cwd: Path) -> None:
    (cwd / "self.rsp").write_text("-c @self.rsp")
    assert expand_response_files(["@self.rsp"]) == ["-c"] * RESPONSE_FILE_DEPTH + ["@self.rsp"]


@pytest.mark.unit
def test_a_response_file_that_is_a_pipe_is_left_to_the_compiler(cwd: Path) -> None:
    """Reading `@<(...)` would take its arguments from clang (and block with no writer)."""
    os.mkfifo(cwd / "pipe")
    got: list[list[str]] = []
    reader = threading.Thread(target=lambda: got.append(expand_response_files(["@pipe"])))
    reader.start()
    reader.join(5)
    if reader.is_alive():  # unblock it before failing
        with open(cwd / "pipe", "w"):
            pass
    assert got == [["@pipe"]]


@pytest.mark.unit
def test_inputs_that_x_makes_sources(cwd: Path) -> None:
    args = ["-Oz", "-x", "c", "-c", "f.txt", "-o", "out.txt", "-include", "cfg.h", "-MF", "g.txt"]
    assert source_files(args) == ["f.txt"]
    assert optimizes(args) and opt_level(args) == "-Oz" and compile_language(args, True) == "c"
    cases = {
        ("-xc++", "-c", "cfg.h"): ["cfg.h"],
        ("-x", "c", "f.txt", "-x", "none", "g.txt", "x.c"): ["f.txt", "x.c"],
        ("-x", "c", "missing.txt", "dir", "-Xclang", "g.txt", "-I", "dir"): [],
        ("-x", "objective-c", "-c", "f.txt"): [],
        ("-c", "f.txt"): [],
        ("-x", "c", "-"): [],
        ("-x", "c++", "-c", "f.txt", "x.c"): ["f.txt", "x.c"],
    }
    for case, want in cases.items():
        assert source_files(list(case)) == want, case
    assert compile_language(["-x", "c++", "-c", "f.txt"], False) == "c++"
    assert not optimizes(["-Oz", "-x", "c", "-c", "-"])
    # every option taking the next argument: its value is never an input
    for option in SEPARATE_VALUE_OPTIONS:
        assert typed_sources(["-x", "c", option, "f.txt"]) == set(), option


class Exec(Exception):
    """os.execvp called: what the wrapper would run."""


@pytest.mark.unit
def test_the_compiler_gets_the_users_arguments(cwd: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The lease is asked for what the response file says; clang runs @file as given."""

    def execvp(file: str, argv: list[str]) -> None:
        raise Exec(argv)

    leases: list[tuple[str, str | None]] = []

    def lease(
        level: str, language: str | None, stage: str, timeout_s: float
    ) -> tuple[None, list[str], None, None, None]:
        leases.append((level, language))
        return None, [], None, None, None  # no policy serves it: the compiler as is

    monkeypatch.setattr(os, "execvp", execvp)
    monkeypatch.setattr(cc_module, "_lease", lease)
    for name in ("MLGO_DISABLE", "MLGO_GUARD", "MLGO_TIMEOUT", "MLGO_STRICT"):
        monkeypatch.delenv(name, raising=False)
    (cwd / "args.rsp").write_text("-Oz -c x.c -o x.o")
    with pytest.raises(Exec) as e:
        run("clang-22", ["@args.rsp", "-g"])
    assert e.value.args[0] == ["clang-22", "@args.rsp", "-g"] and leases == [("-Oz", "c")]

    with pytest.raises(Exec) as e:
        run("clang++-22", ["-Os", "-x", "c", "-c", "f.txt"], cxx_driver=True)
    assert e.value.args[0][1:] == ["-Os", "-x", "c", "-c", "f.txt"]
    assert leases[-1] == ("-Os", "c")

    (cwd / "pre.rsp").write_text("-E x.c")  # preprocessing: no lease at all
    with pytest.raises(Exec) as e:
        run("clang-22", ["-Oz", "@pre.rsp"])
    assert e.value.args[0] == ["clang-22", "-Oz", "@pre.rsp"] and len(leases) == 2


# Command lines, and whether the native wrapper hands them to Python: it must hand over every
# one that Python reads otherwise than by suffix (a response file, a source by -x), and may
# hand over a few more (it does not tell an option's value from an input).
COMMAND_LINES = [
    (["-Oz", "-c", "x.c", "-o", "out.txt"], False),
    (["-Oz", "@args.rsp"], True),
    (["-Oz", "-c", "x.c", "-o", "@missing"], True),
    (["-Oz", "-x", "c", "-c", "f.txt"], True),
    (["-Oz", "-xc", "-c", "f.txt", "-o", "out.txt"], True),
    (["-Oz", "-xc++", "-c", "cfg.h"], True),
    (["-Oz", "-x", "c", "-c", "x.c", "-o", "out.txt"], True),  # more than needed: -o's value
    (["-Oz", "-x", "c", "-c", "x.c"], False),
    (["-Oz", "-x", "c", "-c", "missing.txt", "dir"], False),
    (["-Oz", "-x", "c", "-", "-o", "x.o"], False),
    (["-Oz", "-x", "objective-c", "-c", "f.txt"], False),
    (["-Oz", "-x", "c", "f.txt", "-x", "none", "g.txt"], True),
    (["-Oz", "-x", "none", "-c", "f.txt"], False),
    (["-Oz", "-c", "f.txt"], False),
    (["-Oz", "-flto", "a.o", "b.o", "-o", "prog"], True),  # not lld: Python says why it is plain
    (["-Oz", "-flto", "-fuse-ld=lld", "a.o", "-o", "prog"], False),  # served here
    (["-Oz", "-flto=thin", "a.o", "-fno-lto", "-o", "prog"], False),
    (["-Oz", "-flto", "-c", "x.c"], False),
]


LINKS = [
    ["-Oz", "-flto", "a.o", "-fuse-ld=lld", "-o", "prog"],
    ["-flto=full", "a.o", "--ld-path=/opt/llvm/bin/ld.lld"],
    ["-flto", "-flto=thin", "a.o", "-fuse-ld=lld"],
    ["-flto=thin", "-fno-lto", "a.o", "-fuse-ld=lld"],
    ["-flto=thin", "-fuse-ld=lld", "-fuse-ld=bfd", "a.o", "-oprog"],
    ["-flto", "-c", "a.c"],
    ["-flto", "-E", "a.o"],
    ["-flto=jobserver", "a.o", "--output", "p"],
    ["a.o", "b.o"],
]


@pytest.mark.toolchain
def test_the_native_wrapper_tells_links_as_python_does(cwd: Path) -> None:
    """One rule in two languages: the stage of a link, whether lld links it, and what the
    messages name: its first source, or its output (mlgo.serve.cc.link_stage, links_with_lld,
    run's `source`)."""
    checker = cwd / "mlgo-cc-check"
    build_native_wrapper(checker, "-DMLGO_GUARD_CHECK")
    for args in LINKS:
        r = subprocess.run([checker, "link", *args], capture_output=True, text=True)
        named = (source_files(args) or [link_output(args)])[0]
        want = f"{link_stage(args) or 'none'} {int(links_with_lld(args))} {named}\n"
        assert r.returncode == 0 and r.stdout == want, (args, r.stdout)


@pytest.mark.toolchain
def test_the_native_wrapper_hands_python_what_it_reads_otherwise(cwd: Path) -> None:
    checker = cwd / "mlgo-cc-check"
    build_native_wrapper(checker, "-DMLGO_GUARD_CHECK")
    (cwd / "args.rsp").write_text("-c x.c")
    for args, hands_over in COMMAND_LINES:
        seen = expand_response_files(args)
        not_lld = bool(link_stage(seen)) and not links_with_lld(seen)
        python_reads_otherwise = seen != args or bool(typed_sources(seen)) or not_lld
        assert hands_over or not python_reads_otherwise, args
        r = subprocess.run([checker, "python", *args], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout == f"{int(hands_over)}\n", (args, r.stdout)


@pytest.mark.toolchain
def test_a_response_file_compile_gets_the_policy(native, tmp_path: Path) -> None:
    """Through the installed native wrapper: the policy service answers the compile."""
    assert INSTALLED_CC.exists(), "run `mlgo install-wrappers`"
    shutil.copy(SOURCES[0], tmp_path / "x.c")
    shutil.copy(SOURCES[0], tmp_path / "y.txt")
    (tmp_path / "args.rsp").write_text("-Oz -c x.c -o x.o\n")
    for args, obj in (["@args.rsp"], "x.o"), (["-Oz", "-x", "c", "-c", "y.txt"], "y.o"):
        before = native.status()
        r = subprocess.run(
            [INSTALLED_CC, *args], cwd=tmp_path, env=native.env(), capture_output=True, text=True
        )
        assert r.returncode == 0 and not r.stderr, r.stderr
        assert (tmp_path / obj).exists()
        after = native.status()
        assert after["compilations"] == before["compilations"] + 1, args
        served = [s.get("levels", {}).get("-Oz", {}).get("served", 0) for s in (before, after)]
        assert served[1] == served[0] + 1, args
        assert after["decisions"] > before["decisions"] and after["failed_compilations"] == 0
