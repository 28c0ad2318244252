"""Decisions as data: what a policy decided, recorded by our plugin, replayed by plain clang
through the decisions directory's wrappers, gives the policy's objects; unseen, stale, corrupt
and foreign inputs get clang's own decisions and never fail a compile."""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
from collections.abc import Iterable
from dataclasses import replace
from pathlib import Path

import pytest

from mlgo.corpus.wrappers import write_wrapper
from mlgo.data import shipped_policy
from mlgo.llvm.cmdline import without_outputs
from mlgo.llvm.replay import CLANG_ADVISOR, Decision, replay_flags
from mlgo.llvm.sizes import text_size
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems.policy_files import load_policy
from mlgo.ship import decisions
from mlgo.ship.decisions import DecisionsError, UnitDecisions
from mlgo.ship.decisions_kept import keep, replayed_sizes
from mlgo.ship.decisions_record import record_build, record_units
from mlgo.ship.plugin import inliner_plugin
from tests.conftest import run_mlgo
from tools.lab.decisions_figure import still_matching_in

DATA = Path(__file__).parent / "data"
# tests/data/minipkg's C and tests/data/cxx's C++: the policy departs from clang on the latter
SOURCES = ["hash.c", "strbuf.c", "main.c", "inventory.cc"]
EDITED, EDITED_FUNCTION = "strbuf.c", "int strbuf_hex("


def _decision(key: str, inline: bool, callee: str = "leaf") -> Decision:
    return Decision("top", key, callee, inline)


@pytest.mark.unit
def test_a_site_answered_both_ways_is_dropped_and_counted():
    lines = [_decision("top:1:3", True), _decision("top:1:3", False), _decision("top:2:3", True)]
    text = "\n".join(d.line() for d in [*lines, lines[2]]) + "\n"
    assert decisions.from_recorder(text, "rec") == ([lines[2]], 1, [])
    with pytest.raises(DecisionsError, match=r"^rec:2: not a recorded decision"):
        decisions.from_recorder(lines[0].line() + "\nremark: something else\n", "rec")


@pytest.mark.unit
def test_a_file_is_its_header_then_replay_lines_sorted(tmp_path: Path):
    ds = [_decision("top:9:3", False), Decision("a", "a:1:1", "leaf", True)]
    inl = tmp_path / "x.inl"
    inl.write_text(decisions.inl_text(ds))
    assert inl.read_text().splitlines()[0] == decisions.HEADER
    assert decisions.read_inl(inl) == sorted(ds)
    assert decisions.departures(ds, [_decision("top:9:3", True)]) == {"top": 1}


@pytest.mark.unit
@pytest.mark.security
@pytest.mark.parametrize(
    ("text", "error"),
    [
        ("", r"x\.inl:1: not a decisions file of mlgo-decisions 1"),
        (_decision("f:1:1", True).line() + "\n", r"x\.inl:1: not a decisions file"),
        (decisions.HEADER + "\n#comment\n", r"x\.inl:2: not a decision line: '#comment'"),
        (decisions.HEADER + "\nmlgo: 'a' inlined into 'b' at callsite\n", r"x\.inl:2: "),
    ],
)
def test_a_foreign_or_corrupt_file_is_refused_in_one_line(tmp_path: Path, text, error):
    inl = tmp_path / "x.inl"
    inl.write_text(text)
    with pytest.raises(DecisionsError, match=error):
        decisions.read_inl(inl)


@pytest.mark.unit
def test_a_g0_build_gets_locations_and_a_g_build_nothing():
    assert decisions.compile_flags(["-Oz"]) == list(decisions.LOCATION_FLAGS)
    assert decisions.compile_flags(["-g", "-Oz", "-g0"]) == list(decisions.LOCATION_FLAGS)
    assert decisions.compile_flags(["-Oz", "-gline-tables-only"]) == []


@pytest.mark.unit
@pytest.mark.parametrize("data", [b"", b"int a;\n", bytes(range(256)) * 300])
def test_a_sources_checksum_is_what_posix_cksum_prints(data: bytes):
    """The wrappers compare a source with its decisions file's line by `cksum` alone."""
    cksum = subprocess.run(["cksum"], input=data, capture_output=True, check=True)
    assert decisions.posix_cksum(data) == cksum.stdout.decode().strip()


def _written(directory: Path, root: Path, inline: bool) -> Path:
    """A decisions directory for ROOT/src/a.c of two decisions, the second one INLINE."""
    ds = [_decision("top:1:3", True), _decision("top:2:3", inline, "other")]
    unit = UnitDecisions(ds, departures={"top": 1}, digest=decisions.source_digest(root / "a.c"))
    return decisions.write(directory, root, {"a.c": unit}, {}, [], 22)


