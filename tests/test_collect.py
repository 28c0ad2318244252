"""`mlgo collect` on a real corpus: traces, failures, and resuming after kill -9."""

import os
import signal
import subprocess
import time
from pathlib import Path

import numpy as np
import pytest

from mlgo.llvm.log_format import TensorSpec
from mlgo.runtime.workers import LocalPool
from mlgo.traces.collect import collect
from mlgo.traces.format import DEFAULT_DECISION, Manifest, read_module_trace
from tests.conftest import MLGO, copy_corpus, run_mlgo


@pytest.fixture(scope="module")
def traces(mini_corpus, tc, tmp_path_factory):
    out = tmp_path_factory.mktemp("traces")
    collect("inlining-size", mini_corpus, out, tc, LocalPool(2))
    return out


def test_manifest_and_traces_record_every_decision(traces, mini_corpus):
    manifest = Manifest.load(traces)
    assert set(manifest.modules) == {m.name for m in mini_corpus.modules}
    assert not manifest.failed
    specs = [TensorSpec.from_json(s) for s in manifest.specs]
    total = 0
    for entry in manifest.modules.values():
        assert entry["metrics"]["text_size"] > 0
        cols = read_module_trace(traces / entry["file"], specs, "inlining_decision")
        n = entry["decisions"]
        total += n
        assert len(cols["inlining_decision"]) == n and cols["callee_users"].shape == (n, 1)
        # Collection walks the default trajectory: the answer is the default.
        assert np.array_equal(cols["inlining_decision"], cols[DEFAULT_DECISION])
        assert np.array_equal(cols["inlining_default"].reshape(-1), cols[DEFAULT_DECISION])
    assert total > 10


def test_corrupt_bitcode_skips_that_module_only(mini_corpus, tc, tmp_path):
    root = copy_corpus(mini_corpus, tmp_path / "c")
    (root / "minipkg" / "hash.o.bc").write_bytes(b"BC\xc0\xde garbage")
    from mlgo.corpus.format import load_corpus

    manifest = collect("inlining-size", load_corpus(root), tmp_path / "t", tc, LocalPool(2))
    assert set(manifest.failed) == {"minipkg/hash.o"}
    msg = manifest.failed["minipkg/hash.o"]
    assert msg.startswith("minipkg/hash.o: compiler exited with 1") and "\n" not in msg
    assert len(manifest.modules) == 2


def test_regalloc_collection_records_costs(mini_corpus_o2, tc, tmp_path):
    manifest = collect("regalloc-eviction", mini_corpus_o2, tmp_path / "ra", tc, LocalPool(2))
    assert not manifest.failed
    for entry in manifest.modules.values():
        assert {"spill_reload_cost", "text_size"} <= set(entry["metrics"])


@pytest.mark.slow
def test_killed_collection_resumes_with_nothing_torn(mini_corpus, tc, tmp_path):
    slow_clang = tmp_path / "slow-clang"
    slow_clang.write_text(f'#!/bin/sh\n[ "$1" = --version ] || sleep 1.5\nexec {tc.clang} "$@"\n')
    slow_clang.chmod(0o755)
    out = tmp_path / "t"
    args = [
        "collect",
        "--problem",
        "inlining-size",
        "--corpus",
        str(mini_corpus.root),
        "--out",
        str(out),
        "--workers",
        "1",
        "--clang",
        str(slow_clang),
    ]
    proc = subprocess.Popen([*MLGO, *args], stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    deadline = time.monotonic() + 120
    while not list(out.glob("modules/minipkg/*.tfrecord")) and time.monotonic() < deadline:
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert 1 <= len(list(out.glob("modules/minipkg/*.tfrecord"))) < 3
    # The kill may fall between a trace and the manifest that lists it: such a trace is
    # redone, so what the rerun resumes from is what the manifest recorded.
    recorded = Manifest.load(out).modules if (out / "manifest.json").exists() else {}
    rerun = run_mlgo(*args, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert ("resuming" in rerun.stderr) == bool(recorded)
    manifest = Manifest.load(out)
    assert len(manifest.modules) == 3 and not manifest.failed
    assert not list(out.rglob("*.tmp"))


def test_cli_refuses_a_corpus_recorded_at_another_level(mini_corpus, tmp_path):
    r = run_mlgo(
        "collect",
        "--problem",
        "regalloc-eviction",
        "--corpus",
        str(mini_corpus.root),
        "--out",
        str(tmp_path / "t"),
        timeout=120,
    )
    assert r.returncode == 2 and len(r.stderr.strip().splitlines()) == 1
    assert "recorded at -Oz, needed at -O2; build it with `mlgo corpus build --opt-level -O2`" in (
        r.stderr
    )
    assert not (tmp_path / "t").exists()


def test_cli_collect_rejects_unknown_problem(mini_corpus, tmp_path):
    r = run_mlgo(
        "collect",
        "--problem",
        "nope",
        "--corpus",
        str(mini_corpus.root),
        "--out",
        str(tmp_path / "t"),
        timeout=120,
    )
    assert r.returncode == 2
    assert "unknown problem 'nope'" in r.stderr and len(r.stderr.strip().splitlines()) == 1


def test_traces_of_another_problem_are_not_mixed(traces, mini_corpus, tc):
    from mlgo.traces.format import TraceError

    with pytest.raises(TraceError, match="holds inlining-size traces"):
        collect("regalloc-eviction", mini_corpus, Path(traces), tc, LocalPool(1))
