"""Never worse than plain clang where the user asked for it (issue 21, items 5 and 6): a policy
serves only compiles at the -O level it was trained for, and MLGO_GUARD=size keeps the
smaller of the policy's and the default's object. Real clang, a real service, both wrappers."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from mlgo.llvm.cmdline import SIDE_OUTPUT_PREFIXES, SIDE_OUTPUTS, SIDE_OUTPUTS_WITH_VALUE
from mlgo.llvm.driver import compile_language, source_files
from mlgo.llvm.sizes import text_size
from mlgo.problems.policy_files import load_policy, save_policy
from mlgo.runtime.files import cache_dir
from mlgo.serve.cc import optimizes
from mlgo.serve.guard import (
    GUARD_SCRATCH,
    UNGUARDED,
    UNGUARDED_PREFIXES,
    default_args,
    guarded_object,
)
from mlgo.serve.memo import GUARD_CACHE
from mlgo.serve.native_wrapper import build_native_wrapper
from tests import test_service
from tests.conftest import WRAPPER_KINDS, save_inline_all
from tests.test_service import CXX_SOURCE, MLGO_CC, SHIPPED, SOURCES, Service

cc = test_service.cc  # both wrappers, as the service's own tests run them
native_cc = test_service.native_cc
native_wrappers = test_service.native_wrappers
MLGO_CXX = [sys.executable, "-c", "from mlgo.serve.cc import main_cxx; main_cxx()"]

HASH = next(s for s in SOURCES if s.name == "hash.c")  # inlining everything grows it 2.6x
# Two callers passing permuted arguments: inlining both (no argument moves, no call) is a
# byte smaller at -Oz than clang's choice to keep the call.
SHRINKS = """\
static int mix(int a, int b, int c, int d) {
  int x = a * 31 + b;
  x ^= x >> 7;
  x += c * d;
  x ^= x << 3;
  return x * 17 + (a > b);
}
int f(int a, int b, int c, int d) { return mix(d, c, b, a) + 1; }
int g(int a, int b, int c, int d) { return mix(c, d, a, b) - 1; }
"""
# A method probed from three callers: inlining every call grows the object by a fifth.
GROWS_CXX = """\
struct Table {
  unsigned slots[64];
  unsigned probe(const char *key) const {
    unsigned h = 2166136261u;
    for (const char *p = key; *p; p++) h = (h ^ (unsigned char)*p) * 16777619u;
    for (unsigned i = 0; i < 64; i++) {
      unsigned s = (h + i * i) & 63;
      if (slots[s] == 0 || slots[s] == h) return s;
    }
    return 64;
  }
};
unsigned a(const Table &t) { return t.probe("alpha") + t.probe("beta"); }
unsigned b(const Table &t) { return t.probe("gamma") * t.probe("delta"); }
unsigned c(const Table &t, const char *k) { return t.probe(k) ^ t.probe("epsilon"); }
"""
# name: (source, is the policy's object the larger, more arguments, the object they write).
# An ELF32 object is one the native wrapper does not read: it hands the compile to Python.
GUARD_CASES = {
    "hash.c": (HASH.read_text(), True, ["-o", "out/hash.o"], "out/hash.o"),
    "shrinks.c": (SHRINKS, False, [], "shrinks.o"),
    "grows.cpp": (GROWS_CXX, True, [], "grows.o"),
    "shrinks.cpp": (SHRINKS, False, ["-oout/shrinks.o"], "out/shrinks.o"),
    "elf32.c": (SHRINKS, False, ["-m32"], "elf32.o"),
}


@pytest.fixture(scope="module")
def inline_all(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A policy that always says "inline", in every language."""
    return save_inline_all(tmp_path_factory.mktemp("inline-all") / "policy", languages=None)


@pytest.fixture(scope="module")
def eager(inline_all: Path, tmp_path_factory: pytest.TempPathFactory):
    service = Service(
        tmp_path_factory.mktemp("eager"), "--policy", str(inline_all), "--backend", "python"
    )
    yield service
    service.stop()


def run(cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None):
    return subprocess.run(cmd, env=env, cwd=cwd, capture_output=True, text=True, timeout=120)


def plain(tc, args: list[str], cwd: Path | None = None) -> None:
    r = run([tc.clang, *args], cwd=cwd)
    assert r.returncode == 0, r.stderr


