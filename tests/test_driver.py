"""One reading of clang's command line (mlgo.llvm.driver): its suffixes are clang's own,
everything that reads a command line (mlgo-cc, a recorded build) reads it through it, and the
native wrapper, built with its lists, reads every command line made of them as Python does."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from mlgo.corpus.extract import Compile, Invocation, surviving
from mlgo.llvm.cmdline import SIDE_OUTPUTS_WITH_VALUE
from mlgo.llvm.driver import (
    ASSEMBLY,
    LEVELS,
    NO_CODEGEN,
    NOT_LEVELS,
    OUTPUT_OPTIONS,
    SEPARATE_VALUE_OPTIONS,
    SOURCE_TYPES,
    compile_language,
    expand_response_files,
    is_source,
    link_output,
    link_stage,
    links_with_lld,
    opt_level,
    source_files,
    suffix_language,
    typed_sources,
)
from mlgo.llvm.languages import LANGUAGES
from mlgo.serve.cc import optimizes
from mlgo.serve.native_wrapper import build_native_wrapper

# Suffixes clang only links (-c makes nothing of them): GCC's .sx, case variants clang does
# not know, an object.
LINKER_INPUTS = (".sx", ".Cpp", ".o")


def case_variants(suffixes: Iterable[str]) -> list[str]:
    """Each suffix as written, in lower and upper case, and with its case swapped."""
    return sorted({v for s in suffixes for v in (s, s.lower(), s.upper(), s.swapcase())})


def clang_type(clang: str, source: Path) -> str | None:
    """What `clang -c SOURCE` compiles it as (its -x name), None for an input it only links."""
    r = subprocess.run([clang, "-###", "-c", source.name], cwd=source.parent, capture_output=True)
    jobs = r.stderr.decode()
    if "input unused" in jobs:
        return None
    kind = re.search(r'"-x" "([^"]+)"', jobs)
    return kind.group(1) if kind else "assembler" if '"-cc1as"' in jobs else "?"


def test_the_source_suffixes_are_clangs(tc, tmp_path):
    """Every suffix of the table in every case (.cp is C++, .CP is nothing), and a few that
    clang only links: clang compiles each as the table says, or not at all."""
    for suffix in case_variants((*SOURCE_TYPES, *LINKER_INPUTS)):
        source = tmp_path / f"a{suffix}"
        source.write_text("")
        assert clang_type(tc.clang, source) == SOURCE_TYPES.get(suffix), suffix


@pytest.mark.unit
def test_every_optimized_source_is_served_in_its_language():
    """.cp and .CPP are C++ to clang, so to mlgo-cc too (they were not sources to it once);
    assembly is compiled, never optimized."""
    for suffix, kind in SOURCE_TYPES.items():
        name = f"dir/a.b{suffix}"
        assert is_source(name) == optimizes(["-O2", "-c", name]) == (kind not in ASSEMBLY)
        assert suffix_language(name) == compile_language(["-c", name], False), suffix
    assert [compile_language(["-c", n], False) for n in ("a.cp", "a.CPP", "a.i", "a.m")] == [
        "c++",
        "c++",
        "c",
        None,
    ]
    assert compile_language(["-c", "a.i"], True) == "c++"  # clang++ compiles C as C++


@pytest.mark.unit
def test_a_recorded_calls_inputs_are_no_options_values():
    """A recorded build's inputs: what is neither an option nor the value of one."""
    for option in (*SEPARATE_VALUE_OPTIONS, "-x", "-Xclang", "-Xlinker"):
        call = Invocation(Path("."), ["cc", "-c", "a.c", option, "v.c", "b.o"])
        assert call.inputs() == ["a.c", "b.o"], option
    # what a second compile leaves out with its value is a value the driver knows of
    assert SIDE_OUTPUTS_WITH_VALUE <= SEPARATE_VALUE_OPTIONS


