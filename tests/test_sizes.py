"""The .text of objects split into their own bytes and their COMDAT groups', on real C++
objects that share an inline function; the tool that sums them three ways; and inlining's
reward, which counts such a function once per package."""

from __future__ import annotations

import shutil
import struct
import subprocess
import sys
from pathlib import Path

from elftools.elf.elffile import ELFFile

from mlgo.corpus.compile import compile_module
from mlgo.corpus.extract import combine
from mlgo.corpus.format import load_corpus
from mlgo.corpus.stats import corpus_stats, package_copies
from mlgo.llvm.sizes import TextParts, elf_texts, text_digest, text_parts, text_size
from mlgo.packages.build import build_corpus
from mlgo.problems import get_problem
from mlgo.runtime.workers import LocalPool
from mlgo.train.evaluate import baseline

SHARED = (
    "struct Acc { __attribute__((noinline)) int add(int x) { return s += x * 3 + (x >> 2); }\n"
    "  int s = 0; };\n"
)
TOOL = Path(__file__).resolve().parents[1] / "tools" / "linked_estimate.py"
INLINING = get_problem("inlining-size")


def build(tc, tree: Path) -> list[Path]:
    """Two C++ objects under TREE that both define Acc::add (a linkonce_odr function)."""
    tree.mkdir()
    objs = []
    for name, body in (("a", "int fa(int v) { Acc a; return a.add(v); }"),
                       ("b", "int fb(int v) { Acc b; b.add(1); return b.add(v); }")):  # fmt: skip
        (tree / f"{name}.cpp").write_text(SHARED + body + "\n")
        obj = tree / f"{name}.o"
        subprocess.run([tc.clangxx, "-Oz", "-c", tree / f"{name}.cpp", "-o", obj], check=True)
        objs.append(obj)
    return objs


def test_an_inline_function_is_counted_in_its_group(tc, tmp_path):
    a, b = (text_parts(o) for o in build(tc, tmp_path / "t"))
    assert a.shared.keys() == b.shared.keys() == {"_ZN3Acc3addEi"}
    assert a.shared == b.shared and a.own > 0 and b.own > 0
    for obj in (tmp_path / "t").glob("*.o"):
        parts = text_parts(obj)
        assert parts.own + sum(parts.shared.values()) == text_size(obj)


def read_by_pyelftools(path: Path) -> tuple[TextParts, str]:
    """PATH's .text parts and ELF type as pyelftools parses the whole file: the reference."""
    with open(path, "rb") as f:
        elf = ELFFile(f)
        sections = list(elf.iter_sections())
        group_of = {}
        for s in sections:
            if s["sh_type"] == "SHT_GROUP":
                words = struct.unpack(f"{'<' if elf.little_endian else '>'}{s['sh_size'] // 4}I",
                                      s.data())  # fmt: skip
                if words and words[0] & 1:
                    name = elf.get_section(s["sh_link"]).get_symbol(s["sh_info"]).name
                    group_of.update(dict.fromkeys(words[1:], name))
        own, shared = 0, {}
        for i, s in enumerate(sections):
            if s["sh_flags"] & 6 == 6:  # SHF_ALLOC | SHF_EXECINSTR
                if i in group_of:
                    shared[group_of[i]] = shared.get(group_of[i], 0) + s["sh_size"]
                else:
                    own += s["sh_size"]
        return TextParts(own, shared), elf.header["e_type"]


def test_an_objects_text_is_read_off_its_section_headers_as_a_whole_parse_reads_it(tc, tmp_path):
    objs = build(tc, tmp_path / "t")
    src = tmp_path / "t" / "a.cpp"
    for name, flags in {
        "sections": ["-ffunction-sections", "-c"],
        "i686": ["--target=i686-linux-gnu", "-c"],  # ELF32
        "ppc64": ["--target=powerpc64-linux-gnu", "-c"],  # big-endian
        "s390x": ["--target=s390x-linux-gnu", "-c", "-ffunction-sections"],
    }.items():
        objs.append(tmp_path / f"{name}.o")
        subprocess.run([tc.clangxx, "-Oz", *flags, src, "-o", objs[-1]], check=True)
    (tmp_path / "main.cpp").write_text(SHARED + "int main() { Acc a; return a.add(2); }\n")
    objs.append(tmp_path / "prog")  # a linked program
    subprocess.run([tc.clangxx, "-Oz", tmp_path / "main.cpp", "-o", objs[-1]], check=True)
    for obj in objs:
        parts, kind = read_by_pyelftools(obj)
        text = parts.own + sum(parts.shared.values())
        assert (text_parts(obj), text_size(obj)) == (parts, text), obj.name
        assert elf_texts(obj.parent)[obj.name] == (text, kind != "ET_REL"), obj.name
    assert read_by_pyelftools(objs[0])[0].shared  # the C++ objects have groups to read


