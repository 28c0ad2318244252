"""Learned inlining in the link of an LTO build: mlgo-cc driving a link with -flto (or
-flto=thin) and lld brings the link-time policy of that kind into lld's LTO backends;
per-file compiles get only per-file policies and links only link-time ones. Real clang, real
lld, a real service, both wrappers."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from mlgo.corpus.record import record
from mlgo.llvm.driver import link_output, link_stage, links_with_lld
from mlgo.llvm.sizes import text_size
from mlgo.problems import get_problem
from mlgo.problems.policy_files import load_policy
from mlgo.serve.client import ServiceError
from mlgo.serve.guard import guarded_link
from mlgo.serve.lease import at_link
from tests import test_service
from tests.conftest import MLGO, run_mlgo
from tests.test_guard import counting_clang, save_inline_all
from tests.test_service import SHIPPED, Service

cc = test_service.cc  # both wrappers
native_cc = test_service.native_cc
native_wrappers = test_service.native_wrappers

# Two files: what the link may inline across them, per file it cannot.
CALLEE = """\
int mix(int a, int b, int c, int d) {
  int x = a * 31 + b;
  for (int i = 0; i < d; i++) { x ^= x >> 7; x += c * i; x ^= x << 3; }
  return x * 17 + (a > b);
}
"""
CALLERS = """\
int mix(int a, int b, int c, int d);
int f(int a, int b) { return mix(a, b, 3, 4) + mix(b, a, 5, 6); }
int g(int a, int b) { return mix(b, b, a, 7) - mix(a, 1, 2, b); }
int main(int argc, char **argv) { return f(argc, 2) + g(3, argc) + mix(argc, 1, 1, 1); }
"""
LTO = ["-Oz", "-flto"]
LLD = [*LTO, "-fuse-ld=lld"]


@pytest.mark.unit
def test_a_full_lto_link_is_told_from_compiles_and_thin_links():
    assert link_stage(["-Oz", "-flto", "a.o", "b.o", "-o", "p"]) == "link"
    assert link_stage(["-flto=full", "a.o"]) == "link"
    assert link_stage(["-flto", "-flto=thin", "a.o"]) == "thin-link"  # the last one counts
    assert link_stage(["-flto", "-fno-lto", "a.o"]) is None
    assert link_stage(["-flto", "-c", "a.c"]) is None
    assert link_stage(["-flto", "a.c", "-o", "p"]) is None  # compiles first: a compile's lease
    assert link_stage(["-flto=thin", "-E", "a.o"]) is None
    assert links_with_lld(["-fuse-ld=lld"]) and links_with_lld(["--ld-path=/opt/ld.lld"])
    assert not links_with_lld(["-fuse-ld=lld", "-fuse-ld=bfd"]) and not links_with_lld([])
    assert link_output(["a.o", "-o", "prog"]) == "prog" and link_output(["-oprog2"]) == "prog2"
    assert link_output(["a.o"]) == "a.out"
    # -Xlinker splits no commas, unlike -Wl: a plugin path with one stays whole.
    assert at_link(["-fpass-plugin=/c,d/p.so"]) == ["-Xlinker", "--load-pass-plugin=/c,d/p.so"]
    with pytest.raises(ServiceError, match="lld cannot take"):
        at_link(["-mllvm", "-enable-ml-inliner=release"])
    # the guard links again only what writes its program alone
    assert guarded_link(["-flto", "a.o", "-o", "p", "-Wl,--gc-sections"]) == Path("p")
    for writes_more in (
        ["-Wl,-Map=p.map"], ["-Wl,--as-needed,-Map,p.map"], ["-Xlinker", "--save-temps"],
        ["-save-temps"], ["-Wl,--thinlto-cache-dir=c"], ["-o", "-"],
    ):  # fmt: skip
        assert guarded_link(["-flto", "a.o", *writes_more]) is None, writes_more


@pytest.fixture(scope="module")
def link_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A link-time policy that always says "inline": its links differ visibly from lld's.
    Calibrated for C compiles as the shipped one is: a link has no one language, and is
    served all the same."""
    out = tmp_path_factory.mktemp("link-inline-all") / "policy"
    save_inline_all(out, problem=get_problem("inlining-size-link"))
    assert load_policy(out).languages == ("c",)
    return out


@pytest.fixture(scope="module")
def both(link_policy: Path, tmp_path_factory: pytest.TempPathFactory):
    """The shipped per-file policy and the link-time one, served together (by their plugins,
    mlgo's default)."""
    service = Service(
        tmp_path_factory.mktemp("link"),
        *("--policy", str(SHIPPED), "--policy", str(link_policy)),
    )
    yield service
    service.stop()