def test_a_policy_serves_only_its_own_level(cc, inline_all, tc, tmp_path):
    """-O2 and -O3 compiles are plain clang's, byte for byte, with one note per level for
    the whole build; -Oz is served, and so is -O3 ... -Oz (the last -O wins)."""
    service = Service(tmp_path, "--policy", str(inline_all), "--backend", "python")
    try:
        notes = []
        for src in SOURCES:
            for level in ("-O3", "-O2"):
                args = [level, "-c", str(src), "-o", str(tmp_path / "got.o")]
                r = run([*cc, *args], service.env())
                assert r.returncode == 0, r.stderr
                notes += r.stderr.splitlines()
                got = (tmp_path / "got.o").read_bytes()
                plain(tc, args)
                assert got == (tmp_path / "got.o").read_bytes(), (level, src.name)
        assert notes == [
            f"mlgo-cc: note: {level} compiles are left to clang's default: the served "
            f"policies are for -Oz (first: {SOURCES[0]})"
            for level in ("-O3", "-O2")
        ]
        for levels in (["-Oz"], ["-O3", "-Oz"]):
            args = [*levels, "-c", str(HASH), "-o", str(tmp_path / "got.o")]
            r = run([*cc, *args], service.env())
            assert r.returncode == 0 and not r.stderr, r.stderr
            got = (tmp_path / "got.o").read_bytes()
            plain(tc, args)
            assert got != (tmp_path / "got.o").read_bytes(), levels  # the policy's own
        status = service.status()
        assert status["levels"] == {
            "-O3": {"served": 0, "default": len(SOURCES)},
            "-O2": {"served": 0, "default": len(SOURCES)},
            "-Oz": {"served": 2, "default": 0},
        }
        assert status["compilations"] == 2  # no lease for the others
    finally:
        service.stop()


def test_a_compile_request_must_name_its_level_and_language(eager):
    from mlgo.serve.client import ServiceError, request

    with pytest.raises(ServiceError, match="names its -O level"):
        request({"op": "compile"}, path=eager.socket)
    with pytest.raises(ServiceError, match="names its language; run mlgo install-wrappers"):
        request({"op": "compile", "level": "-Oz"}, path=eager.socket)


@pytest.fixture(params=WRAPPER_KINDS)
def wrappers(request, native_wrappers) -> dict[str, list[str]]:
    """mlgo-cc and mlgo-c++ of one kind (the Python reference or the native one), by the
    suffix of the source they compile."""
    if request.param == "python":
        return {".c": MLGO_CC, ".cpp": MLGO_CXX}
    return {".c": [str(native_wrappers[0])], ".cpp": [str(native_wrappers[1])]}


def test_a_policy_for_c_leaves_cxx_compiles_to_the_default(wrappers, inline_all, tc, tmp_path):
    """A policy calibrated for C answers C compiles; C++ ones are clang's, byte for byte,
    the first with a note naming why, whichever wrapper asks."""
    save_policy(replace(load_policy(inline_all), languages=("c",)), tmp_path / "c-only")
    service = Service(tmp_path, "--policy", str(tmp_path / "c-only"), "--backend", "python")
    try:
        notes = []
        for src, clang in ((CXX_SOURCE, tc.clangxx), (CXX_SOURCE, tc.clangxx), (HASH, tc.clang)):
            args = ["-Oz", "-c", str(src), "-o", str(tmp_path / "got.o")]
            r = run([*wrappers[".cpp" if clang == tc.clangxx else ".c"], *args], service.env())
            assert r.returncode == 0, r.stderr
            notes.append(r.stderr)
            got = (tmp_path / "got.o").read_bytes()
            assert run([clang, *args]).returncode == 0
            assert (got == (tmp_path / "got.o").read_bytes()) == (src == CXX_SOURCE), src
        assert notes == [
            "mlgo-cc: note: -Oz C++ compiles are left to clang's default: inlining-size is "
            f"calibrated for C only (first: {CXX_SOURCE})\n",
            "",
            "",
        ]
        assert service.status()["levels"] == {"-Oz": {"served": 1, "default": 2}}
    finally:
        service.stop()


