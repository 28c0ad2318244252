"""Corpus loading and the extractor on a small real build."""

import json
import shutil
import subprocess

import pytest

from mlgo.corpus.compile import compile_plain
from mlgo.corpus.extract import combine
from mlgo.corpus.format import CorpusError, load_corpus
from mlgo.packages.build import build_corpus, profile_own_tests
from mlgo.packages.recipes import Recipe
from mlgo.problems import get_problem
from mlgo.runtime.commands import BuildError
from tests.conftest import DATA, copy_corpus, run_mlgo


def test_extractor_stores_bitcode_and_cc1_command(mini_corpus):
    assert [m.name for m in mini_corpus.modules] == [
        "minipkg/hash.o",
        "minipkg/main.o",
        "minipkg/strbuf.o",
    ]
    m = mini_corpus.modules[0]
    assert m.bitcode.read_bytes()[:4] == b"BC\xc0\xde"
    assert m.args[0] == "-cc1" and "-Oz" in m.args
    assert m.package == "minipkg"


def test_compile_command_rewrites_only_what_it_must(mini_corpus, tmp_path):
    m = mini_corpus.modules[0]
    cmd = m.compile_command("clang-22", tmp_path / "x.o", "-Oz", ["-extra"])
    assert "-fembed-bitcode=all" not in cmd and "-Oz" in cmd
    assert cmd[-6:] == ["-extra", "-x", "ir", str(m.bitcode), "-o", str(tmp_path / "x.o")]


def test_a_module_is_compiled_only_at_the_level_it_was_recorded_at(
    mini_corpus, mini_corpus_o2, tc, tmp_path
):
    # clang's frontend already optimized for the level: -Oz marks functions minsize
    oz, o2 = mini_corpus.modules[0], mini_corpus_o2.modules[0]
    assert (oz.opt_level, o2.opt_level) == ("-Oz", "-O2")
    ir = {m.opt_level: _disassembled(tc, m.bitcode) for m in (oz, o2)}
    assert b" minsize " in ir["-Oz"] and b" minsize " not in ir["-O2"]
    assert "-vectorize-loops" in o2.args and "-vectorize-loops" not in oz.args
    with pytest.raises(CorpusError, match=r"minipkg/\S+: recorded at -Oz, needed at -O2; build"):
        oz.compile_command("clang-22", tmp_path / "x.o", "-O2")
    with pytest.raises(CorpusError, match="recorded at -O2, needed at -Oz; build it with"):
        mini_corpus_o2.require(get_problem("inlining-size"))
    assert mini_corpus.require(get_problem("inlining-size")) is mini_corpus
    with pytest.raises(CorpusError, match="a corpus of the compile step, and inlining-size-link"):
        mini_corpus.require(get_problem("inlining-size-link"))


def _disassembled(tc, bitcode) -> bytes:
    dis = [tc.tool("llvm-dis"), str(bitcode), "-o", "-"]
    return subprocess.run(dis, check=True, capture_output=True).stdout


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("{not json", "not valid JSON"),
        ('{"has_thinlto": false}', "needs a 'modules' list"),
        ('{"modules": []}', "non-empty list"),
        ('{"modules": ["minipkg/nope.o"]}', "nope.o.bc: listed .* but missing"),
        ('{"modules": ["minipkg/hash.o"], "has_thinlto": true}', "ThinLTO"),
        ('{"modules": ["minipkg/hash.o"], "global_command_override": "-O2"}', "list of strings"),
    ],
)
def test_malformed_description_names_the_file(mini_corpus, tmp_path, content, message):
    root = copy_corpus(mini_corpus, tmp_path / "c")
    (root / "corpus_description.json").write_text(content)
    with pytest.raises(CorpusError, match=message) as e:
        load_corpus(root)
    assert str(root) in str(e.value) and "\n" not in str(e.value)


def test_cmd_file_without_cc1_is_rejected(mini_corpus, tmp_path):
    root = copy_corpus(mini_corpus, tmp_path / "c")
    (root / "minipkg" / "hash.o.cmd").write_bytes(b"-O2\0-c")
    with pytest.raises(CorpusError, match="hash.o.cmd: command line does not start with -cc1"):
        load_corpus(root)


@pytest.mark.unit
def test_missing_corpus_is_reported(tmp_path):
    with pytest.raises(CorpusError, match="not found"):
        load_corpus(tmp_path)


def test_select_by_package(mini_corpus):
    assert len(mini_corpus.select(["minipkg"]).modules) == 3
    with pytest.raises(CorpusError, match="no package"):
        mini_corpus.select(["zlib"])


def test_failed_build_says_why_and_keeps_the_previous_corpus(tc, mini_corpus, tmp_path):
    out = tmp_path / "out"
    copy_corpus(mini_corpus, out)
    before = sorted(p.name for p in (out / "minipkg").iterdir())
    with pytest.raises(BuildError, match=r"minipkg: build failed \(.*log: ") as e:
        build_corpus(
            "minipkg", tmp_path, (), ('"$CC" -c missing.c -o m.o',), tc, out, tmp_path / "work"
        )
    assert "\n" not in str(e.value)
    assert sorted(p.name for p in (out / "minipkg").iterdir()) == before
    assert json.loads((out / "corpus_description.json").read_text())["modules"]