def run(cmd: list[str], cwd: Path, env: dict[str, str] | None = None):
    r = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    return r


def objects(compiler: list[str], tmp: Path, env: dict[str, str] | None = None) -> None:
    (tmp / "callee.c").write_text(CALLEE)
    (tmp / "callers.c").write_text(CALLERS)
    for name in ("callee", "callers"):
        run([*compiler, *LTO, "-c", f"{name}.c", "-o", f"{name}.o"], tmp, env)


def test_the_link_time_policy_decides_in_lld_and_only_there(cc, both, tc, tmp_path):
    """Compiles with -flto are the per-file policy's (bitcode equal to the same compile
    served alone); the link is the link-time policy's (here: inline everything, a larger
    program than lld's own), counted as a served link."""
    plain, served = tmp_path / "plain", tmp_path / "served"
    plain.mkdir(), served.mkdir()
    objects([tc.clang], plain)
    run([tc.clang, *LLD, "callee.o", "callers.o", "-o", "prog"], plain)
    objects(cc, served, both.env())
    before = both.status()["links"].get("-Oz", {"served": 0})["served"]
    r = run([*cc, *LLD, "callee.o", "callers.o", "-o", "prog"], served, both.env())
    assert not r.stderr, r.stderr
    assert text_size(served / "prog") > text_size(plain / "prog")
    assert both.status()["links"]["-Oz"]["served"] == before + 1
    assert (
        subprocess.run([served / "prog"]).returncode == subprocess.run([plain / "prog"]).returncode
    )


def test_a_guarded_link_keeps_the_smaller_program(cc, both, tc, tmp_path):
    """MLGO_GUARD=size at a link: the policy's larger program gives way to lld's own, byte
    for byte, and nothing is left beside it; a link that also writes a map keeps the
    policy's program (a second link would write the map again)."""
    objects([tc.clang], tmp_path)
    run([tc.clang, *LLD, "callee.o", "callers.o", "-o", "plain"], tmp_path)
    env = {**both.env(), "MLGO_GUARD": "size"}
    r = run([*cc, *LLD, "callee.o", "callers.o", "-o", "prog"], tmp_path, env)
    assert not r.stderr, r.stderr
    assert (tmp_path / "prog").read_bytes() == (tmp_path / "plain").read_bytes()
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "callee.c", "callee.o", "callers.c", "callers.o", "plain", "prog",
    ]  # fmt: skip
    mapped = [*LLD, "callee.o", "callers.o", "-o", "mapped", "-Wl,-Map=mapped.map"]
    run([*cc, *mapped], tmp_path, env)
    assert text_size(tmp_path / "mapped") > text_size(tmp_path / "plain")
    assert (tmp_path / "mapped.map").is_file()


def test_a_guarded_link_of_unchanged_objects_links_once(cc, both, tc, tmp_path):
    """The guard's memory at a link: linked twice the first time (the policy's and lld's
    own, the smaller kept), once when linked again from the same objects, the winner alone,
    into the same program; an object compiled anew from an edited source links twice again."""
    objects([tc.clang], tmp_path)
    counting, log = counting_clang(tc, tmp_path)
    env = {**both.env(), "MLGO_GUARD": "size", "MLGO_CC": str(counting)}

    def links() -> int:
        before = len(log.read_text().split()) if log.exists() else 0
        (tmp_path / "prog").unlink(missing_ok=True)
        r = run([*cc, *LLD, "callee.o", "callers.o", "-o", "prog"], tmp_path, env)
        assert not r.stderr, r.stderr
        return len(log.read_text().split()) - before

    assert links() == 2
    first = (tmp_path / "prog").read_bytes()
    assert links() == 1
    assert (tmp_path / "prog").read_bytes() == first
    (tmp_path / "callee.c").write_text(CALLEE.replace("31", "37"))
    run([tc.clang, *LTO, "-c", "callee.c", "-o", "callee.o"], tmp_path)
    assert links() == 2
    assert links() == 1


def test_a_policy_shipped_guarded_is_served_guarded(cc, tc, tmp_path):
    """A link-time policy whose file asks for the size guard gets it without MLGO_GUARD:
    its larger program gives way to lld's own."""
    policy = save_inline_all(
        tmp_path / "guarded", problem=get_problem("inlining-size-link"), guard="size"
    )
    assert "served guarded" in load_policy(policy).describe()
    (tmp_path / "service").mkdir()
    service = Service(tmp_path / "service", "--policy", str(SHIPPED), "--policy", str(policy))
    try:
        objects([tc.clang], tmp_path)
        run([tc.clang, *LLD, "callee.o", "callers.o", "-o", "plain"], tmp_path)
        r = run([*cc, *LLD, "callee.o", "callers.o", "-o", "prog"], tmp_path, service.env())
        assert not r.stderr, r.stderr
        assert (tmp_path / "prog").read_bytes() == (tmp_path / "plain").read_bytes()
        status = service.status()  # one link, counted once, whichever wrapper guarded it
        assert status["links"]["-Oz"]["served"] == 1 and status["compilations"] == 1
        # flags by hand cannot guard: they say so
        by_hand = run([*MLGO, "flags", "--link", "--", *LTO], tmp_path, service.env())
        assert by_hand.stdout and "only mlgo-cc gives it" in by_hand.stderr, by_hand.stderr
    finally:
        service.stop()