def test_the_commands_show_diff_check_and_print_the_flags(tmp_path: Path):
    (tmp_path / "a.c").write_text("int a;\n")
    old = _written(tmp_path / "old", tmp_path, False)
    new = _written(tmp_path / "new", tmp_path, True)
    shown = run_mlgo("decisions", "show", "--functions", str(new), timeout=60)
    assert shown.stdout.splitlines() == [
        "files/a.c: 2 decisions, 2 inline, 1 departing from clang's own, "
        "0 conflicting sites dropped",
        "  top: 2 decisions, 2 inline, 1 departing",
    ]
    changed = run_mlgo("decisions", "diff", str(old), str(new), timeout=60)
    assert changed.stdout.splitlines() == ["files/a.c: ~1", "  top: ~1"]
    (tmp_path / "a.c").write_text("int a, b;\n")
    checked = run_mlgo("decisions", "check", str(new), timeout=60)
    assert checked.stdout == "a.c: changed since recorded, 2 decisions to recheck\n"
    flags = run_mlgo("flags", "--decisions", str(new), "--", "-Oz", "-g", timeout=60)
    assert (flags.returncode, flags.stdout) == (0, "")  # a -g build adds nothing
    assert flags.stderr == (
        f"mlgo: note: compile with CC={new}/cc CXX={new}/c++: they add what each compile "
        "needs, CFLAGS nothing\n"
    )
    refused = run_mlgo("flags", "--decisions", str(new), "--", "-Oz", timeout=60)
    assert refused.returncode == 2
    assert refused.stderr.startswith(f"error: {new / 'flags'}: recorded for a build with debug")
    (new / "files" / "a.c.inl").write_text("garbage\n")
    corrupt = run_mlgo("decisions", "diff", str(old), str(new), timeout=60)
    assert corrupt.returncode == 2
    inl = new / "files" / "a.c.inl"
    assert corrupt.stderr == f"error: {inl}:1: not a decisions file of mlgo-decisions 1\n"


# --- with clang-22: a policy that departs from clang, recorded and replayed ---------------


@pytest.fixture(scope="module")
def plugin(tc: Toolchain) -> Path:
    """The shipped inlining policy, ungated: it departs from clang's own on these sources."""
    policy = replace(load_policy(shipped_policy("inlining-size")), departure_threshold=None)
    return inliner_plugin(policy, tc)


def _project(tmp_path: Path) -> Path:
    root = tmp_path / "project"
    shutil.copytree(DATA / "minipkg", root / "src")
    shutil.copy(DATA / "cxx" / "inventory.cc", root / "src")
    return root


def _compiler(drivers: tuple[str, str], name: str) -> str:
    """Of the C and C++ DRIVERS, the one for source NAME."""
    return drivers[name.endswith(".cc")]


def _clang(tc: Toolchain) -> tuple[str, str]:
    return tc.clang, tc.clangxx


def _wrappers(root: Path) -> tuple[str, str]:
    return str(root / "decisions" / "cc"), str(root / "decisions" / "c++")


def _objects(drivers: tuple[str, str], root: Path, cflags: list[str], out: Path) -> dict:
    """Each source compiled by DRIVERS from ROOT, as a build would: relative paths."""
    out.mkdir(parents=True, exist_ok=True)
    objs = {}
    for name in SOURCES:
        obj = out / f"{name}.o"
        cmd = [_compiler(drivers, name), *cflags, "-c", f"src/{name}", "-o", str(obj)]
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True)
        assert proc.stderr == "", proc.stderr
        objs[name] = obj.read_bytes()
    return objs


def _recorded(tc: Toolchain, plugin: Path, root: Path, cflags: list[str], out: Path):
    """The decisions of the policy's build, written to ROOT/decisions, and its objects."""
    out.mkdir(parents=True, exist_ok=True)
    files = {
        f"src/{name}": decisions.record_source(
            _compiler(_clang(tc), name), plugin, root, f"src/{name}", cflags, out / f"{name}.o"
        )
        for name in SOURCES
    }
    flags = decisions.compile_flags(cflags)
    decisions.write(root / "decisions", root, files, {}, flags, tc.major)
    return files, {name: (out / f"{name}.o").read_bytes() for name in SOURCES}


@pytest.mark.parametrize("debug", [pytest.param("-g", marks=pytest.mark.slow), "-g0"])
def test_clang_alone_replays_the_policys_objects(
    tc: Toolchain, plugin: Path, tmp_path: Path, debug: str
):
    root, cflags = _project(tmp_path), ["-Oz", debug]
    files, policys = _recorded(tc, plugin, root, cflags, tmp_path / "policy")
    plain = _objects(_clang(tc), root, cflags, tmp_path / "plain")
    assert sum(sum((u.departures or {}).values()) for u in files.values()) > 0
    assert any(policys[n] != plain[n] for n in SOURCES), "the policy must change an object"
    replayed = _objects(_wrappers(root), root, cflags, tmp_path / "replayed")
    assert replayed == policys
    # a -g0 build's location flags leave its objects as plain -g0 makes them, and only a
    # file replayed pays for them
    if debug == "-g0":
        (root / "src" / "unseen.c").write_text("int f(void) { return 0; }\n")
        for name, replays in (("unseen.c", False), ("hash.c", True)):
            cmd = [_wrappers(root)[0], *cflags, "-###", "-c", f"src/{name}"]
            proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True, check=True)
            assert (decisions.LOCATION_FLAGS[0] in proc.stderr) == replays, name
        policy_g0 = {}
        for name in SOURCES:
            obj = tmp_path / f"{name}.g0.o"
            cmd = [_compiler(_clang(tc), name), *cflags, f"-fpass-plugin={plugin}", "-c"]
            cmd += [f"src/{name}", "-o", obj]
            subprocess.run(cmd, cwd=root, check=True)
            policy_g0[name] = obj.read_bytes()
        assert replayed == policy_g0


