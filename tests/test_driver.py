"""One reading of clang's command line (mlgo.llvm.driver): its suffixes are clang's own, and
everything that reads a command line (mlgo-cc, a recorded build) reads it through it."""

from __future__ import annotations

import re
import subprocess
from collections.abc import Iterable
from pathlib import Path

import pytest

from mlgo.corpus.extract import Invocation
from mlgo.llvm.driver import (
    ASSEMBLY,
    SEPARATE_VALUE_OPTIONS,
    SOURCE_TYPES,
    compile_language,
    is_source,
    suffix_language,
)
from mlgo.serve.cc import optimizes

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