def test_without_lld_the_link_is_plain_with_a_note(cc, both, tc, tmp_path):
    """GNU ld's LLVM gold plugin loads no pass plugin: one note, and the default linker's
    own program, byte for byte."""
    objects([tc.clang], tmp_path)
    run([tc.clang, *LTO, "callee.o", "callers.o", "-o", "plain"], tmp_path)
    r = run([*cc, *LTO, "callee.o", "callers.o", "-o", "prog"], tmp_path, both.env())
    assert r.stderr == (
        "mlgo-cc: note: a link-time policy needs lld (-fuse-ld=lld); "
        "linking prog with clang's default\n"
    )
    assert (tmp_path / "prog").read_bytes() == (tmp_path / "plain").read_bytes()


@pytest.mark.parametrize(
    ("policy", "why"),
    [
        ("per-file", "no served policy is trained for the link step"),
        ("channel", "inlining-size-link is served on a channel, which lld's LTO does not "
         "open (serve its plugin)"),
    ],
)  # fmt: skip
def test_a_link_no_plugin_answers_is_lld_s_own(cc, link_policy, policy, why, tc, tmp_path):
    """The shipped policy was trained per file, and lld's LTO inliner opens no channel: in
    both cases the link is lld's own, byte for byte, with a note saying why."""
    args = ["--policy", str(SHIPPED)] if policy == "per-file" else ["--policy", str(link_policy)]
    args += ["--backend", "python"] if policy == "channel" else []
    service = Service(tmp_path, *args)
    try:
        objects([tc.clang], tmp_path)
        run([tc.clang, *LLD, "callee.o", "callers.o", "-o", "plain"], tmp_path)
        r = run([*cc, *LLD, "callee.o", "callers.o", "-o", "prog"], tmp_path, service.env())
        assert r.stderr.startswith("mlgo-cc: note: -Oz links are"), r.stderr
        assert why in r.stderr and r.stderr.endswith(" (first: prog)\n"), r.stderr
        assert (tmp_path / "prog").read_bytes() == (tmp_path / "plain").read_bytes()
        assert service.status()["links"] == {"-Oz": {"served": 0, "default": 1}}
    finally:
        service.stop()


def test_mlgo_flags_link_prints_what_to_add_to_a_link_line(both, link_policy, tc, tmp_path):
    """By hand: `mlgo flags --link -- -Oz -flto` gives the linker's spelling, and a link with
    it is the served one."""
    cmd = [*MLGO, "flags", "--link", "--socket", str(both.socket), "--", *LTO]
    flags = run(cmd, tmp_path).stdout.split()
    assert flags and all(f == "-Xlinker" for f in flags[0::2]), flags
    objects([tc.clang], tmp_path)
    for name, extra in (("plain", []), ("served", flags)):
        run([tc.clang, *LLD, "callee.o", "callers.o", "-o", name, *extra], tmp_path)
    assert text_size(tmp_path / "served") > text_size(tmp_path / "plain")
    thin = run(
        [*MLGO, "flags", "--link", "--socket", str(both.socket), "--", "-Oz", "-flto=thin"],
        tmp_path,
    )
    assert thin.stdout == "" and "trained for the thin-link step" in thin.stderr, thin.stderr
    plain = subprocess.run(
        [*MLGO, "flags", "--link", "--socket", str(both.socket), "--", "-Oz"],
        capture_output=True,
        text=True,
    )
    assert plain.returncode != 0 and "a link with -flto, not: -Oz" in plain.stderr, plain.stderr


# Eight files that call across each other: a ThinLTO link runs a backend for each, side by
# side on lld's threads.
THIN_FILES = {
    f"part{i}.c": f"int mix(int, int, int, int);\nint part{(i + 1) % 8}(int);\n"
    f"int part{i}(int a) {{\n"
    f"  return mix(a, {i}, a + {i}, 3) + (a > {i} ? part{(i + 1) % 8}(a - 1) : 0);\n}}\n"
    for i in range(8)
} | {
    "callee.c": CALLEE,
    "main.c": "int part0(int);\nint main(int argc, char **argv) { return part0(argc) & 1; }\n",
}
THIN = ["-Oz", "-flto=thin"]