@pytest.mark.parametrize("name", GUARD_CASES)
def test_the_guard_keeps_the_smaller_object(wrappers, name, eager, tc, tmp_path):
    """The object kept is plain clang's, byte for byte, where the policy's is larger, and the
    policy's where it is smaller: the same bytes from both wrappers. The dependency file is
    the policy's compile's alone (the default's would name its private object), and nothing
    else is left behind."""
    text, policy_larger, more, written = GUARD_CASES[name]
    src, obj = tmp_path / name, tmp_path / written
    src.write_text(text)
    (tmp_path / "out").mkdir()
    (tmp_path / "deps").mkdir()
    args = ["-Oz", "-c", name, *more, "-MD", "-MP", "-MF", "deps/out.d"]
    clang = tc.clangxx if src.suffix == ".cpp" else tc.clang
    wrapper = wrappers[src.suffix]
    r = run([clang, *args], cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    default, default_text = obj.read_bytes(), text_size(obj)
    want_dep = (tmp_path / "deps/out.d").read_text()
    r = run([*wrapper, *args], eager.env(), cwd=tmp_path)
    assert r.returncode == 0 and not r.stderr, r.stderr
    policy = obj.read_bytes()
    assert text_size(obj) != default_text  # the premise: they differ, the expected way
    assert (text_size(obj) > default_text) == policy_larger
    obj.unlink()
    r = run([*wrapper, *args], eager.env(MLGO_GUARD="size"), cwd=tmp_path)
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert obj.read_bytes() == (default if policy_larger else policy)
    assert (tmp_path / "deps/out.d").read_text() == want_dep
    left = sorted(str(p.relative_to(tmp_path)) for p in tmp_path.rglob("*"))
    assert left == sorted(["deps", "deps/out.d", "out", name, written])


def test_the_native_wrapper_guards_without_python(eager, tc, tmp_path):
    """The native wrapper keeps the smaller object itself (no interpreter start-up per file):
    built to hand over to an interpreter that is not there, it still does. It hands over
    only what it cannot read, an ELF32 object."""
    wrapper = tmp_path / "mlgo-cc"
    build_native_wrapper(wrapper, python=str(tmp_path / "no-python"))
    (tmp_path / "shrinks.c").write_text(SHRINKS)
    args = ["-Oz", "-c", str(HASH), "-o", "hash.o"]
    plain(tc, args, cwd=tmp_path)
    default = (tmp_path / "hash.o").read_bytes()
    r = run([str(wrapper), *args], eager.env(MLGO_GUARD="size"), cwd=tmp_path)
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert (tmp_path / "hash.o").read_bytes() == default
    r = run(
        [str(wrapper), "-m32", "-Oz", "-c", "shrinks.c"], eager.env(MLGO_GUARD="size"), tmp_path
    )
    assert r.returncode == 127 and "cannot run" in r.stderr


def test_a_policy_shipped_guarded_is_guarded_without_asking(inline_all, tc, tmp_path):
    """A per-file policy whose file asks for the size guard gets it without MLGO_GUARD, from
    the native wrapper itself (built to hand over to an interpreter that is not there) and
    from Python's: hash.c, which inlining everything grows, is clang's object, byte for byte."""
    policy = save_inline_all(tmp_path / "guarded", languages=None, guard="size")
    (tmp_path / "service").mkdir()
    service = Service(tmp_path / "service", "--policy", str(policy), "--backend", "python")
    native = tmp_path / "mlgo-cc"
    build_native_wrapper(native, python=str(tmp_path / "no-python"))
    args = ["-Oz", "-c", str(HASH), "-o", "hash.o"]
    plain(tc, args, cwd=tmp_path)
    default = (tmp_path / "hash.o").read_bytes()
    try:
        for wrapper in ([str(native)], MLGO_CC):
            (tmp_path / "hash.o").unlink()
            r = run([*wrapper, *args], service.env(), cwd=tmp_path)
            assert r.returncode == 0 and not r.stderr, r.stderr
            assert (tmp_path / "hash.o").read_bytes() == default
        assert service.status()["compilations"] == 2
    finally:
        service.stop()


def counting_clang(tc, directory: Path) -> tuple[Path, Path]:
    """An MLGO_CC in DIRECTORY that runs clang and counts its runs, a line each in its log."""
    log, counting = directory / "compiles.log", directory / "clang"
    counting.write_text(f'#!/bin/sh\necho x >> {log}\nexec {tc.clang} "$@"\n')
    counting.chmod(0o755)
    return counting, log


@pytest.mark.parametrize("departs", [pytest.param(False, marks=pytest.mark.slow), True])
def test_a_plugin_compile_that_made_clangs_object_is_not_compiled_again(cc, departs, tc, tmp_path):
    """Served by the plugin, a gated policy's compile says whether it departed from LLVM's
    decisions: one that never did (gate at 1) made clang's object, and the guard compiles
    nothing more; one that did (inlining everything, gate at 0.5) is compiled again and the
    smaller kept, clang's here. Nothing is left in /tmp either way."""
    policy = save_inline_all(tmp_path / "gated", languages=None)
    gate = 0.5 if departs else 1.0
    save_policy(replace(load_policy(policy), departure_threshold=gate), policy)
    (tmp_path / "service").mkdir()
    service = Service(tmp_path / "service", "--policy", str(policy), "--backend", "plugin")
    counting, log = counting_clang(tc, tmp_path)
    args = ["-Oz", "-c", str(HASH), "-o", "hash.o"]
    plain(tc, args, cwd=tmp_path)
    default = (tmp_path / "hash.o").read_bytes()
    before = set(Path("/tmp").glob("mlgo-departures-*"))
    try:
        env = service.env(MLGO_GUARD="size", MLGO_CC=str(counting))
        r = run([*cc, *args], env, cwd=tmp_path)
        assert r.returncode == 0 and not r.stderr, r.stderr
    finally:
        service.stop()
    assert len(log.read_text().split()) == (2 if departs else 1)
    assert (tmp_path / "hash.o").read_bytes() == default
    assert set(Path("/tmp").glob("mlgo-departures-*")) == before


def gated_policy(out: Path, gate: float) -> Path:
    """The inline-everything policy gated at GATE, saved to OUT: served by the plugin, it
    departs from clang on HASH and on SHRINKS."""
    policy = save_inline_all(out, languages=None)
    save_policy(replace(load_policy(policy), departure_threshold=gate), policy)
    return policy


@pytest.fixture(scope="module")
def departing(tmp_path_factory: pytest.TempPathFactory):
    """A service whose plugin departs from clang, for the guard's memory."""
    work = tmp_path_factory.mktemp("departing")
    policy = gated_policy(work / "policy", 0.5)
    service = Service(work, "--policy", str(policy), "--backend", "plugin")
    yield service
    service.stop()


class Rebuild:
    """A source in DIRECTORY compiled by the native wrapper under the guard, as a build
    would, counting clang's runs; `entries` are the guard's memory's files."""

    def __init__(self, wrapper: list[str], service: Service, tc, directory: Path, source: str):
        self.wrapper, self.service, self.directory = wrapper, service, directory
        self.counting, self.log = counting_clang(tc, directory)
        (directory / "x.c").write_text(source)
        self.args = ["-Oz", "-c", str(directory / "x.c"), "-o", "x.o"]
        plain(tc, self.args, cwd=directory)
        self.default = (directory / "x.o").read_bytes()
        (directory / "x.o").unlink()

    def compiles(self, *more: str) -> int:
        """Compiles x.c (with MORE arguments) afresh; how many times clang ran."""
        (self.directory / "x.o").unlink(missing_ok=True)
        before = len(self.log.read_text().split()) if self.log.exists() else 0
        env = self.service.env(MLGO_GUARD="size", MLGO_CC=str(self.counting))
        r = run([*self.wrapper, *self.args, *more], env, cwd=self.directory)
        assert r.returncode == 0 and not r.stderr, r.stderr
        return len(self.log.read_text().split()) - before

    def object(self) -> bytes:
        return (self.directory / "x.o").read_bytes()

    def memory(self) -> set[Path]:
        """The guard's memory's entries for this source (they name it by its path), whatever
        other tests running beside this one remember (an entry being written has a dot)."""
        mine = f" {self.directory}/x.c\n"
        entries = (cache_dir() / GUARD_CACHE).iterdir()
        return {e for e in entries if "." not in e.name and mine in e.read_text()}


@pytest.mark.parametrize("name", ["hash.c", "shrinks.c"])
def test_a_guarded_file_rebuilt_unchanged_is_compiled_once(
    name, departing, native_cc, tc, tmp_path
):
    """The guard's memory: compiled twice where the policy departs, the file is compiled
    once when rebuilt unchanged (after `make clean`), into the same bytes, whichever object
    the guard kept (clang's for hash.c, the policy's for shrinks.c)."""
    text, policy_larger, _, _ = GUARD_CASES[name]
    build = Rebuild(native_cc, departing, tc, tmp_path, text)
    assert build.compiles() == 2
    first = build.object()
    assert (first == build.default) == policy_larger
    assert len(build.memory()) == 1  # one entry, for this compile
    assert build.compiles() == 1
    assert build.object() == first


def test_the_guards_memory_misses_when_what_decides_the_object_changed(
    departing, native_cc, tc, tmp_path
):
    """A changed header, source or flag, a corrupt or cut-short entry, or one that others
    may write: each is a miss, guarded again into the right object, and remembered anew."""
    (tmp_path / "params.h").write_text("#define SEED 1\n")
    build = Rebuild(native_cc, departing, tc, tmp_path, '#include "params.h"\n' + HASH.read_text())
    assert build.compiles() == 2
    (entry,) = build.memory()
    assert build.compiles() == 1
    with (tmp_path / "params.h").open("a") as header:
        header.write("/* edited */\n")
    assert build.compiles() == 2
    assert build.compiles() == 1
    with (tmp_path / "x.c").open("a") as source:
        source.write("/* edited */\n")
    assert build.compiles() == 2
    assert build.compiles("-DUNUSED=1") == 2
    assert build.compiles() == 1
    whole = entry.read_bytes()
    for damaged in (b"garbage\n", whole[: len(whole) // 2], whole.replace(b"winner", b"wiener")):
        entry.write_bytes(damaged)
        assert build.compiles() == 2
        assert build.object() == build.default
        assert entry.read_bytes() == whole
    entry.chmod(0o666)
    assert build.compiles() == 2
    assert build.compiles() == 1


def test_a_file_changed_during_the_build_is_not_remembered(departing, native_cc, tc, tmp_path):
    """A header whose time is after the compile began (an edit during the build: the
    compile may have read it before) leaves nothing remembered: the rebuild is guarded
    again, until the header is older than the compile that remembers it."""
    (tmp_path / "params.h").write_text("#define SEED 1\n")
    build = Rebuild(native_cc, departing, tc, tmp_path, '#include "params.h"\n' + HASH.read_text())
    later = time.time() + 3600
    os.utime(tmp_path / "params.h", (later, later))
    assert build.compiles() == 2
    assert not build.memory()
    assert build.compiles() == 2
    os.utime(tmp_path / "params.h", (later - 7200, later - 7200))
    assert build.compiles() == 2
    assert build.compiles() == 1
    assert build.object() == build.default


def test_the_guards_memory_is_per_policy(departing, native_cc, tc, tmp_path):
    """Another policy, served by its own plugin, is another entry: guarded again."""
    build = Rebuild(native_cc, departing, tc, tmp_path, SHRINKS)
    assert build.compiles() == 2
    assert build.compiles() == 1
    (tmp_path / "other").mkdir()
    policy = gated_policy(tmp_path / "other" / "policy", 0.6)
    other = Service(tmp_path / "other", "--policy", str(policy), "--backend", "plugin")
    try:
        build.service = other
        assert build.compiles() == 2
        assert build.compiles() == 1
    finally:
        other.stop()


def test_a_compile_that_made_clangs_object_is_remembered_from_its_own_dependency_list(
    native_cc, tc, tmp_path
):
    """A compile the plugin served without departing from clang (gate at 1) writes no guard's
    dependency list, so its own -MD -MF list is what the memory reads: rebuilt unchanged, it
    is compiled once without the plugin, into the same bytes; a changed header is a miss. A
    list that leaves system headers out (-MMD) or is a link (another user could point it at
    any file) is not read: those stay served by the plugin. A compile that asks for no list
    is given one in the wrapper's scratch, and remembered the same way."""
    policy = save_inline_all(tmp_path / "gated", languages=None)
    save_policy(replace(load_policy(policy), departure_threshold=1.0), policy)
    (tmp_path / "service").mkdir()
    service = Service(tmp_path / "service", "--policy", str(policy), "--backend", "plugin")
    log, clang = tmp_path / "compiles.log", tmp_path / "clang"
    clang.write_text(
        f'#!/bin/sh\ncase "$*" in *-fpass-plugin=*) echo plugin;; *) echo plain;; esac >> {log}\n'
        f'exec {tc.clang} "$@"\n'
    )
    clang.chmod(0o755)
    (tmp_path / "params.h").write_text("#define SEED 1\n")
    (tmp_path / "x.c").write_text('#include "params.h"\n' + HASH.read_text())
    (tmp_path / "real.d").write_text("")
    (tmp_path / "link.d").symlink_to("real.d")

    def compiles(*deps: str) -> list[str]:
        """Compiles x.c afresh with DEPS: how clang ran, with the plugin or plainly."""
        (tmp_path / "x.o").unlink(missing_ok=True)
        log.write_text("")
        args = ["-Oz", "-c", "x.c", "-o", "x.o", *deps]
        r = run([*native_cc, *args], service.env(MLGO_GUARD="size", MLGO_CC=str(clang)), tmp_path)
        assert r.returncode == 0 and not r.stderr, r.stderr
        return log.read_text().split()

    try:
        plain(tc, ["-Oz", "-c", "x.c", "-o", "x.o"], cwd=tmp_path)
        default = (tmp_path / "x.o").read_bytes()
        for deps in (["-MMD", "-MF", "x.d"], ["-MD", "-MF", "link.d"]):
            assert compiles(*deps) == ["plugin"]
            assert compiles(*deps) == ["plugin"]
        own = ["-MD", "-MP", "-MF", "x.d"]
        assert compiles(*own) == ["plugin"]
        assert compiles(*own) == ["plain"]
        assert (tmp_path / "x.o").read_bytes() == default
        with (tmp_path / "params.h").open("a") as header:
            header.write("/* edited */\n")
        assert compiles(*own) == ["plugin"]
        assert compiles(*own) == ["plain"]
        # a compile that asks for no list (a plain Makefile's) gets one in the scratch (the
        # header edited again: the key leaves dependency options out, so this is a miss)
        with (tmp_path / "params.h").open("a") as header:
            header.write("/* edited again */\n")
        before = sorted(tmp_path.iterdir())
        assert compiles() == ["plugin"]
        assert compiles() == ["plain"]
        assert (tmp_path / "x.o").read_bytes() == default and sorted(tmp_path.iterdir()) == before
    finally:
        service.stop()


def test_a_remembered_link_is_a_miss_unless_whole_its_own_and_unchanged(tmp_path):
    """A guarded link's entry names its winner while every input hashes as it did; one
    cut short, spoilt, writable by others, a link, or whose input changed, is a miss; an
    input changed after the link began leaves nothing remembered."""
    from mlgo.serve.memo import remember, remembered

    inputs = [tmp_path / "a.o", tmp_path / "b.o"]
    for f in inputs:
        f.write_bytes(f.name.encode())
    entry = tmp_path / "entry"
    remember(entry, "default", [str(f) for f in inputs], time.time() + 1)
    assert remembered(entry) == "default"
    whole = entry.read_bytes()
    for spoilt in (whole[:-4], whole.replace(b"winner", b"wiener"), b"", whole + b"more\n"):
        entry.write_bytes(spoilt)
        assert remembered(entry) is None
    entry.write_bytes(whole)
    entry.chmod(0o666)
    assert remembered(entry) is None
    entry.chmod(0o600)
    (tmp_path / "link").symlink_to(entry)
    assert remembered(tmp_path / "link") is None
    inputs[1].unlink()
    os.mkfifo(inputs[1])  # no writer: a blocking open would wait for ever
    assert remembered(entry) is None
    inputs[1].unlink()
    inputs[1].write_bytes(b"edited")
    assert remembered(entry) is None
    remember(entry, "policy", [str(f) for f in inputs], time.time() + 1)
    assert remembered(entry) == "policy"
    entry.unlink()
    remember(entry, "policy", [str(f) for f in inputs], time.time() - 3600)  # edited since
    assert not entry.exists()


def test_a_links_inputs_are_the_files_it_names_and_the_libraries_it_finds(tmp_path, monkeypatch):
    from mlgo.serve.memo import link_inputs

    for name in ("a.o", "b.o", "order.txt", "lib/libz.a", "lib/libm.so", "lib/x.a", "lib/liby.a"):
        (tmp_path / name).parent.mkdir(exist_ok=True)
        (tmp_path / name).write_bytes(b"")
    monkeypatch.chdir(tmp_path)
    args = ["-flto", "a.o", "-Wl,--symbol-ordering-file,order.txt", "-Xlinker", "b.o",
            "-Llib", "-lz", "-l", "m", "-l:x.a", "-lnone", "-o", "prog", "-x", "c"]  # fmt: skip
    assert link_inputs(args) == [
        "a.o", "order.txt", "b.o", "lib/libz.a", "lib/libm.so", "lib/x.a"
    ]  # fmt: skip


def test_a_stopped_guard_leaves_nothing_behind(cc, eager, tmp_path):
    """make's Ctrl-C or a killed job: the wrapper dies of the signal, and its scratch
    directory (in the runtime directory, never beside the object) goes with it."""
    src = tmp_path / "slow.c"
    src.write_text(
        "".join(
            f"int f{i}(int x) {{ return x * {i} + f{i // 2}(x); }}\n" for i in range(1, 4000)
        ).replace("f0(x)", "0")
    )
    proc = subprocess.Popen(
        [*cc, "-Oz", "-c", str(src), "-o", str(tmp_path / "slow.o")],
        env=eager.env(MLGO_GUARD="size"),
        stderr=subprocess.DEVNULL,
    )
    runtime = eager.socket.parent
    while not list(runtime.glob(f"{GUARD_SCRATCH}*")):
        assert proc.poll() is None, "finished before its scratch directory was seen"
        assert not list(tmp_path.glob(".mlgo-guard-*")), "a scratch directory beside the object"
        time.sleep(0.01)
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(60) == -signal.SIGTERM
    assert not list(runtime.glob(f"{GUARD_SCRATCH}*"))


# Outputs the guard cannot compare: assembly, bitcode, and an object naming its own .dwo.
UNGUARDED_CASES = {
    "-S": ["-S", "-o", "hash.s"],
    "-emit-llvm": ["-c", "-emit-llvm", "-o", "hash.bc"],
    "-flto=thin": ["-c", "-flto=thin", "-o", "hash.o"],
    "-gsplit-dwarf": ["-c", "-g", "-gsplit-dwarf", "-o", "hash.o"],
}


@pytest.mark.parametrize("case", UNGUARDED_CASES)
def test_the_guard_leaves_what_it_cannot_compare_to_the_policy(cc, case, eager, tmp_path):
    """Every file written is the policy's, byte for byte as without the guard."""
    args = ["-Oz", str(HASH), *UNGUARDED_CASES[case]]
    r = run([*cc, *args], eager.env(), cwd=tmp_path)
    assert r.returncode == 0, r.stderr
    policy_alone = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    for p in tmp_path.iterdir():
        p.unlink()
    r = run([*cc, *args], eager.env(MLGO_GUARD="size"), cwd=tmp_path)
    assert r.returncode == 0 and not r.stderr, r.stderr
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == policy_alone


@pytest.fixture(scope="module")
def checker(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """mlgo_cc.c built with its checking entry point: its guard's rules alone."""
    out = tmp_path_factory.mktemp("check") / "mlgo-cc-check"
    build_native_wrapper(out, "-DMLGO_GUARD_CHECK")
    return out


# Command lines for the native wrapper's reading of them to agree with mlgo.serve.guard's.
COMMAND_LINES = [
    ["-Oz", "-c", "a.c"],
    ["-c", "dir/a.b.c", "-o", "out/x.o", "-MD", "-MP", "-MF", "out/x.d", "-MT", "t", "-MQ", "q"],
    ["-c", "x.cpp", "-ox.o", "-MMD", "-MFdeps.d", "-MTt", "-MQq", "-MJcdb.json", "-MG"],
    ["-c", "x.c", "-ftime-trace", "-ftime-trace=t.json", "-fsave-optimization-record"],
    ["-c", "x.c", "-fsave-optimization-record=yaml", "-foptimization-record-file=r.yaml"],
    ["-c", "x.c", "-save-stats", "--save-stats=obj", "--serialize-diagnostics", "x.dia"],
    ["-c", "x.c", "-MJ", "cdb.json", "-Wp,-MD,dep.d", "-Wp,-DX,-MMD,d2", "-Wp,-DY", "-Wp,"],
    ["-c", "x.c", "-objcmt-migrate-literals", "-o", "y.o", "-I", "inc", "-include", "h.h"],
    ["-c", "x.c", "-o", "dir/"],
    ["-c", "x.c", "-o", ""],
    ["-c", "x.c", "-o"],
    ["-c", "x.c", "-o", "-"],
    ["-c", "x.c", "-o-"],
    ["-c", ".c"],
    ["-c", "..c"],
    ["-c", "/abs/X.C", "-x", "c++"],
    ["-c", "lib/a.mm", "-o", "/abs/o.o"],
    ["x.c", "-o", "x"],
    ["-c", "a.c", "b.c"],
    ["-c", "a.c", "-o", "b.c"],
    ["-c", "a.c", "-S"],
    ["-c", "a.c", "-Xclang", "-emit-llvm"],
    ["-c", "a.c", "-save-temps"],
    ["-c", "a.c", "-save-temps=obj"],
    ["-c", "a.c", "--coverage"],
    ["-c", "a.c", "-ftest-coverage"],
    ["-c", "a.c", "-fprofile-arcs"],
    ["-c", "a.c", "-gsplit-dwarf=single"],
    ["-c", "a.c", "-flto"],
    ["-c", "a.c", "-flto=thin", "-fno-lto"],
    ["-c", "a.c", "-fno-lto", "-flto=full"],
    # every option Python's rules name, so that one added there alone fails
    *(["-c", "x.c", a] for a in (*SIDE_OUTPUTS, *UNGUARDED, *UNGUARDED_PREFIXES)),
    *(["-c", "x.c", a, "v.o"] for a in SIDE_OUTPUTS_WITH_VALUE),
    *(["-c", "x.c", f"{a}v.o"] for a in SIDE_OUTPUT_PREFIXES),
]


def test_the_native_wrapper_reads_command_lines_as_python_does(checker):
    """Which compiles the guard compares, the object, and the default compile's arguments."""
    guarded = 0
    for args in COMMAND_LINES:
        r = subprocess.run([checker, "guard", *args], capture_output=True, text=True)
        assert r.returncode == 0, (args, r.stderr)
        words = r.stdout.split("\0")[:-1]
        got = [Path(words[0]), *words[1:]] if words else []
        obj = guarded_object(args, source_files(args))
        assert got == ([obj, *default_args(args, Path("OUT"))] if obj else []), args
        guarded += bool(obj)
    assert 0 < guarded < len(COMMAND_LINES)


# (driver arguments, a C++ driver, the language Python reads): the native wrapper must agree
LANGUAGE_LINES = [
    (["-Oz", "-c", "a.c"], False, "c"),
    (["-Oz", "-c", "a.c"], True, "c++"),
    (["-c", "dir/a.b.cpp", "-o", "a.o"], False, "c++"),
    (["-c", "/abs/X.C"], False, "c++"),
    (["-c", "a.ii"], False, "c++"),
    (["-c", "a.i"], False, "c"),
    (["-c", "a.cc", "b.c"], False, None),
    (["-c", "a.cc", "b.c"], True, "c++"),
    (["-x", "c++", "-c", "a.c"], False, "c++"),
    (["-xc", "-c", "a.cpp"], True, "c"),
    (["-x", "c++", "a.c", "-x", "none", "b.c"], False, None),
    (["-x", "objective-c", "-c", "a.c"], False, None),
    (["-c", "lib/a.mm"], True, None),
    (["-c", "a.c", "-x"], False, "c"),
    (["-c", ".c"], False, None),
    (["-c", "x.c", "-Xclang", "-x"], False, "c"),
]


def test_the_native_wrapper_reads_the_language_as_python_does(checker):
    for args, cxx, want in LANGUAGE_LINES:
        assert compile_language(args, cxx) == want, (args, cxx)
        driver = "c++" if cxx else "cc"
        r = subprocess.run([checker, "language", driver, *args], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout == f"{want or 'none'}\n", (args, cxx, r.stdout)


# A compile that sets LLVM options of its own is clang's, unless they only report (the block
# address map's frequencies): the native wrapper must agree.
SERVED_LINES = [
    (["-O2", "-c", "a.c"], True),
    (["-O2", "-c", "a.c", "-mllvm", "-pgo-analysis-map=func-entry-count,bb-freq"], True),
    (["-O2", "-c", "a.c", "-mllvm=-pgo-analysis-map=bb-freq"], True),
    (["-O2", "-c", "a.c", "-mllvm", "-inline-threshold=10"], False),
    (["-O2", "-c", "a.c", "-mllvm", "-pgo-analysis-map=bb-freq", "-mllvm", "-debug-pass=x"], False),
    (["-O2", "-c", "a.c", "-mllvm"], False),
    (["-O2", "-c", "a.c", "-mllvmfoo"], False),
    (["-O2", "-E", "a.c", "-mllvm", "-pgo-analysis-map=bb-freq"], False),
]


def test_the_native_wrapper_serves_the_compiles_python_serves(checker):
    for args, want in SERVED_LINES:
        assert optimizes(args) == want, args
        r = subprocess.run([checker, "optimizes", *args], capture_output=True, text=True)
        assert r.returncode == 0 and r.stdout == f"{int(want)}\n", (args, r.stdout)


def test_the_native_wrapper_counts_text_as_python_does(checker, tc, tmp_path):
    """ELF64 objects of C, C++ and assembly with more sections than an ELF header counts:
    the bytes mlgo.llvm.sizes counts. -1 (Python's to read) for ELF32 and not ELF."""
    (tmp_path / "shrinks.c").write_text(SHRINKS)
    (tmp_path / "grows.cpp").write_text(GROWS_CXX)
    many = "".join(f'.section .text.f{i},"ax",@progbits\nret\n' for i in range(65300))
    (tmp_path / "many.s").write_text(many)
    builds = {
        "hash.o": [tc.clang, "-Oz", "-ffunction-sections", "-g", "-c", str(HASH)],
        "grows.o": [tc.clangxx, "-Oz", "-c", "grows.cpp"],
        "many.o": [tc.clang, "-c", "many.s"],
        "elf32.o": [tc.clang, "-m32", "-Oz", "-c", "shrinks.c"],
    }
    for obj, cmd in builds.items():
        r = run([*cmd, "-o", obj], cwd=tmp_path)
        assert r.returncode == 0, r.stderr
    r = run([str(checker), "text", *builds, "shrinks.c", "missing.o"], cwd=tmp_path)
    want = [text_size(tmp_path / o) for o in ("hash.o", "grows.o", "many.o")]
    assert want[2] == 65300  # a one-byte ret in each section
    assert r.stdout.split() == [str(n) for n in (*want, -1, -1, -1)]


def test_an_unknown_guard_is_one_warning(cc, eager, tmp_path):
    obj = tmp_path / "a.o"
    args = ["-Oz", "-c", str(HASH), "-o", str(obj)]
    r = run([*cc, *args], eager.env(MLGO_GUARD="speed"))
    assert r.returncode == 0 and obj.exists(), r.stderr
    assert r.stderr == (
        "mlgo-cc: warning: MLGO_GUARD='speed' is not one of: size; "
        f"compiling {HASH} without a guard\n"
    )
    obj.unlink()
    r = run([*cc, *args], eager.env(MLGO_GUARD="speed", MLGO_STRICT="1"))
    assert r.returncode == 1 and not obj.exists()
    assert r.stderr.startswith("mlgo-cc: error: MLGO_GUARD='speed'") and r.stderr.count("\n") == 1


def test_each_policy_serves_its_own_level_beside_another(cc, tmp_path):
    """Serving the -Oz inliner and the -O2 register allocator: each level gets its own
    policy, and the first compile at each level says which one it goes without."""
    regalloc = SHIPPED.parent / "regalloc-eviction"
    service = Service(
        tmp_path, "--policy", str(SHIPPED), "--policy", str(regalloc), "--backend", "python"
    )
    try:
        stderr = []
        for level in ("-Oz", "-O2", "-Oz", "-O2"):
            args = [level, "-c", str(HASH), "-o", str(tmp_path / "got.o")]
            r = run([*cc, *args], service.env())
            assert r.returncode == 0, r.stderr
            stderr.append(r.stderr)
        assert stderr == [
            "mlgo-cc: note: -Oz compiles are left to clang's default for regalloc-eviction "
            f"(trained for -O2) (first: {HASH})\n",
            "mlgo-cc: note: -O2 compiles are left to clang's default for inlining-size "
            f"(trained for -Oz) (first: {HASH})\n",
            "",
            "",
        ]
        status = service.status()
        assert status["levels"] == {
            "-Oz": {"served": 2, "default": 0},
            "-O2": {"served": 2, "default": 0},
        }
        assert status["compilations"] == 4 and status["failed_compilations"] == 0
    finally:
        service.stop()
