"""The Ray backend on a real multi-node Ray cluster on loopback: a head that runs no tasks
and two one-core worker nodes, each its own raylet and object store."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from mlgo.corpus.format import load_corpus
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems import get_problem
from mlgo.problems.policy_files import load_policy
from mlgo.runtime.workers import Failed, LocalPool, make_workers
from mlgo.traces.collect import CollectTask, collect, collect_one
from mlgo.traces.format import Manifest
from mlgo.train import RunDir
from mlgo.train.es import ES, ESConfig
from tests.conftest import DATA, copy_corpus, run_mlgo

POLICY = Path(__file__).parents[1] / "policies" / "inlining-size"
INLINING = get_problem("inlining-size")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def cluster():
    from ray.cluster_utils import Cluster

    small = {"object_store_memory": 80 * 2**20}
    client_port = _free_port()
    c = Cluster(
        initialize_head=True,
        head_node_args={
            "num_cpus": 0,
            "include_dashboard": False,
            "ray_client_server_port": client_port,
            **small,
        },
    )
    try:
        for _ in range(2):
            c.add_node(num_cpus=1, **small)
        c.wait_for_nodes()
        c.client_address = f"ray://127.0.0.1:{client_port}"  # Ray Client, as a user connects
        yield c
    finally:
        c.shutdown()


@pytest.fixture(scope="module")
def local_traces(mini_corpus, tc, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("local-traces")
    with LocalPool(2) as pool:
        collect(INLINING, mini_corpus, out, tc, pool)
    return out


def _logging_clang(tmp_path: Path, real: str, sleep: float = 0.0) -> tuple[str, Path]:
    """A clang that appends 'PARENT SELF' to a log for every compile (not --version)."""
    log = tmp_path / "compiles.log"
    script = tmp_path / "clang"
    script.write_text(
        f'#!/bin/sh\n[ "$1" = --version ] || {{ echo "$PPID $$" >> {log}; sleep {sleep}; }}\n'
        f'exec {real} "$@"\n'
    )
    script.chmod(0o755)
    return str(script), log


def _worker_compiles(log: Path) -> list[tuple[int, int]]:
    """(worker pid, compiler pid) of every compile not started by this test's own process
    (the driver probes the toolchain once itself)."""
    lines = [tuple(map(int, ln.split())) for ln in log.read_text().splitlines()]
    return [(ppid, pid) for ppid, pid in lines if ppid != os.getpid()]


def test_workers_option_parses_in_one_place_and_ray_is_not_imported_for_local():
    code = (
        "import sys, mlgo.cli, mlgo.runtime.workers as w; "
        "assert isinstance(w.make_workers('3'), w.LocalPool); "
        "assert 'ray' not in sys.modules, 'ray imported'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)
    for bad in ("rays", "0", "ray:/x:1", "host:port"):
        with pytest.raises(ValueError, match="--workers"):
            make_workers(bad)
    for unreachable in (f"127.0.0.1:{_free_port()}", f"ray://127.0.0.1:{_free_port()}"):
        with pytest.raises(ValueError, match="cannot reach a Ray cluster at"):
            make_workers(unreachable)


_SILENT_HEAD = """
import json, threading
from concurrent import futures
import grpc
from ray.core.generated import ray_client_pb2, ray_client_pb2_grpc as rpc

class Driver(rpc.RayletDriverServicer):
    def ClusterInfo(self, request, context=None):  # the client's ping
        return ray_client_pb2.ClusterInfoResponse(json=json.dumps({}))

class Data(rpc.RayletDataStreamerServicer):
    def Datapath(self, requests, context):  # takes the init request, never answers it
        next(requests)
        threading.Event().wait()
        yield