def test_a_text_digest_ignores_debug_information_and_sees_a_changed_call(tc, tmp_path):
    """Issue 59's identity check: -g adds sections but not machine code; a call to another
    function (a changed relocation, the same bytes) is seen."""
    digests = {}
    for name, callee in (("g0", "f"), ("g", "f"), ("other", "h")):
        src = tmp_path / f"{name}.c"
        src.write_text(f"int f(int); int h(int);\nint k(int v) {{ return {callee}(v) + 1; }}\n")
        obj = tmp_path / f"{name}.o"
        debug = "-g" if name == "g" else "-g0"
        subprocess.run([tc.clang, "-Oz", debug, "-c", src, "-o", obj], check=True)
        digests[name] = text_digest(obj)
    assert text_size(tmp_path / "g.o") == text_size(tmp_path / "other.o")
    assert digests["g0"] == digests["g"] != digests["other"]


def test_the_tool_counts_a_shared_function_once(tc, tmp_path):
    objs = build(tc, tmp_path / "base")
    shutil.copytree(tmp_path / "base", tmp_path / "same")
    r = subprocess.run(
        [sys.executable, TOOL, tmp_path / "same", tmp_path / "base"], capture_output=True, text=True
    )
    assert r.returncode == 0, r.stderr
    rows = {
        ln.split("│")[1].strip(): ln.split("│")[2:5] for ln in r.stdout.splitlines() if "%" in ln
    }
    parts = [text_parts(o) for o in objs]
    own, shared = sum(p.own for p in parts), parts[0].shared["_ZN3Acc3addEi"]
    assert int(rows["objects"][0].replace(",", "")) == own + 2 * shared
    assert int(rows["linked once"][0].replace(",", "")) == own + shared
    assert int(rows["1/n"][0].replace(",", "")) == own + shared
    assert all(r[2].strip() == "+0.00%" for r in rows.values())


def test_a_package_counts_its_inline_functions_once_in_inlinings_reward(tc, tmp_path):
    """Two C++ files of one package define Acc::add: each object's text_once counts half of
    it, so the package's default counts it once, and a compile of either module (here the
    default replayed through the channel) measures what the default's stats say."""
    src = tmp_path / "src"
    src.mkdir()
    for name, body in (("a", "int fa(int v) { Acc a; return a.add(v); }"),
                       ("b", "int fb(int v) { Acc b; b.add(1); return b.add(v); }")):  # fmt: skip
        (src / f"{name}.cpp").write_text(SHARED + body + "\n")
    build = tuple(f'"$CXX" -c {n}.cpp -o {n}.o' for n in ("a", "b"))
    assert build_corpus("pkg", src, (), build, tc, tmp_path / "corpus", tmp_path / "w") == 2
    combine(tmp_path / "corpus")
    corpus = load_corpus(tmp_path / "corpus")
    stats, failures = corpus_stats(corpus, tc.describe(), tc.clang, LocalPool(2))
    assert not failures and package_copies(stats) == {"pkg": {"_ZN3Acc3addEi": 2}}
    shared = stats["pkg/a.o"]["comdat"]["_ZN3Acc3addEi"]
    own = sum(s["text_size"] - shared for s in stats.values())
    assert sum(s["text_once"] for s in stats.values()) == own + shared  # once, not twice

    default = baseline(corpus, tc, LocalPool(2), INLINING)
    for m in default.corpus.modules:
        assert m.copies == {"_ZN3Acc3addEi": 2}
        run = compile_module(INLINING, m, tc.clang)
        assert run.metrics == {k: default.costs[m.name][k] for k in ("text_size", "text_once")}
