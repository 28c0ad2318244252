"""The interactive channel against real clang-22: faithful replay, and no hang on failure."""

import time
from pathlib import Path

import numpy as np
import pytest

from mlgo.llvm.channel import ChannelError, compile_interactive, last_line
from mlgo.problems import get_problem
from tests.conftest import DATA

INLINING = get_problem("inlining-size")
SRC = DATA / "minipkg" / "strbuf.c"


def _cmd(tc, out: Path, src: Path = SRC) -> list[str]:
    return [tc.clang, "-Oz", "-c", str(src), "-o", str(out)]


def _run(tc, tmp_path, policy, **kw):
    return compile_interactive(
        _cmd(tc, tmp_path / "o.o"), policy, INLINING.channel_flags, validate=INLINING.validate, **kw
    )


def test_default_replay_is_byte_identical_to_plain_clang(tc, tmp_path):
    import subprocess

    result = _run(tc, tmp_path, INLINING.default_advice)
    assert len(result.decisions) >= 5
    names = {s.name for s in result.header.features}
    assert set(INLINING.feature_names) <= names and "inlining_default" in names
    subprocess.run(_cmd(tc, tmp_path / "plain.o"), check=True)
    assert (tmp_path / "o.o").read_bytes() == (tmp_path / "plain.o").read_bytes()


def test_policy_changes_the_code(tc, tmp_path):
    _run(tc, tmp_path, lambda obs: 1)
    always = (tmp_path / "o.o").read_bytes()
    _run(tc, tmp_path, lambda obs: 0)
    assert (tmp_path / "o.o").read_bytes() != always


def test_policy_exception_kills_compiler_with_one_line_error(tc, tmp_path):
    def broken(obs):
        raise RuntimeError("model file missing")

    with pytest.raises(ChannelError, match="policy failed on decision 0: RuntimeError"):
        _run(tc, tmp_path, broken)


@pytest.mark.parametrize(
    ("answer", "message"),
    [
        (2, "illegal advice.*0 or 1"),
        (np.zeros(0), "answered 0 values"),
        (np.ones(3), "answered 3 values"),
    ],
)
def test_bad_advice_never_reaches_the_compiler(tc, tmp_path, answer, message):
    with pytest.raises(ChannelError, match=message):
        _run(tc, tmp_path, lambda obs: answer)


def test_compiler_killed_mid_protocol_is_reported(tc, tmp_path):
    # The compiler is killed while it waits for the (slow) first answer.
    killer = ["sh", "-c", '"$@" & pid=$!; sleep 1; kill -9 $pid; wait $pid', "sh"]

    def slow(obs):
        time.sleep(2)
        return 0

    start = time.monotonic()
    with pytest.raises(ChannelError, match="compiler exited with 137"):
        compile_interactive(killer + _cmd(tc, tmp_path / "o.o"), slow, INLINING.channel_flags)
    assert time.monotonic() - start < 30


def test_corrupt_bitcode_fails_fast_with_clangs_error(tc, tmp_path):
    bad = tmp_path / "bad.bc"
    bad.write_bytes(b"BC\xc0\xde" + b"\x00" * 64)
    cmd = [tc.clang, "-Oz", "-c", "-x", "ir", str(bad), "-o", str(tmp_path / "o.o")]
    with pytest.raises(ChannelError, match="compiler exited with 1: .*error"):
        compile_interactive(cmd, INLINING.default_advice, INLINING.channel_flags)


def test_a_compiler_that_never_answers_times_out(tmp_path):
    start = time.monotonic()
    with pytest.raises(ChannelError, match="did not open the channel within 1 s"):
        compile_interactive(["sleep", "30"], INLINING.default_advice, lambda base: [], timeout_s=1)
    assert time.monotonic() - start < 10


def test_regalloc_channel_under_register_pressure(tc, tmp_path):
    src = tmp_path / "pressure.c"
    terms = " ".join(f"s{i} += a[i] * s{(i + 1) % 24} + b[i];" for i in range(24))
    decls = ",".join(f"s{i} = {i}" for i in range(24))
    sums = "+".join(f"s{i}" for i in range(24))
    src.write_text(
        f"double f(double *a, double *b, int n) {{ double {decls};"
        f" for (int i = 0; i < n; i++) {{ {terms} }} return {sums}; }}\n"
    )
    problem = get_problem("regalloc-eviction")
    result = compile_interactive(
        [tc.clang, "-O2", "-c", str(src), "-o", str(tmp_path / "o.o")],
        problem.default_advice,
        problem.channel_flags,
        validate=problem.validate,
    )
    assert result.decisions, "register pressure should force eviction decisions"
    for d in result.decisions:
        assert d.observation.features["mask"].reshape(-1)[int(d.advice[0])] == 1
        assert d.observation.context == "f"


# clang-22's own crash dump (loop vectorizer, optimization records on), shortened
CRASH_DUMP = """PLEASE submit a bug report to https://github.com/llvm/llvm-project/issues/
Stack dump:
0.\tProgram arguments: clang-22 -cc1 -O2 -ferror-limit 19 -opt-record-file r.yaml -x ir m.bc
1.\tRunning pass "function<eager-inv>(float2int,loop-vectorize<>,slp-vectorizer)" on module "m.bc"
2.\tRunning pass "loop-vectorize<no-interleave-forced-only;>" on function "match_at"
 #0 0x00007f1199ab8786 llvm::sys::PrintStackTrace(llvm::raw_ostream&, int) (/lib/libLLVM.so.22.1)
 #1 0x00007f1199ab5fd3 llvm::sys::RunSignalHandlers() (/lib/libLLVM.so.22.1+0x4eb5fd3)
 #2 0x00007f1199ab94f4 (/lib/libLLVM.so.22.1+0x4eb94f4)
 #3 0x00007f1194a5a050 (/lib/x86_64-linux-gnu/libc.so.6+0x3c050)
 #4 0x00007f119b2fafe9 llvm::RecurrenceDescriptor::AddReductionVar(llvm::PHINode*) (/lib/x)
 #5 0x00007f119b2fdda6 llvm::RecurrenceDescriptor::isReductionPHI(llvm::PHINode*) (/lib/x)
"""


@pytest.mark.parametrize(
    ("stderr", "line"),
    [
        (
            CRASH_DUMP,
            "crashed in llvm::RecurrenceDescriptor::AddReductionVar"
            " (pass loop-vectorize on match_at)",
        ),
        ("x.c:3:1: error: expected ';'\n1 error generated.", "x.c:3:1: error: expected ';'"),
        (
            "LLVM ERROR: Cannot select: intrinsic\n#0 0x1 llvm::sys::X() (/l)",
            "LLVM ERROR: Cannot select: intrinsic",
        ),
        ("", "(no stderr)"),
    ],
)
@pytest.mark.unit
def test_a_compilers_failure_is_told_in_the_line_that_says_what_went_wrong(stderr, line):
    assert last_line(stderr) == line