@pytest.mark.security
def test_unseen_stale_corrupt_and_foreign_files_get_clangs_own(
    tc: Toolchain, plugin: Path, tmp_path: Path
):
    root, cflags = _project(tmp_path), ["-Oz", "-g0"]
    _recorded(tc, plugin, root, cflags, tmp_path / "policy")
    cc, files = str(root / "decisions" / "cc"), root / "decisions" / "files" / "src"
    plain = _objects(_clang(tc), root, cflags, tmp_path / "plain")

    def through(compiler: str, name: str) -> tuple[bytes, str]:
        obj = tmp_path / "out.o"
        cmd = [compiler, *cflags, "-c", f"src/{name}", "-o", str(obj)]
        proc = subprocess.run(cmd, cwd=root, capture_output=True, text=True)
        assert proc.returncode == 0, proc.stderr
        return obj.read_bytes(), proc.stderr

    # a file never recorded: clang's own, silently
    shutil.copy(root / "src" / "hash.c", root / "src" / "unseen.c")
    assert through(cc, "unseen.c") == (through(tc.clang, "unseen.c")[0], "")
    # corrupt and foreign files: one line each, clang's own decisions, the file untouched
    corrupt, foreign = files / "hash.c.inl", files / "main.c.inl"
    corrupt.write_text(corrupt.read_text() + "garbage\n")
    foreign.write_text("\n".join(foreign.read_text().splitlines()[1:]) + "\n")
    before = {p: p.read_bytes() for p in (corrupt, foreign)}
    for name, inl in (("hash.c", corrupt), ("main.c", foreign)):
        note = f"mlgo: {inl} is not a decisions file of mlgo-decisions 1; clang's own decisions\n"
        assert through(cc, name) == (plain[name], note)
    assert {p: p.read_bytes() for p in before} == before
    # a stale edit, a line added inside a function: compiles, says so in one line (an
    # unchanged source says nothing), and `check` says how many decisions still match
    assert through(cc, EDITED)[1] == ""
    text = (root / "src" / EDITED).read_text()
    brace = text.index("{", text.index(EDITED_FUNCTION))
    (root / "src" / EDITED).write_text(text[: brace + 1] + "\n  ;" + text[brace + 1 :])
    assert through(cc, EDITED)[1] == (
        f"mlgo: src/{EDITED} changed since its decisions were recorded; its moved call sites"
        " get clang's own decisions (mlgo decisions check says how many still match)\n"
    )
    recheck = [tc.clang, *cflags, *decisions.compile_flags(cflags), f"-fpass-plugin={plugin}"]
    artifact = decisions.read(root / "decisions")
    for name, edited in (("inventory.cc", False), (EDITED, True)):
        command = [_compiler(_clang(tc), name), *recheck[1:], "-c", f"src/{name}", "-o", os.devnull]
        matched, total = decisions.still_matching(artifact, f"src/{name}", command, root)
        assert 0 < matched < total if edited else matched == total > 0, (name, matched, total)
    report, _ = decisions.check(decisions.read(root / "decisions"), root)
    assert f"src/{EDITED}: changed since recorded" in "\n".join(report)
    assert "src/inventory.cc: unchanged, all" in "\n".join(report)


def test_a_logged_build_that_names_no_level_is_rechecked_at_its_wrappers_flags(
    tc: Toolchain, plugin: Path, tmp_path: Path
):
    """A CMake build without a build type compiles with no -O of its own: the level is what
    the wrapper appends, and the logged call holds only the build's arguments. Rechecked
    with them, C and C++ alike, every decision of an unchanged file still matches."""
    root, cflags = _project(tmp_path), ["-Oz", "-g0"]
    _recorded(tc, plugin, root, cflags, tmp_path / "policy")
    calls, built = tmp_path / "calls", tmp_path / "built"
    calls.mkdir()
    built.mkdir()
    drivers = tuple(
        str(write_wrapper(tmp_path / kind, compiler, cflags, calls))
        for kind, compiler in (("cc", tc.clang), ("c++", tc.clangxx))
    )
    for name in SOURCES:
        cmd = [_compiler(drivers, name), "-c", f"src/{name}", "-o", str(built / f"{name}.o")]
        subprocess.run(cmd, cwd=root, check=True)
    artifact = decisions.read(root / "decisions")
    matching = still_matching_in(artifact, calls, root, cflags)
    assert sorted(matching) == [f"src/{name}" for name in sorted(SOURCES)]
    for name, (matched, total) in matching.items():
        assert matched == total == artifact.files[name]["decisions"] > 0, name


