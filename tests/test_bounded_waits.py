"""Every wait on the build path is bounded: a service that is busy, stopped or flooded costs a
compile at most MLGO_TIMEOUT and one warning, is never mistaken for an absent one (whose
socket a new service may replace), and a client's request cannot cost the service its
memory, a thread for good, or a lease that never ends."""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlgo.serve.server import MAX_IDLE_THREADS, MAX_REQUEST_BYTES, MAX_TTL_S
from tests import test_service
from tests.conftest import SHIPPED
from tests.test_service import SOURCES, Service, mlgo_cc

cc = test_service.cc  # both wrappers, as the service's own tests run them
native_cc = test_service.native_cc
native_wrappers = test_service.native_wrappers


@contextlib.contextmanager
def listening(path: Path, full: bool) -> Iterator[socket.socket]:
    """A socket listening at PATH on which no one accepts, as a stopped service's is; FULL:
    its backlog filled, as a service flooded by a build's compiles is."""
    path.parent.mkdir(mode=0o700, exist_ok=True)
    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(path))
    server.listen(0 if full else 16)
    queued = []
    while full:
        client = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        client.setblocking(False)
        queued.append(client)
        try:
            client.connect(str(path))
        except BlockingIOError:
            break
    try:
        yield server
    finally:
        for client in queued:
            client.close()
        server.close()


@pytest.mark.parametrize("full", [True, False], ids=["backlog-full", "stopped"])
def test_a_service_that_does_not_answer_costs_mlgo_timeout_and_one_warning(cc, full, tmp_path):
    """Before: the native wrapper blocked in connect() for good on a full backlog, and took
    20 s (10 s each wrapper) on a stopped service; the Python one took the full backlog for
    no service and started one, which removed the live service's socket."""
    sock = tmp_path / "mlgo" / "mlgo.sock"
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path), MLGO_TIMEOUT="2")
    env.pop("MLGO_SOCKET", None)  # a wrapper may start a service here: it must not
    with listening(sock, full):
        before = sock.stat().st_ino
        began = time.monotonic()
        r = mlgo_cc(cc, SOURCES[0], tmp_path / "a.o", env, timeout=60)
        took = time.monotonic() - began
        assert r.returncode == 0 and (tmp_path / "a.o").exists(), r.stderr
        assert r.stderr.count("\n") == 1, r.stderr
        assert f"the mlgo service at {sock} did not answer within 2 s" in r.stderr
        assert "default heuristic" in r.stderr
        assert took < 8, f"{took:.1f} s"
        assert sock.stat().st_ino == before
        assert not (tmp_path / "mlgo" / "service.log").exists()
        r = mlgo_cc(cc, SOURCES[0], tmp_path / "b.o", dict(env, MLGO_STRICT="1"), timeout=60)
        assert r.returncode == 1 and "mlgo-cc: error: the mlgo service at" in r.stderr


def test_a_starting_service_leaves_a_busy_services_socket_alone(tmp_path):
    """Only a socket whose connect is refused is stale: one whose backlog is full is
    another service's, and a new one says so in one line and leaves it."""
    sock = tmp_path / "mlgo" / "mlgo.sock"
    with listening(sock, full=True):
        before = sock.stat().st_ino
        cmd = [sys.executable, "-m", "mlgo.serve", "--socket", str(sock), f"--policy={SHIPPED}"]
        r = subprocess.run(cmd, capture_output=True, text=True, timeout=60)
        assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
        assert "did not answer" in r.stderr and "leaving" in r.stderr, r.stderr
        assert sock.stat().st_ino == before


@pytest.fixture(scope="module")
def service(tmp_path_factory) -> Iterator[Service]:
    svc = Service(tmp_path_factory.mktemp("svc"), "--policy", str(SHIPPED), "--backend", "python")
    yield svc
    svc.stop()


