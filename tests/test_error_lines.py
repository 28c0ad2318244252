"""A failing build step is quoted by its own first error line: the compiler's
`a.c:1:23: error: ...`, not make's `*** ... Error 1` after it, a link line echoed around
it, a configure check that printed `-Werror: YES` before it, or the `$ command` logged
above it. The texts below are real output (make 4.3, Meson 1.0 and Ninja, clang-22)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from mlgo.runtime.commands import BuildError, run_logged
from mlgo.runtime.messages import error_line
from tests.conftest import run_mlgo

COMPILE_ERROR = "a.c:1:23: error: expected ';' after return statement"
CARET = """\
    1 | int a(void) { return 1 }
      |                       ^
      |                       ;
1 error generated.
"""
MAKE = f"""\
clang-22    -c -o a.o a.c
{COMPILE_ERROR}
{CARET}make: *** [<builtin>: a.o] Error 1
"""
MAKE_K = f"""\
clang-22    -c -o a.o a.c
{COMPILE_ERROR}
{CARET}make: *** [<builtin>: a.o] Error 1
clang-22    -c -o b.o b.c
make: Target 'prog' not remade because of errors.
"""
# -j4 -k: another program's link is echoed before the failing compile's diagnostics, in
# colour as CMake and Meson ask for under Ninja (-fdiagnostics-color=always)
MAKE_J4_K_COLOURED = """\
clang-22 -fdiagnostics-color=always   -c -o a.o a.c
clang-22 -fdiagnostics-color=always   -c -o b.o b.c
clang-22 -fdiagnostics-color=always   -c -o c.o c.c
clang-22 -o tool c.o
\x1b[1ma.c:1:23: \x1b[0m\x1b[0;1;31merror: \x1b[0m\x1b[1mexpected ';' after return statement\x1b[0m
    1 | \x1b[0;34mint\x1b[0m a(\x1b[0;34mvoid\x1b[0m) { \x1b[0;34mreturn\x1b[0m 1 }\x1b[0m
1 error generated.
make: *** [<builtin>: a.o] Error 1
make: Target 'all' not remade because of errors.
"""
# configure and build in one recorded line, as `mlgo tune --configure --build` records them
MESON_NINJA = f"""\
The Meson build system
Version: 1.0.1
C compiler for the host machine: clang-22 (clang 22.1.8 "Debian clang version 22.1.8")
C linker for the host machine: clang-22 ld.bfd 2.40
Compiler for C supports arguments -Werror: YES
Compiler for C supports arguments -Wno-error=unused: YES
meson.build:3: WARNING: Consider using the built-in werror option instead of using "-Werror".
Build targets in project: 1

Found ninja-1.11.1 at /usr/bin/ninja
ninja: Entering directory `build'
[1/3] Compiling C object prog.p/a.c.o
FAILED: prog.p/a.c.o
clang-22 -Iprog.p -I. -I.. -fcolor-diagnostics -Wall -O0 -g -Werror -Wno-error=unused -MD \
-MQ prog.p/a.c.o -MF prog.p/a.c.o.d -o prog.p/a.c.o -c ../a.c
../{COMPILE_ERROR}
{CARET}[2/3] Compiling C object prog.p/b.c.o
ninja: build stopped: subcommand failed.
"""
GNU_LD = """\
clang-22 -o prog main.o
/usr/bin/ld: main.o: in function `main':
main.c:(.text+0x10): undefined reference to `f'
clang-22: error: linker command failed with exit code 1 (use -v to see invocation)
make: *** [Makefile:2: prog] Error 1
"""
NO_RULE = """\
make: *** No rule to make target 'missing.c', needed by 'missing.o'.  Stop.
"""


@pytest.mark.unit
@pytest.mark.parametrize(
    ("output", "line"),
    [
        (MAKE, COMPILE_ERROR),
        (MAKE_K, COMPILE_ERROR),
        (MAKE_J4_K_COLOURED, COMPILE_ERROR),
        (MESON_NINJA, f"../{COMPILE_ERROR}"),
        (GNU_LD, "main.c:(.text+0x10): undefined reference to `f'"),
        (NO_RULE, NO_RULE.strip()),
        ("ok\nmake[1]: *** [Makefile:9: check] Error 1\nmake: *** [all] Error 2\n", "make[1]: ***"),
    ],
    ids=["make", "make-k", "make-j4-k-coloured", "meson-ninja", "gnu-ld", "no-rule", "make-only"],
)
def test_a_failed_build_is_quoted_by_its_first_error_line(output: str, line: str):
    assert error_line(output).startswith(line)


@pytest.mark.unit
def test_the_logged_command_is_not_its_own_error(tmp_path: Path):
    """run_logged logs `$ CMD` before CMD's output: a command that names an error (here a
    filter for one) is not the line that says why it failed."""
    log = tmp_path / "build.log"
    cmd = ["sh", "-c", "grep -v 'error: ' /dev/null; echo 'make: *** [all] Error 2'; exit 2"]
    with pytest.raises(BuildError) as e:
        run_logged(cmd, tmp_path, log, 30, what="the build")
    assert str(e.value) == f"the build failed (make: *** [all] Error 2; log: {log})"


def failing_project(root: Path) -> Path:
    """Two C files, one with a syntax error, and a link step."""
    root.mkdir()
    (root / "a.c").write_text("int a(void) { return 1 }\n")
    (root / "b.c").write_text("int a(void);\nint main(void) { return a(); }\n")
    (root / "Makefile").write_text("prog: a.o b.o\n\t$(CC) -o prog a.o b.o\n")
    return root


@pytest.mark.toolchain
@pytest.mark.parametrize("build", [["make"], ["make", "-k"]], ids=["make", "make-k"])
def test_a_recorded_build_that_fails_quotes_the_compilers_error(tmp_path, monkeypatch, build):
    monkeypatch.setenv("MLGO_CACHE", str(tmp_path / "cache"))
    src = failing_project(tmp_path / "project")
    out = tmp_path / "corpus"
    args = ["corpus", "record", "--out", str(out), "--source-dir", str(src), "--", *build]
    r = run_mlgo(*args, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"failed ({COMPILE_ERROR}; log: " in r.stderr
    assert not out.exists()


@pytest.mark.toolchain
@pytest.mark.skipif(not shutil.which("meson"), reason="meson is not installed")
def test_a_recorded_configure_and_build_quotes_the_compile_not_a_configure_check(
    tmp_path, monkeypatch
):
    """Meson's `Compiler for C supports arguments -Werror: YES` comes first in the log, and
    named an error to the old pattern."""
    monkeypatch.setenv("MLGO_CACHE", str(tmp_path / "cache"))
    src = failing_project(tmp_path / "project")
    (src / "meson.build").write_text(
        "project('p', 'c')\n"
        "add_project_arguments(meson.get_compiler('c').get_supported_arguments("
        "['-Werror', '-Wno-error=unused']), language: 'c')\n"
        "executable('prog', 'a.c', 'b.c')\n"
    )
    build = "meson setup build && ninja -C build"
    args = ["corpus", "record", "--out", str(tmp_path / "c"), "--source-dir", str(src)]
    r = run_mlgo(*args, "--", "sh", "-c", build, timeout=120)
    assert r.returncode == 2 and r.stderr.count("\n") == 1, r.stderr
    assert f"failed (../{COMPILE_ERROR}; log: " in r.stderr