def test_a_full_lto_link_replays_from_its_programs_decisions(
    tc: Toolchain, plugin: Path, tmp_path: Path
):
    """The link's decisions are recorded from clang's own advisor at another threshold: a
    decision-maker whose program differs from plain clang's, as a policy's would."""
    root, cflags = _project(tmp_path), ["-Oz", "-g0", "-flto"]
    c_sources = [n for n in SOURCES if n.endswith(".c")]
    objects = [f"{n}.o" for n in c_sources]
    for name in c_sources:
        compile_ = [tc.clang, *cflags, *decisions.compile_flags(cflags), "-c", f"src/{name}"]
        subprocess.run([*compile_, "-o", f"{name}.o"], cwd=root, check=True)
    link = ["-flto", "-fuse-ld=lld", "-Oz", *objects, "-o"]
    threshold = ["-Wl,-mllvm,-inline-threshold=60"]
    recorded = [tc.clang, *link, "recorded", *threshold]
    unit = decisions.record_link(recorded, plugin, root, CLANG_ADVISOR)
    flags = decisions.compile_flags(cflags)
    decisions.write(root / "decisions", root, {}, {"prog": unit}, flags, tc.major)
    subprocess.run([tc.clang, *link, "plain"], cwd=root, check=True)
    proc = subprocess.run([_wrappers(root)[0], *link, "prog"], cwd=root, capture_output=True)
    assert (proc.returncode, proc.stderr) == (0, b"")
    program = (root / "prog").read_bytes()
    assert program == (root / "recorded").read_bytes() != (root / "plain").read_bytes()
    # by hand: plain clang with the link flags `mlgo flags --decisions DIR --link` prints
    artifact = decisions.read(root / "decisions")
    by_hand, _ = decisions.build_flags(artifact, [*cflags, "-o", "prog"], link=True)
    subprocess.run([tc.clang, *link, "by-hand", *by_hand], cwd=root, check=True)
    assert (root / "by-hand").read_bytes() == program
    assert decisions.show(decisions.read(root / "decisions"))[0].startswith(
        f"links/prog: {len(unit.decisions)} decisions"
    )


MAKEFILE = """\
OBJS = src/hash.o src/strbuf.o src/main.o
all: prog src/inventory.o
prog: $(OBJS)
\t$(CC) $(CFLAGS) -fuse-ld=lld $(OBJS) -o $@
src/%.o: src/%.c
\t$(CC) $(CFLAGS) -c $< -o $@
src/%.o: src/%.cc
\t$(CXX) $(CFLAGS) -c $< -o $@
"""


@pytest.mark.parametrize("lto", [False, True], ids=["per-file", "full-lto"])
def test_a_recorded_make_build_is_rebuilt_by_the_wrappers(tc: Toolchain, tmp_path: Path, lto: bool):
    root = _project(tmp_path)
    (root / "Makefile").write_text(MAKEFILE)
    policy = replace(load_policy(shipped_policy("inlining-size")), departure_threshold=None)
    out, cflags = root / "decisions", "CFLAGS=-Oz -g0" + " -flto" * lto
    _, skipped = record_build(policy, out, root, ["make", cflags], tc)
    assert skipped == []
    outputs = [*(f"src/{Path(n).stem}.o" for n in SOURCES), "prog"]
    kept = {o: (root / o).read_bytes() for o in outputs}
    artifact = decisions.read(out)
    assert sorted(artifact.files) == sorted(f"src/{n}" for n in SOURCES)
    assert sorted(artifact.links) == (["prog"] if lto else [])
    assert artifact.files["src/inventory.cc"]["departures"] > 0
    assert (out / "flags").read_text().split() == list(decisions.LOCATION_FLAGS)
    for o in outputs:
        (root / o).unlink()
    wrappers = [f"CC={out / 'cc'}", f"CXX={out / 'c++'}"]
    subprocess.run(["make", *wrappers, cflags], cwd=root, check=True)
    assert {o: (root / o).read_bytes() for o in outputs} == kept


GENERATING_MAKEFILE = """\
prog: src/hash.o src/gen.o src/main.o probe
\t$(CC) $(CFLAGS) src/hash.o src/gen.o src/main.o -o $@
src/gen.o: src/strbuf.c
\tcp src/strbuf.c src/gen.c && $(CC) $(CFLAGS) -c src/gen.c -o $@ && rm src/gen.c
src/%.o: src/%.c
\t$(CC) $(CFLAGS) -c $< -o $@
probe:
\tprintf 'int main(void) { return 0; }\\n' > probe.c
\t$(CC) $(CFLAGS) -c probe.c -o probe.o && rm probe.c probe.o
"""


def test_a_source_the_build_deletes_once_compiled_is_decided_in_a_copy_of_the_tree(
    tc: Toolchain, tmp_path: Path
):
    """A build that generates a source, compiles it and deletes it (bash's builtins) keeps
    its object: recorded in a scratch copy, the source is put back as it was compiled and
    decided, and the decisions wrappers replay it when the build generates it again; a
    probe that deletes its object too stays out, and without the switch (a user's own
    tree) nothing is put back."""
    policy = replace(load_policy(shipped_policy("inlining-size")), departure_threshold=None)
    build = ["make", "CFLAGS=-Oz -g0"]
    found = {}
    for restore in (False, True):
        root = _project(tmp_path / str(restore))
        (root / "Makefile").write_text(GENERATING_MAKEFILE)
        clangs = tmp_path / f"clangs-{restore}"
        clangs.mkdir()
        found[restore] = record_units(
            policy, root, build, tc, tmp_path / "log", clangs, None, "compile", restore
        )
    assert sorted(found[False].files) == ["src/hash.c", "src/main.c"]
    assert sorted(found[True].files) == ["src/gen.c", "src/hash.c", "src/main.c"]
    assert (root / "src" / "gen.c").read_bytes() == (root / "src" / "strbuf.c").read_bytes()
    assert not (root / "probe.c").exists()
    unit = found[True].files["src/gen.c"]
    assert unit.decisions and unit.departures is not None
    out = tmp_path / "dir"
    decisions.write(out, root, found[True].files, {}, found[True].flags, tc.major)
    inl = tmp_path / "gen.inl"
    inl.write_text(decisions.inl_text(unit.decisions))
    call, own = found[True].compiles["src/gen.c"], found[True].clangs["files/src/gen.c"]
    replayed_sizes(call, found[True].flags, replay_flags(str(inl)), tmp_path, own)
    fresh = _project(tmp_path / "fresh")
    (fresh / "Makefile").write_text(GENERATING_MAKEFILE)
    env = {**os.environ, decisions.ROOT_ENV: str(fresh)}
    wrappers = [f"CC={out / 'cc'}", f"CXX={out / 'c++'}"]
    subprocess.run([*build, *wrappers], cwd=fresh, check=True, env=env, capture_output=True)
    assert (fresh / "src" / "gen.o").read_bytes() == (tmp_path / "decisions").read_bytes()