def exchange(service: Service, line: bytes, timeout: float = 30) -> dict:
    """LINE sent raw (from a thread: the service may stop reading it), the one reply."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
        conn.settimeout(timeout)
        conn.connect(str(service.socket))

        def send() -> None:
            with contextlib.suppress(OSError):
                conn.sendall(line)

        sender = threading.Thread(target=send, daemon=True)
        sender.start()
        reply = conn.makefile("rb").readline()
        try:  # and the connection is closed (reset: with the rest of LINE unread)
            rest = conn.recv(1)
        except ConnectionResetError:
            rest = b""
        assert rest == b""
        return json.loads(reply)


def proc_status(pid: int, field: str) -> int:
    for row in Path(f"/proc/{pid}/status").read_text().splitlines():
        if row.startswith(field + ":"):
            return int(row.split()[1])
    raise KeyError(field)


def test_an_overlong_request_is_one_error_and_costs_the_service_no_memory(service):
    """Before: 64 MB on one line cost the service 128 MB and more, and a garbage reply."""
    peak = proc_status(service.proc.pid, "VmHWM")
    reply = exchange(service, b"x" * (64 << 20) + b"\n")
    assert f"a request is at most {MAX_REQUEST_BYTES} bytes" in reply["error"]
    assert proc_status(service.proc.pid, "VmHWM") - peak < 16 << 10  # kB
    assert service.status()["active_leases"] == 0


def test_a_deeply_nested_request_is_one_error_and_no_traceback(service):
    reply = exchange(service, b"[" * 10_000 + b"\n")
    assert "nests at most" in reply["error"]
    reply = exchange(service, b'{"op": "status", "x": ' + b"{" * 5000 + b"\n")
    assert "nests at most" in reply["error"]
    assert "Traceback" not in service.log.read_text()
    assert service.status()["active_leases"] == 0


@pytest.mark.parametrize("ttl", ["1e308", "NaN", "Infinity", "-1", "0", '"600"', "true"])
def test_a_lease_by_hand_lives_a_bounded_time(service, ttl):
    """Before: a ttl_s of 1e308 (or NaN) opened a lease that never ended, its FIFOs kept."""
    for op in ("channel", "flags"):
        line = f'{{"op": "{op}", "level": "-Oz", "problem": "inlining-size", "ttl_s": {ttl}}}\n'
        reply = exchange(service, line.encode())
        assert f"ttl_s is a number of seconds up to {MAX_TTL_S:g}" in reply["error"], reply
    assert service.status()["active_leases"] == 0
    assert not list((service.socket.parent / "channels").iterdir())


def test_handler_threads_end_with_their_connections(service):
    """Before: every connection held open at once left a pooled thread for good (3,018
    threads after 3,000 connections)."""
    pid = service.proc.pid
    at_rest = proc_status(pid, "Threads")
    conns = []
    try:
        for _ in range(200):
            conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            conn.connect(str(service.socket))
            conns.append(conn)
        deadline = time.monotonic() + 30
        while proc_status(pid, "Threads") < at_rest + 190:  # each one has its handler
            assert time.monotonic() < deadline, proc_status(pid, "Threads")
            time.sleep(0.05)
    finally:
        for conn in conns:
            conn.close()
    deadline = time.monotonic() + 10
    while (threads := proc_status(pid, "Threads")) > at_rest + MAX_IDLE_THREADS:
        assert time.monotonic() < deadline, f"{threads} threads, {at_rest} before"
        time.sleep(0.05)
    assert service.status()["active_leases"] == 0


@pytest.mark.skipif(not shutil.which("strace"), reason="needs strace to see the files made")
def test_the_native_wrapper_keeps_its_temporary_files_in_tmpdir(native_cc, service, tmp_path):
    """Before: always /tmp, whatever TMPDIR said (a full /tmp cost every compile its
    policy). A TMPDIR that is not a directory of the user's alone is not used: /tmp is."""
    mine = tmp_path / "tmp"
    mine.mkdir(mode=0o700)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    for tmpdir, where in ((mine, mine), (tmp_path / "absent", Path("/tmp")), (shared, "/tmp")):
        trace = tmp_path / "trace"
        cmd = ["strace", "-f", "-qq", "-e", "trace=openat", "-o", str(trace), *native_cc]
        r = mlgo_cc(cmd, SOURCES[0], tmp_path / "a.o", service.env(TMPDIR=str(tmpdir)))
        assert r.returncode == 0 and not r.stderr, r.stderr
        assert f'"{where}/mlgo-cc-' in trace.read_text()