server = grpc.server(futures.ThreadPoolExecutor(4))
rpc.add_RayletDriverServicer_to_server(Driver(), server)
rpc.add_RayletDataStreamerServicer_to_server(Data(), server)
print(server.add_insecure_port("127.0.0.1:0"), flush=True)
server.start()
server.wait_for_termination()
"""


def test_a_head_that_never_starts_the_client_session_is_a_clear_error():
    """What a head whose client server is stuck starting the per-client server looks like
    to mlgo: the connection is taken, the session never starts."""
    head = subprocess.Popen([sys.executable, "-c", _SILENT_HEAD], stdout=subprocess.PIPE, text=True)
    try:
        assert head.stdout is not None
        address = f"ray://127.0.0.1:{int(head.stdout.readline())}"
        code = (
            "from mlgo.runtime.ray_workers import RayWorkers; "
            f"RayWorkers({address!r}, session_timeout_s=3)"
        )
        start = time.monotonic()
        r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and time.monotonic() - start < 60
        last = r.stderr.strip().splitlines()[-1]
        assert last.startswith("TimeoutError: the Ray cluster at ray://"), r.stderr
        assert "started no session in 3 s" in last and "SIGTERM" not in r.stderr
    finally:
        head.kill()
        head.wait()


@dataclasses.dataclass(frozen=True)
class _Slow:
    timeout_s: float


def _hang(item: _Slow) -> None:
    time.sleep(120)


@pytest.mark.slow
def test_tasks_that_never_finish_stop_the_run_with_a_clear_error(cluster, monkeypatch):
    from mlgo.runtime import ray_workers  # imports ray: only in the tests that start it

    monkeypatch.setattr(ray_workers, "STALL_MARGIN_S", 2.0)
    start = time.monotonic()
    stalled = pytest.raises(TimeoutError, match=r"no Ray task finished in 3 s \(2 waiting")
    with make_workers(cluster.address) as workers, stalled:
        list(workers.imap(_hang, [_Slow(1.0), _Slow(1.0)]))
    assert time.monotonic() - start < 60


@pytest.mark.slow
def test_cli_collect_over_ray_client_gives_byte_identical_traces(
    cluster, mini_corpus, local_traces, tmp_path
):
    out = tmp_path / "ray-traces"
    r = run_mlgo(
        *("collect", "--problem", "inlining-size", "--corpus", str(mini_corpus.root)),
        *("--out", str(out), "--workers", cluster.client_address),
        timeout=300,
    )
    assert r.returncode == 0, r.stderr
    local, remote = Manifest.load(local_traces), Manifest.load(out)
    assert remote.specs == local.specs and not remote.failed
    assert set(remote.modules) == set(local.modules) == {m.name for m in mini_corpus.modules}
    for name, entry in local.modules.items():
        theirs = remote.modules[name]
        assert (theirs["decisions"], theirs["metrics"]) == (entry["decisions"], entry["metrics"])
        assert (out / theirs["file"]).read_bytes() == (local_traces / entry["file"]).read_bytes()


def test_bitcode_reaches_workers_through_the_object_store(cluster, mini_corpus, tc):
    tasks = [CollectTask(INLINING, m, tc.clang) for m in mini_corpus.modules]
    with make_workers(cluster.address) as workers:
        seen = dict(workers.imap(_where_is_my_bitcode, tasks))
    for task, (path, data) in seen.items():
        assert path != str(task.module.bitcode) and data == task.module.bitcode.read_bytes()


def _where_is_my_bitcode(task: CollectTask) -> tuple[str, bytes]:
    return str(task.module.bitcode), task.module.bitcode.read_bytes()


def test_worker_killed_mid_compile_is_retried_and_nothing_is_lost_or_doubled(
    cluster, mini_corpus, local_traces, tmp_path
):
    clang, log = _logging_clang(tmp_path, find_toolchain().clang, sleep=1.5)
    tasks = [CollectTask(INLINING, m, clang) for m in mini_corpus.modules]
    killed: list[tuple[int, int]] = []

    def kill_first_worker() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline and not killed:
            if log.exists() and (compiles := _worker_compiles(log)):
                worker, compiler = compiles[0]
                os.kill(worker, signal.SIGKILL)
                # The compiler dies with its worker (PR_SET_PDEATHSIG); make sure of it.
                with contextlib.suppress(ProcessLookupError):
                    os.kill(compiler, signal.SIGKILL)
                killed.append((worker, compiler))
            time.sleep(0.05)

    killer = threading.Thread(target=kill_first_worker)
    killer.start()
    with make_workers(cluster.address) as workers:
        results = list(workers.imap(collect_one, tasks))
    killer.join()
    assert killed, "no worker was killed"
    assert sorted(t.module.name for t, _ in results) == sorted(t.module.name for t in tasks)
    expected = Manifest.load(local_traces).modules
    for task, run in results:
        assert not isinstance(run, Failed), run
        assert run.num_decisions == expected[task.module.name]["decisions"]
        assert run.metrics == expected[task.module.name]["metrics"]
    compiles = _worker_compiles(log)
    assert len(compiles) == len(tasks) + 1  # the killed compile ran once more
    assert killed[0][0] not in {worker for worker, _ in compiles[1:]}


def test_failing_module_is_reported_once_and_skipped(cluster, mini_corpus, tmp_path):
    root = copy_corpus(mini_corpus, tmp_path / "c")
    (root / "minipkg" / "hash.o.bc").write_bytes(b"BC\xc0\xde garbage")
    clang, log = _logging_clang(tmp_path, find_toolchain().clang)
    with make_workers(cluster.address) as workers:
        manifest = collect(
            INLINING, load_corpus(root), tmp_path / "t", find_toolchain(clang), workers
        )
    assert set(manifest.failed) == {"minipkg/hash.o"}
    assert manifest.failed["minipkg/hash.o"].startswith("minipkg/hash.o: compiler exited with 1")
    assert len(manifest.modules) == 2
    assert len(_worker_compiles(log)) == 3  # every module compiled once, the bad one too


@pytest.mark.slow
def test_es_step_on_ray_moves_the_weights_as_the_local_pool_does(
    cluster, mini_corpus, tc, tmp_path
):
    policy = load_policy(POLICY)
    cfg = ESConfig(steps=1, directions=2, batch=2, eval_every=1, max_module_seconds=60)
    runs = {"local": RunDir(tmp_path / "local", "es"), "ray": RunDir(tmp_path / "ray", "es")}
    with LocalPool(2) as pool:
        ES(cfg).train(mini_corpus, policy.problem, policy, runs["local"], tc, pool)
    with make_workers(cluster.address) as workers:
        ES(cfg).train(mini_corpus, policy.problem, policy, runs["ray"], tc, workers)
    (local, local_arrays), (on_ray, ray_arrays) = (r.load_state() for r in runs.values())
    assert on_ray.step == 1 and on_ray.compiles == local.compiles
    assert on_ray.history == local.history
    assert not np.array_equal(ray_arrays["theta"], policy.flat())  # the step moved
    assert np.array_equal(ray_arrays["theta"], local_arrays["theta"])


@pytest.mark.slow
def test_ppo_rollouts_on_ray_are_the_local_rollouts(cluster, mini_corpus, tc):
    from dataclasses import replace

    from mlgo.train.ppo import RolloutTask, rollout_one

    policy = load_policy(POLICY)
    tasks = [
        RolloutTask(m, tc.clang, replace(policy, temperature=1.0, seed=i))
        for i, m in enumerate(mini_corpus.modules)
    ]
    with LocalPool(2) as pool:
        local = {t.module.name: r for t, r in pool.imap(rollout_one, tasks)}
    with make_workers(cluster.address) as workers:
        on_ray = {t.module.name: r for t, r in workers.imap(rollout_one, tasks)}
    assert set(on_ray) == set(local)
    for name, r in local.items():
        assert np.array_equal(on_ray[name]["actions"], r["actions"])
        assert np.array_equal(on_ray[name]["x"], r["x"]) and on_ray[name]["cost"] == r["cost"]


@pytest.mark.unit
def test_a_site_answered_alike_in_two_callers_is_recorded_alike_in_every_process():
    """Two instances of a template share a site's key: which caller its line names must not
    follow the process's string hashes, or the same search's decisions differ by machine."""
    lines = [
        "mlgo: 'g' inlined into 'f<int>' at callsite f:0:2;",
        "mlgo: 'g' inlined into 'f<long>' at callsite f:0:2;",
    ]
    code = (
        "import sys; from mlgo.ship.decisions import from_recorder; "
        "print(from_recorder(sys.stdin.read(), 'x')[0][0].caller)"
    )
    callers = {
        subprocess.run(
            [sys.executable, "-c", code], input="\n".join(order), capture_output=True,
            text=True, check=True, timeout=60, env={**os.environ, "PYTHONHASHSEED": str(seed)},
        ).stdout.strip()
        for seed in range(6)
        for order in (lines, lines[::-1])
    }  # fmt: skip
    assert callers == {"f<int>"}


def _tuned_decisions(out: Path) -> dict:
    """What a tune in OUT decided: every kept decisions file's replay lines, each unit's
    .text sizes in the summary, and the training's compiles and curve (its steps' rewards)."""
    decisions = out / "decisions"
    summary = json.loads((decisions / "summary.json").read_text())
    state = json.loads((out / "train" / "state.json").read_text())
    return {
        "inl": {
            str(p.relative_to(decisions)): p.read_text() for p in sorted(decisions.rglob("*.inl"))
        },
        "sizes": {n: u.get("text") for k in ("files", "links") for n, u in summary[k].items()},
        "compiles": state["compiles"],
        "curve": state["history"],
    }


@pytest.mark.slow
def test_a_tune_on_ray_decides_what_the_same_tune_decides_locally(cluster, tmp_path, monkeypatch):
    """A tiny real tune (the wordcount program and a C++ object, one BC-Max step with a
    budget that no clock cuts short) run on this machine's pool and with --workers on the
    cluster: the collection and the searches ran on its two nodes, and the decisions kept,
    their sizes and the training's compiles are the same."""
    monkeypatch.setenv("MLGO_CACHE", str(tmp_path / "cache"))
    src = shutil.copytree(DATA / "minipkg", tmp_path / "wordcount")
    shutil.copy(DATA / "cxx" / "inventory.cc", src)
    build = 'for f in *.c; do "$CC" -c "$f" || exit 1; done && "$CXX" -c inventory.cc && '
    build += '"$CC" -o wc hash.o main.o strbuf.o'
    tuned = {}
    for name, workers in (("local", "local"), ("ray", cluster.address)):
        out = tmp_path / name
        r = run_mlgo(
            "tune", "--source", str(src), "--build", build,
            "--test", "echo 'a b a' | ./wc | grep -qx 'words: 3 distinct: 2'",
            "--minutes", "100", "--train-steps", "1", "--workers", workers,
            "--out", str(out), timeout=900,
        )  # fmt: skip
        assert r.returncode == 0, r.stderr + r.stdout
        tuned[name] = _tuned_decisions(out)
    local, on_ray = tuned["local"], tuned["ray"]
    assert local["inl"], "the search kept no decisions: nothing compared"
    assert on_ray == local