@pytest.mark.unit
def test_show_and_diff_say_what_the_decisions_bought(tmp_path: Path):
    (tmp_path / "a.c").write_text("int a;\n")
    ds = [_decision("top:1:3", True), _decision("top:2:3", False, "other")]

    def written(name: str, saved: int) -> decisions.Artifact:
        sizes = decisions.Sizes(100 - saved, 100, {"top": 50 - saved, "leaf": 0}, {"top": 50})
        unit = UnitDecisions(ds, departures={"top": 1}, sizes=sizes)
        left = {"files/b.c": {"why": "its 2 departures build 4 bytes more"}}
        return decisions.read(decisions.write(tmp_path / name, tmp_path, {"a.c": unit}, {},
                                              [], 22, left))  # fmt: skip

    old, new = written("old", 2), written("new", 6)
    assert new.files["a.c"]["text"] == {"decisions": 94, "clang": 100, "saved": 6}
    assert decisions.show(new, by_function=True) == [
        "files/a.c: 2 decisions, 1 inline, 1 departing from clang's own, "
        "0 conflicting sites dropped, 6 bytes saved",
        "  top: 2 decisions, 1 inline, 1 departing, 6 bytes saved",
        "files/b.c: clang's own decisions (its 2 departures build 4 bytes more)",
    ]
    (new.path / "files" / "a.c.inl").write_text(decisions.inl_text([ds[0]]))
    assert decisions.diff(old, new) == [
        "files/a.c: -1; .text saved 2 -> 6 bytes",
        "  top: -1; .text saved 2 -> 6 bytes",
    ]


def test_a_file_whose_decisions_build_larger_keeps_none(tc: Toolchain, tmp_path: Path):
    """The guard's choice made once: a make build recorded with the policy, one file's
    decisions swapped for clang's own at a high inline threshold (real decisions that build
    a larger object). Kept are the departing files that build smaller, each with the bytes it saves;
    the loser has no file, and the build from the directory gives the measured objects."""
    root = _project(tmp_path)
    (root / "Makefile").write_text(MAKEFILE)
    policy = load_policy(shipped_policy("inlining-size"))  # gated: it wins on inventory.cc
    build = ["make", "CFLAGS=-Oz -g0"]
    clangs = tmp_path / "clangs"
    clangs.mkdir()
    found = record_units(policy, root, build, tc, tmp_path / "build.log", clangs, stage="compile")
    loser = f"src/{EDITED}"
    call, loads = found.compiles[loser], [f"-fpass-plugin={inliner_plugin(policy, tc)}"]
    command = [*without_outputs(call.argv), *loads, *decisions.LOCATION_FLAGS, "-o", os.devnull]
    more, conflicts, _ = decisions.record([*command, "-mllvm", "-inline-threshold=200"],
                                          call.cwd, CLANG_ADVISOR)  # fmt: skip
    clangs = decisions.record(command, call.cwd, CLANG_ADVISOR)[0]
    found.files[loser] = UnitDecisions(more, conflicts, decisions.departures(more, clangs))
    files, links, left = keep(found, "size")
    assert links == {} and set(files) | {n.removeprefix("files/") for n in left} == set(found.files)
    assert f"files/{loser}" in left and left[f"files/{loser}"]["text"]["saved"] < 0
    assert set(files) == {"src/inventory.cc"}
    for unit in files.values():
        assert sum((unit.departures or {}).values()) > 0 and unit.sizes.saved > 0
    out = decisions.write(root / "decisions", root, files, links, found.flags, tc.major, left)
    assert not (out / "files" / f"{loser}.inl").exists()
    for name in found.files:
        (root / name).with_suffix(".o").unlink()
    subprocess.run(["make", f"CC={out / 'cc'}", f"CXX={out / 'c++'}", *build[1:]], cwd=root,
                   check=True, capture_output=True)  # fmt: skip
    for name, unit in files.items():
        assert text_size((root / name).with_suffix(".o")) == unit.sizes.decisions
    loser_text = left[f"files/{loser}"]["text"]
    # clang's own side was weighed on the recorder's compile: plain clang's .text
    assert text_size((root / loser).with_suffix(".o")) == loser_text["clang"]
    shown = decisions.show(decisions.read(out))
    assert f"files/{loser}: clang's own decisions (its " in "\n".join(shown)