def thin_objects(compiler: list[str], tmp: Path, env: dict[str, str] | None = None) -> list[str]:
    for name, text in THIN_FILES.items():
        (tmp / name).write_text(text)
        run([*compiler, *THIN, "-c", name, "-o", name[:-2] + ".o"], tmp, env)
    return sorted(name[:-2] + ".o" for name in THIN_FILES)


@pytest.fixture(scope="module")
def thin_policy(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("thin-inline-all") / "policy"
    return save_inline_all(out, problem=get_problem("inlining-size-thin"))


def test_a_thin_link_is_answered_by_a_thin_link_policy_in_every_backend(
    cc, both, thin_policy, tc, tmp_path
):
    """A ThinLTO link is neither a compile nor a full-LTO link: the per-file and full-LTO
    policies leave it to lld (byte for byte, with a note); a ThinLTO one answers in each of
    its backends, which run side by side (each on its own thread's pass manager: sharing
    one crashed the link), counted as a served ThinLTO link."""
    objs = thin_objects([tc.clang], tmp_path)
    run([tc.clang, *THIN, "-fuse-ld=lld", *objs, "-o", "plain"], tmp_path)
    left = both.status()["thin_links"].get("-Oz", {"default": 0})["default"]
    r = run([*cc, *THIN, "-fuse-ld=lld", *objs, "-o", "prog"], tmp_path, both.env())
    note = "no served policy is trained for the thin-link step"  # said once per service
    assert r.stderr == "" or note in r.stderr, r.stderr
    assert both.status()["thin_links"]["-Oz"] == {"served": 0, "default": left + 1}
    assert (tmp_path / "prog").read_bytes() == (tmp_path / "plain").read_bytes()
    (tmp_path / "svc").mkdir()
    service = Service(tmp_path / "svc", "--policy", str(SHIPPED), "--policy", str(thin_policy))
    try:
        for _ in range(3):  # the crash was a race between backends
            r = run([*cc, *THIN, "-fuse-ld=lld", *objs, "-o", "prog"], tmp_path, service.env())
            assert not r.stderr, r.stderr
            assert text_size(tmp_path / "prog") > text_size(tmp_path / "plain")
        assert service.status()["thin_links"] == {"-Oz": {"served": 3, "default": 0}}
        assert service.status()["links"] == {}
    finally:
        service.stop()
    assert (
        subprocess.run([tmp_path / "prog"]).returncode
        == subprocess.run([tmp_path / "plain"]).returncode
    )


@pytest.mark.slow
def test_mlgo_build_lto_full_links_a_debian_program_with_the_link_policy(link_policy, tmp_path):
    """`mlgo build --lto full`: a real package built twice with -Oz -flto by lld, its own
    tests passing on both, the link-time policy answering in the mlgo build's links."""
    out = tmp_path / "programs"
    args = ["build", "lua", "--lto", "full", "--policy", str(link_policy), "--bench-rounds", "0"]
    r = run_mlgo(*args, "--out", str(out), timeout=900)
    assert r.returncode == 0, r.stderr + r.stdout
    report = json.loads((out / "lua" / "report.json").read_text())
    assert report["flags"] == "-Oz -flto=full -fuse-ld=lld"
    assert report["tests"] == {"baseline": "passed", "policy": "passed"}
    for program, sizes in report["size"]["programs"].items():  # inlining everything grows it
        assert sizes["policy"] > sizes["baseline"], program


def test_mlgo_eval_judges_a_link_corpus_as_lld_links_it(link_policy, tc, tmp_path):
    """`mlgo eval` on a corpus of the link stage: beside the corpus's compiles, each program
    as lld's LTO makes it with the policy's plugin (here: inline everything, larger)."""
    (tmp_path / "callee.c").write_text(CALLEE)
    (tmp_path / "callers.c").write_text(CALLERS)
    build = '"$CC" -c callee.c callers.c && "$CC" -o prog callee.o callers.o'
    corpus = tmp_path / "corpus"
    record(["sh", "-c", build], corpus, tc, source_dir=tmp_path, package="p", stage="link")
    out = tmp_path / "eval"
    args = ["eval", "--policy", str(link_policy), "--corpus", str(corpus), "--out", str(out)]
    r = run_mlgo(*args, timeout=300)
    assert r.returncode == 0, r.stderr
    assert "linked by lld's LTO" in r.stdout
    linked = json.loads((out / "linked" / "eval.json").read_text())
    assert list(linked["modules"]) == ["p/prog"] and linked["totals"]["delta"] > 0