@pytest.fixture(scope="module")
def checker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlgo_cc.c built with its checking entry point, the lists defined as for an install."""
    out = tmp_path_factory.mktemp("check") / "mlgo-cc-check"
    build_native_wrapper(out, "-DMLGO_GUARD_CHECK")
    return out


# Before a source: each way to name its language, and none.
X_OPTIONS = (
    *(["-x", language] for language in (*LANGUAGES, "none", "objective-c")),
    *([f"-x{language}"] for language in (*LANGUAGES, "none")),
    ["-x"],
    [],
)
# Levels clang reads otherwise than by name, and levels it refuses.
ODD_LEVELS = ("-O", "-O4", "-O007", "-Oq", "-O2x", "--optimize", "--optimize=s", "--optimize=9")


def command_lines() -> list[list[str]]:
    """Command lines made from mlgo.llvm.driver's own lists: every suffix in every case, every
    option that takes a value (joined and separate, its value a source, a level or a file -x
    would make a source), every -x, level, output option and option that stops before code,
    and response files."""
    lines = []
    for suffix in case_variants((*SOURCE_TYPES, *LINKER_INPUTS)):
        name = f"dir/a.b{suffix}"
        lines += [["-Oz", "-c", name], ["-Os", "-c", "x.c", name]]
        lines += [["-flto", "-fuse-ld=lld", name, "-o", "prog"]]
        lines += [[*x, "-O2", "-c", name] for x in X_OPTIONS]
    for option in sorted({*SEPARATE_VALUE_OPTIONS, "-Xclang", "-Xlinker", "-Xpreprocessor"}):
        lines += [["-O2", "-c", "x.c", option, value] for value in ("v.cpp", "-O3", "f.txt")]
        lines += [["-O2", "-c", "x.c", f"{option}{value}"] for value in ("v.cpp", "-O3")]
        lines += [["-O2", "-x", "c", "-c", option, "f.txt"], ["-O2", "-c", "x.c", option]]
    for level in (*LEVELS, *NOT_LEVELS, *ODD_LEVELS):
        lines += [["-c", "x.c", level], ["-O1", level, "-flto=thin", "a.o", "-fuse-ld=lld"]]
    for option in NO_CODEGEN:
        lines += [["-O2", option, "x.c"], ["-O2", "-flto", "-fuse-ld=lld", option, "a.o"]]
    for option in OUTPUT_OPTIONS:
        lines += [["-Oz", "-flto", "-fuse-ld=lld", "a.o", option, "prog"], ["-c", "x.c", option]]
    lines += [["-Oz", "-flto", "-fuse-ld=lld", "a.o", "-oprog"], ["-flto", "a.o", "-objcmt"]]
    lines += [["@args.rsp"], ["-O2", "-c", "x.c", "@missing"], ["-O2", "@args.rsp", "y.cp"]]
    lines += [[*x, "-O2", "-c", "f.txt"] for x in X_OPTIONS]
    lines += [["-x", "c++", "-c", "f.txt", "-x", "none", "g.txt"], ["-O2", "-xc", "-c", "dir"]]
    return lines


def python_reading(args: list[str]) -> str:
    """What the checking wrapper prints for ARGS (`read`), as Python reads them."""
    typed = typed_sources(args)
    sources = [i for i, a in enumerate(args) if is_source(a) or i in typed]
    fields = [
        "sources" + "".join(f" {i}" for i in sources),
        opt_level(args) or "none",
        compile_language(args, False) or "none",
        compile_language(args, True) or "none",
        str(int(optimizes(args))),
        link_stage(args) or "none",
        str(int(links_with_lld(args))),
        (source_files(args) or [link_output(args)])[0],
    ]
    return "\n".join(fields) + "\n"


@pytest.mark.toolchain
def test_the_native_wrapper_reads_command_lines_as_python_does(checker, tmp_path, monkeypatch):
    """Both wrappers read every command line of the table alike; whatever Python reads
    otherwise than by these lists (a response file, a source by -x, a link lld does not make)
    the native wrapper hands to Python."""
    monkeypatch.chdir(tmp_path)
    for name in ("f.txt", "g.txt", "x.c"):
        (tmp_path / name).write_text("int f(void) { return 1; }\n")
    (tmp_path / "dir").mkdir()
    (tmp_path / "args.rsp").write_text("-Oz -c x.c")
    lines = command_lines()
    handed = 0
    for args in lines:
        r = subprocess.run([checker, "read", *args], capture_output=True, text=True)
        assert r.returncode == 0, (args, r.stderr)
        native, _, to_python = r.stdout.rstrip("\n").rpartition("\n")
        not_lld = bool(link_stage(args)) and not links_with_lld(args)
        if expand_response_files(args) != args or typed_sources(args) or not_lld:
            assert to_python == "1", args
        if to_python == "1":
            handed += 1
            continue
        assert native + "\n" == python_reading(args), args
    assert len(lines) > 500 and 0 < handed < len(lines) / 4, (len(lines), handed)


def test_a_recorded_compile_is_of_the_object_clang_wrote(tc, tmp_path):
    """The object of a recorded compile is the output clang writes: the last one named, in
    any spelling (it once was the first `-o` alone)."""
    (tmp_path / "out").mkdir()
    (tmp_path / "x.c").write_text("int f(void) { return 1; }\n")
    r = subprocess.run([tc.clang, "-c", "x.c", "-o", "out/x.o"], cwd=tmp_path)
    assert r.returncode == 0
    for args in (
        ["-c", "x.c", "-o", "gone.o", "-o", "out/x.o"],
        ["-c", "x.c", "-oout/x.o"],
        ["-c", "x.c", "--output", "out/x.o"],
    ):
        assert surviving([(tmp_path, args, "x.c")]) == [
            Compile(tmp_path / "x.c", tmp_path / "out/x.o")
        ], args
    assert surviving([(tmp_path, ["-c", "x.c"], "x.c")]) == []  # x.o: not written