def test_a_searched_trajectory_recorded_by_its_answers_builds_what_the_search_measured(
    tc: Toolchain, tmp_path: Path
):
    """A trajectory as the tune's search measures one (the channel's compile of a corpus
    module, clang's own answers with some flipped), replayed by its answers through the
    plugin with the recorder on: plain clang's replay of the decisions so keyed by call
    site builds each file's object to the .text the search measured. Where those decisions
    save more than the policy's, `keep` ships them, found by the search."""
    from mlgo.corpus.compile import compile_module
    from mlgo.corpus.format import load_corpus
    from mlgo.corpus.record import module_name, record
    from mlgo.llvm.replay import replay_flags
    from mlgo.problems import get_problem
    from mlgo.ship.decisions_record import answered_units
    from mlgo.train.bcmax import Answerer

    problem = get_problem("inlining-size")
    root = _project(tmp_path)
    (root / "Makefile").write_text(MAKEFILE)
    build = ["make", "CFLAGS=-Oz -g0"]
    recorded = tmp_path / "recorded" / root.name  # the tune records a copy of the same name
    shutil.copytree(root, recorded)
    record(build, tmp_path / "corpus", tc, recorded)
    modules = {m.name: m for m in load_corpus(tmp_path / "corpus").modules}
    policy = load_policy(shipped_policy("inlining-size"))
    clangs = tmp_path / "clangs"
    clangs.mkdir()
    found = record_units(policy, root, build, tc, tmp_path / "build.log", clangs, stage="compile")
    measured, answers = {}, {}
    flipped = Answerer(problem, flips=frozenset(range(0, 60, 3)))
    for name in found.compiles:
        run = compile_module(
            problem, modules[module_name(Path(name), root.name)], tc.clang, flipped
        )
        measured[name], answers[name] = run.metrics["text_once"], "".join(map(str, run.advice))
    searched = answered_units(found, answers)
    assert set(searched) == {f"files/{n}" for n in found.compiles} and all(
        u.found_by == "search" for u in searched.values()
    )
    inl = tmp_path / "unit.inl"
    for name, unit in ((n, searched[f"files/{n}"]) for n in found.compiles):
        inl.write_text(decisions.inl_text(unit.decisions))
        call, own = found.compiles[name], found.clangs[f"files/{name}"]
        sizes = replayed_sizes(call, found.flags, replay_flags(str(inl)), tmp_path, own)
        assert sizes.decisions == measured[name], name
        assert sum((unit.departures or {}).values()) > 0, name  # the flips departed
    files, _, _ = keep(found, "size", None, searched)
    policys = {n: u.sizes.saved if u.sizes else 0 for n, u in found.files.items()}
    for name, mine in ((n, searched[f"files/{n}"]) for n in found.compiles):
        assert mine.sizes is not None  # weighed beside the policy's
        best = max(policys[name], mine.sizes.saved)
        if best <= 0:
            assert name not in files
            continue
        by_search = mine.sizes.saved > policys[name]
        assert files[name].found_by == ("search" if by_search else "policy"), name
        assert files[name].sizes.saved == best
        if by_search:
            assert "found by the search" in decisions._found_by(files[name].summary())


def test_a_searched_trajectory_at_a_full_lto_link_is_recorded_by_its_call_sites(
    tc: Toolchain, tmp_path: Path
):
    """A trajectory the search measured on a program's merged module (the corpus's
    `clang -Oz -c` of it, clang's own answers with some flipped), answered on the merged
    module of the same link in the build being decided: recorded by call site, those
    decisions rebuild that compile to the .text the search measured, and replayed at the
    real link they depart from clang's own there, where `keep` judges them beside the
    policy's."""
    from mlgo.corpus.compile import compile_module
    from mlgo.corpus.format import load_corpus
    from mlgo.corpus.lto import Link, lto_flags, merged_module
    from mlgo.corpus.record import module_name, record
    from mlgo.llvm.replay import replay_flags
    from mlgo.problems import get_problem
    from mlgo.programs.build import problem_flags
    from mlgo.ship.decisions_record import answered_links
    from mlgo.train.bcmax import Answerer

    problem = get_problem("inlining-size-link")
    root = _project(tmp_path)
    (root / "Makefile").write_text(MAKEFILE)
    build = ["make", "CFLAGS=-Oz -g0"]
    recorded = tmp_path / "recorded" / root.name
    shutil.copytree(root, recorded)
    record(build, tmp_path / "corpus", tc, recorded, opt_level=problem.opt_level, stage="link")
    (module,) = load_corpus(tmp_path / "corpus").modules
    assert module.name == module_name(Path("prog"), root.name)
    policy = load_policy(shipped_policy("inlining-size-link"))
    clangs = tmp_path / "clangs"
    clangs.mkdir()
    found = record_units(
        policy, root, build, tc, tmp_path / "build.log", clangs, problem_flags(problem), "link"
    )
    assert set(found.links) == {"prog"}
    run = compile_module(
        problem, module, tc.clang, Answerer(problem, flips=frozenset(range(0, 90, 2)))
    )
    measured, answers = run.metrics[problem.reward_metric], "".join(map(str, run.advice))
    corpus_flags = [problem.opt_level, *lto_flags("link")]
    searched = answered_links(found, {"prog": answers}, tc, problem.opt_level)
    unit = searched["links/prog"]
    assert unit.found_by == "search" and sum((unit.departures or {}).values()) > 0
    inl = tmp_path / "unit.inl"
    inl.write_text(decisions.inl_text(unit.decisions))
    call = found.link_calls["prog"]
    link = Link(call.cwd, call.argv, call.cwd / "prog")
    (tmp_path / "link").mkdir()
    merged = merged_module(link, corpus_flags, tmp_path / "link", None)
    again = tmp_path / "again.o"
    command = [tc.clang, "-Oz", "-c", str(merged), *replay_flags(str(inl)), "-o", str(again)]
    subprocess.run(command, check=True, capture_output=True)
    assert text_size(again) == measured
    _, links, _ = keep(found, "size", None, searched)
    policys = found.links["prog"].sizes.saved if found.links["prog"].sizes else 0
    assert unit.sizes is not None  # the real link, weighed beside the policy's
    best = max(policys, unit.sizes.saved)
    if best > 0:
        assert links["prog"].sizes.saved == best
        assert links["prog"].found_by == ("search" if unit.sizes.saved > policys else "policy")
    else:
        assert "prog" not in links