def test_compile_without_output_flag_is_kept(tc, tmp_path):
    """`cc -c x.c` (mawk's Makefile) writes x.o beside the build; it is a module too."""
    src = shutil.copytree(DATA / "minipkg", tmp_path / "src")
    build = ('"$CC" -O2 -c hash.c', '"$CC" -O2 -c main.c -o main.o')
    assert build_corpus("pkg", src, (), build, tc, tmp_path / "out", tmp_path / "work") == 2


def test_objects_named_by_absolute_paths_are_named_under_the_package(tc, tmp_path):
    """freetype and lcms2 compile with `-o $(CURDIR)/obj/x.o`: the module is named by the
    object's path under the build tree, and one outside it is skipped and named."""
    src = shutil.copytree(DATA / "abspath", tmp_path / "src")
    out, skipped = tmp_path / "out", []
    assert build_corpus("abs", src, (), ("make",), tc, out, tmp_path / "work", skipped=skipped) == 1
    combine(out)
    assert [m.name for m in load_corpus(out).modules] == ["abs/obj/scale.o"]
    assert skipped == [f"{tmp_path}/elsewhere/outside.o: outside the package's tree {src}, skipped"]
    assert not list(src.rglob("*.bc")) and not list(tmp_path.glob("elsewhere/*.bc"))


def test_objects_of_one_name_are_each_a_module(tc, tmp_path):
    """flac and fribidi compile util.o in two directories, and an object twice to one path
    (the last compile is the object, so its bitcode is the module)."""
    src = shutil.copytree(DATA / "dupnames", tmp_path / "src")
    out = tmp_path / "out"
    assert build_corpus("dup", src, (), ("make",), tc, out, tmp_path / "work") == 3
    combine(out)
    modules = {m.name: m for m in load_corpus(out).modules}
    assert sorted(modules) == ["dup/a/util.o", "dup/b/util.o", "dup/main.o"]
    assert b"@util_a(" in _disassembled(tc, modules["dup/a/util.o"].bitcode)
    assert b"@util_b(" in _disassembled(tc, modules["dup/b/util.o"].bitcode)
    assert b"@twice(" in _disassembled(tc, modules["dup/main.o"].bitcode)


def test_build_without_objects_says_so(tc, tmp_path):
    src = shutil.copytree(DATA / "minipkg", tmp_path / "src")
    with pytest.raises(BuildError, match="compiled no object file"):
        build_corpus("pkg", src, (), ("true",), tc, tmp_path / "out", tmp_path / "work")


def test_corpus_build_refuses_a_level_clang_does_not_have(tmp_path):
    r = run_mlgo("corpus", "build", "zlib", "--opt-level", "O2", "--out", str(tmp_path), timeout=60)
    assert r.returncode == 2 and "'O2' is not one of -O0..-O3, -Os, -Oz" in r.stderr
    assert not list(tmp_path.iterdir())


def _minipkg_recipe(test: tuple[str, ...]) -> Recipe:
    build = tuple(f'"$CC" -O2 -c {c} -o {c[:-2]}.o' for c in ("hash.c", "main.c", "strbuf.c"))
    link = '"$CC" -O2 hash.o main.o strbuf.o -o wordcount'
    return Recipe("minipkg", "minipkg", (*build, link), test=test)


def test_a_profiled_corpus_carries_the_counts_of_the_package_tests(tc, mini_corpus_o2, tmp_path):
    recipe = _minipkg_recipe(("./wordcount < main.c > counts.txt",))
    src = shutil.copytree(DATA / "minipkg", tmp_path / "src")
    profdata = profile_own_tests(recipe, src, tc, tmp_path / "work", "-O2")
    out = tmp_path / "corpus"
    build_corpus(
        "minipkg",
        src,
        (),
        recipe.build,
        tc,
        out,
        tmp_path / "work",
        opt_level="-O2",
        profile=profdata,
    )
    combine(out)
    profiled = {m.name: m for m in load_corpus(out).modules}
    assert set(profiled) == {m.name for m in mini_corpus_o2.modules}
    for m in mini_corpus_o2.modules:  # measured counts in the bitcode, and only there
        assert b"function_entry_count" in _disassembled(tc, profiled[m.name].bitcode)
        assert b"function_entry_count" not in _disassembled(tc, m.bitcode)
        assert profiled[m.name].profiled and not m.profiled  # what a model card reads
    # the bitcode is compiled without the profile file, as a moved corpus would be
    profdata.unlink()
    module = profiled["minipkg/main.o"]
    metrics = compile_plain(get_problem("regalloc-eviction"), module, tc.clang, tmp_path / "m.o")
    assert metrics["text_size"] > 0


@pytest.mark.parametrize(
    ("test", "message"),
    [((), "its recipe has no tests to profile"), (("true",), "its tests ran no instrumented code")],
)
def test_a_profile_that_cannot_be_made_says_why(tc, tmp_path, test, message):
    src = shutil.copytree(DATA / "minipkg", tmp_path / "src")
    with pytest.raises(BuildError, match=f"minipkg.*{message}") as e:
        profile_own_tests(_minipkg_recipe(test), src, tc, tmp_path / "work", "-O2")
    assert "\n" not in str(e.value) and not (tmp_path / "work" / "profile.profdata").exists()