@pytest.mark.parametrize("lto", ["full", "thin"])
def test_a_configures_probes_are_left_out_and_a_link_replays_its_program(
    tc: Toolchain, tmp_path: Path, lto: str
):
    """CMake's configure compiles and links probes in directories it deletes: recorded at an
    LTO link from configure on, only the project's program is kept (at ThinLTO, every
    backend's decisions, as the program's), and its decisions, replayed by plain clang
    through lld, rebuild the recorded program byte for byte."""
    root = shutil.copytree(DATA / "record" / "cmake", tmp_path / "cmake")
    policy = replace(load_policy(shipped_policy("inlining-size")), departure_threshold=None)
    flags = f"-Oz -g0 -flto={lto} -fuse-ld=lld"
    script = (
        f"cmake -B build -DCMAKE_C_FLAGS='{flags}' -DCMAKE_CXX_FLAGS='{flags}' "
        f"-DCMAKE_EXE_LINKER_FLAGS='{flags}' && cmake --build build"
    )
    stage = {"full": "link", "thin": "thin-link"}[lto]
    clangs = tmp_path / "clangs"
    clangs.mkdir()
    found = record_units(
        policy, root, ["sh", "-c", script], tc, tmp_path / "log", clangs, stage=stage
    )
    assert (found.files, set(found.links)) == ({}, {"summarize"})
    unit = found.links["summarize"]
    assert len({d.caller for d in unit.decisions}) > 1
    inl = tmp_path / "program.inl"
    inl.write_text(decisions.inl_text(unit.decisions))
    replay = decisions.link_replay_flags(str(inl))
    replayed_sizes(
        found.link_calls["summarize"], [], replay, tmp_path, found.clangs["links/summarize"]
    )
    assert (tmp_path / "decisions").read_bytes() == (root / "build" / "summarize").read_bytes()


def test_decisions_committed_into_a_copied_or_cloned_project_find_their_sources(
    tc: Toolchain, plugin: Path, tmp_path: Path
):
    """A tune writes its decisions outside the project (FORMAT's root is relative to
    there); committed into the project, a copy or a clone at another path finds its
    sources from the directory's own place, with no MLGO_DECISIONS_ROOT."""
    root, cflags, name = _project(tmp_path), ["-Oz", "-g0"], "src/inventory.cc"
    recorded = tmp_path / "recorded.o"
    unit = decisions.record_source(tc.clangxx, plugin, root, name, cflags, recorded)
    out = tmp_path / "tune" / "out" / "decisions"
    flags = decisions.compile_flags(cflags)
    decisions.write(out, root, {name: unit}, {}, flags, tc.major)
    shutil.copytree(out, root / "decisions")
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-c", "init.defaultBranch=m"]
    subprocess.run([*git, "init", "-q"], cwd=root, check=True)
    subprocess.run([*git, "add", "."], cwd=root, check=True)
    subprocess.run([*git, "commit", "-qm", "decisions"], cwd=root, check=True)
    copy, clone = tmp_path / "elsewhere" / "copy", tmp_path / "ci" / "clone"
    shutil.copytree(root, copy)
    subprocess.run(["git", "clone", "-q", str(root), str(clone)], check=True)
    env = {k: v for k, v in os.environ.items() if k != decisions.ROOT_ENV}
    plain = tmp_path / "plain.o"
    subprocess.run([tc.clangxx, *cflags, "-c", root / name, "-o", plain], check=True)
    for tree in (copy, clone):
        command = [tree / "decisions" / "c++", *cflags, "-c", name, "-o", "x.o"]
        proc = subprocess.run(command, cwd=tree, env=env, capture_output=True, text=True)
        assert (proc.returncode, proc.stderr) == (0, "")
        made = (tree / "x.o").read_bytes()
        assert made == recorded.read_bytes() != plain.read_bytes(), tree


CONFIGURE_AC = """\
AC_INIT([mini], [1.0])
AM_INIT_AUTOMAKE([foreign])
AC_PROG_CC
AC_PROG_CXX
LT_INIT
AC_CONFIG_FILES([Makefile])
AC_OUTPUT
"""
MAKEFILE_AM = """\
lib_LTLIBRARIES = libmini.la
libmini_la_SOURCES = hash.c strbuf.c inventory.cc
bin_PROGRAMS = prog
prog_SOURCES = main.c
prog_LDADD = libmini.la
"""
# What a libtool build's outputs are, and the units of the decisions that made each: its
# objects' (compiles), or at full LTO its library's and program's (their compiles' and link's).
LIB = ("files/hash.c", "files/strbuf.c", "files/inventory.cc")
LIBTOOL_OUTPUTS = {
    "per-file": {".libs/hash.o": LIB[:1], ".libs/strbuf.o": LIB[1:2],
                 ".libs/inventory.o": LIB[2:], "main.o": ("files/main.c",)},
    "full-lto": {".libs/libmini.so.0.0.0": (*LIB, "links/libmini.so.0.0.0"),
                 ".libs/prog": ("files/main.c", "links/prog")},
}  # fmt: skip


def _texts(tc: Toolchain, tree: Path, outputs: Iterable[str]) -> dict[str, bytes]:
    """The .text of each of a libtool build's OUTPUTS (an object's symbol table names its
    source as the build did, ../src/hash.c or hash.c)."""
    texts = {}
    for name in outputs:
        out = tree / f"{name}.text"
        only_text = [tc.tool("llvm-objcopy"), "-O", "binary", "--only-section=.text"]
        subprocess.run([*only_text, str(tree / name), str(out)], check=True)
        texts[name] = out.read_bytes()
    return texts


@pytest.mark.slow  # an autotools package build, twice
@pytest.mark.parametrize("kind", ["per-file", "full-lto"])
def test_a_libtool_library_builds_from_its_decisions_with_what_flags_prints(
    tc: Toolchain, tmp_path: Path, kind: str
):
    """libtool reads a `-Rpass=` in CFLAGS as a run path and refuses to link, so `mlgo flags
    --decisions` prints nothing for the compiles (the wrappers add DIR/flags themselves),
    and a link's replay as `-Wl,` words, which libtool passes on untouched: a real autotools
    and libtool library, recorded, rebuilds from its decisions both with CC=DIR/cc alone and
    with what `flags` prints in CFLAGS and LDFLAGS, into the same outputs: the recorded
    build's, but where a site the policy answered both ways was dropped."""
    src = tmp_path / "src"
    shutil.copytree(DATA / "minipkg", src)
    shutil.copy(DATA / "cxx" / "inventory.cc", src)
    (src / "configure.ac").write_text(CONFIGURE_AC)
    (src / "Makefile.am").write_text(MAKEFILE_AM)
    subprocess.run(["autoreconf", "-fi"], cwd=src, check=True, capture_output=True)
    policy = replace(load_policy(shipped_policy("inlining-size")), departure_threshold=None)
    out, outputs = tmp_path / "decisions", LIBTOOL_OUTPUTS[kind]
    cflags = "-Oz" + " -flto" * (kind == "full-lto")
    # one object a source (a source's decisions are one file, and libtool's static objects
    # are compiled with other flags than its shared ones), and lld for LTO
    configure = ["--disable-static", f"CFLAGS={cflags}", f"CXXFLAGS={cflags}"]
    configure += ["LDFLAGS=-fuse-ld=lld"]
    build = ["sh", "-c", f"./configure -q {shlex.join(configure)} && make -s"]
    record_build(policy, out, src, build, tc)
    artifact = decisions.read(out)
    assert sorted(artifact.files) == ["hash.c", "inventory.cc", "main.c", "strbuf.c"]
    units = {f"{k}/{n}": u for k in ("files", "links") for n, u in getattr(artifact, k).items()}
    recorded = _texts(tc, src, outputs)
    subprocess.run(["make", "-s", "distclean"], cwd=src, check=True)
    printed = run_mlgo("flags", "--decisions", str(out), "--", *cflags.split(), timeout=60)
    assert (printed.returncode, printed.stdout) == (0, ""), printed.stderr
    link = run_mlgo("flags", "--decisions", str(out), "--link", "--", "-o", "prog", timeout=60)
    assert link.returncode == (0 if kind == "full-lto" else 2), link.stderr
    assert all(w.startswith("-Wl,") and w.count(",") == 1 for w in link.stdout.split())
    wrappers = [f"CC={out}/cc", f"CXX={out}/c++"]
    builds = {"plain": [f"CC={tc.clang}", f"CXX={tc.clangxx}"], "wrappers": wrappers,
              "printed": [*wrappers, f"LDFLAGS=-fuse-ld=lld {link.stdout.strip()}"]}  # fmt: skip
    got, ran = {}, set()
    for name, compilers in builds.items():
        tree = tmp_path / name
        tree.mkdir()
        flags = [f"CFLAGS={cflags} {printed.stdout}", f"CXXFLAGS={cflags} {printed.stdout}"]
        subprocess.run(["../src/configure", "-q", *configure, *flags, *compilers], cwd=tree,
                       check=True, capture_output=True)  # fmt: skip
        made = subprocess.run(["make", "-s"], cwd=tree, capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        ran.add(subprocess.run(["./prog"], cwd=tree, input="a word, a word\n",
                               capture_output=True, text=True, check=True).stdout)  # fmt: skip
        got[name] = _texts(tc, tree, outputs)
    assert len(ran) == 1 and "words" in ran.pop()
    assert got["printed"] == got["wrappers"] != got["plain"]
    for output, made_by in outputs.items():
        if not any(units[unit]["conflicts"] for unit in made_by):
            assert got["wrappers"][output] == recorded[output], output
