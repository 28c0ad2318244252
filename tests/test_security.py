"""Trust nothing on the socket, lose nothing on bad input (issue 19, the service side): real
services, real clang, both wrappers, and a second, unprivileged user for the socket's owner."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from mlgo.problems import get_problem, problems
from mlgo.runtime.files import cache_subdir
from mlgo.serve.client import ServiceError, request
from mlgo.serve.lease import check_lease_flags, lease_allow_list
from mlgo.serve.native_wrapper import build_native_wrapper
from tests import fake_problem, test_service
from tests.conftest import MLGO
from tests.test_service import SHIPPED, SOURCES, Service, mlgo_cc

cc = test_service.cc  # both wrappers, as the service's own tests run them
native_cc = test_service.native_cc
native_wrappers = test_service.native_wrappers

NOBODY = 65534
# Compiles only if nothing defines PWNED: an injected -D shows as a compile error.
CANARY = "#ifdef PWNED\n#error PWNED was injected\n#endif\nint f(int x) { return x + 1; }\n"
# A stand-in for a service: answers every lease with REPLY, and every tally with nothing.
FAKE_SERVICE = r"""
import socket, sys
server = socket.socket(socket.AF_UNIX)
server.bind(sys.argv[1])
server.listen(64)
while True:
    conn, _ = server.accept()
    with conn, conn.makefile("rwb") as f:
        for answer in (sys.argv[2], '{"decisions": 0, "sessions": 0, "errors": []}'):
            if not f.readline():
                break
            f.write(answer.encode() + b"\n")
            f.flush()
"""


def start_fake(path: Path, reply: dict, *as_user: str) -> subprocess.Popen:
    """The fake service on PATH (as the user AS_USER sets, if any), once it listens."""
    cmd = [*as_user, sys.executable, "-c", FAKE_SERVICE, str(path), json.dumps(reply)]
    proc = subprocess.Popen(cmd)
    deadline = time.monotonic() + 30
    while not path.exists():
        assert proc.poll() is None and time.monotonic() < deadline, "the fake did not start"
        time.sleep(0.02)
    return proc


def one_line(stderr: str) -> str:
    assert stderr.count("\n") == 1, stderr
    return stderr


def assert_falls_back(cc: list[str], src: Path, out: Path, env: dict[str, str], why: str) -> None:
    """One warning naming WHY, the file compiled with the default heuristic (so no -D came
    in); under MLGO_STRICT=1 one error and no object."""
    r = mlgo_cc(cc, src, out, env)
    assert r.returncode == 0 and out.exists(), r.stderr
    line = one_line(r.stderr)
    assert line.startswith("mlgo-cc: warning:") and why in line and "default heuristic" in line
    out.unlink()
    r = mlgo_cc(cc, src, out, dict(env, MLGO_STRICT="1"))
    assert r.returncode == 1 and not out.exists()
    assert one_line(r.stderr).startswith("mlgo-cc: error:") and why in r.stderr


@pytest.fixture
def canary(tmp_path: Path) -> Path:
    src = tmp_path / "canary.c"
    src.write_text(CANARY)
    return src


@pytest.fixture
def as_nobody() -> list[str]:
    """The command prefix that runs a program as the unprivileged user 65534."""
    if os.geteuid() != 0:
        pytest.skip("needs root to run a service as a second user (setpriv --reuid)")
    if shutil.which("setpriv") is None:
        pytest.skip("needs setpriv (util-linux) to run a service as a second user")
    return ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]


@pytest.fixture
def nobodys_dir() -> Iterator[Path]:
    """A directory of user 65534, outside root's private pytest directories."""
    path = Path(tempfile.mkdtemp(prefix="mlgo-nobody-"))
    os.chown(path, NOBODY, NOBODY)
    path.chmod(0o755)
    yield path
    shutil.rmtree(path)


INJECTED = {"lease": "1", "flags": ["-DPWNED=1"], "policies": []}


@pytest.mark.parametrize("setup", ["their directory", "their socket", "a swapped socket"])
def test_another_users_socket_is_refused(setup, cc, as_nobody, nobodys_dir, canary, tmp_path):
    """A service of uid 65534 that injects -DPWNED=1 is never used, whether its socket sits
    in its own directory, in ours, or was chowned to us after the bind (a swap that only
    the peer's credentials on the connection reveal)."""
    fake = start_fake(nobodys_dir / "mlgo.sock", INJECTED, *as_nobody)
    try:
        path, why = nobodys_dir / "mlgo.sock", f"{nobodys_dir} belongs to uid {NOBODY}"
        if setup != "their directory":
            path = tmp_path / "mlgo.sock"
            (nobodys_dir / "mlgo.sock").rename(path)
            why = f"{path} belongs to uid {NOBODY}"
        if setup == "a swapped socket":
            os.chown(path, 0, 0)
            why = f"{path} is served by uid {NOBODY}"
        env = dict(os.environ, MLGO_SOCKET=str(path))
        assert_falls_back(cc, canary, tmp_path / "canary.o", env, why)
    finally:
        fake.kill()
        fake.wait()


def test_a_socket_others_can_write_is_refused(cc, canary, tmp_path):
    fake = start_fake(tmp_path / "mlgo.sock", INJECTED)
    try:
        (tmp_path / "mlgo.sock").chmod(0o666)
        env = dict(os.environ, MLGO_SOCKET=str(tmp_path / "mlgo.sock"))
        why = f"{tmp_path / 'mlgo.sock'} is writable by other users (mode 666)"
        assert_falls_back(cc, canary, tmp_path / "canary.o", env, why)
    finally:
        fake.kill()
        fake.wait()


def test_every_problems_serving_flags_pass_the_lease_check(tmp_path, monkeypatch):
    """The allowed flags are exactly what the service hands out: a channel per problem in
    the runtime directory (with the compiler's own answer, for a gated policy), and a
    plugin from the cache of built plugins."""
    monkeypatch.setenv("MLGO_CACHE", str(tmp_path / "cache"))
    (tmp_path / "channels").mkdir()
    for problem in problems():
        base = str(tmp_path / "channels" / f"1-1-{problem.name}")
        for default in (False, True):
            check_lease_flags(problem.flags_for_serving(base, default), tmp_path)
    plugin = cache_subdir("plugin", "k") / "lib.so"
    plugin.write_bytes(b"")
    check_lease_flags([f"-fpass-plugin={plugin}"], tmp_path)


def test_a_new_problem_is_allowed_its_flags_by_one_line(tmp_path, monkeypatch):
    """The lease allow-list comes from the registered problems alone: a third problem's
    channel passes both wrappers' checks once its module is in MODULES, and not before."""
    import mlgo.problems

    (tmp_path / "channels").mkdir()
    flags = fake_problem.channel_flags(str(tmp_path / "channels" / "1-1-fake-choice"))

    def accepted() -> tuple[bool, bool]:
        lease_allow_list.cache_clear()
        try:
            check_lease_flags(flags, tmp_path)
            python = True
        except ServiceError:
            python = False
        checker = tmp_path / "checker"
        build_native_wrapper(checker, "-DMLGO_GUARD_CHECK")
        native = subprocess.run([checker, "lease", str(tmp_path), *flags], capture_output=True)
        return python, native.stdout == b"1\n"

    try:
        assert accepted() == (False, False)
        registered = (*mlgo.problems.MODULES, fake_problem.__name__)
        monkeypatch.setattr(mlgo.problems, "MODULES", registered)
        assert accepted() == (True, True)
    finally:
        lease_allow_list.cache_clear()


def test_a_policys_base_passes_both_checks_as_a_number_alone(tmp_path):
    """A policy's base (inlining-speed's inline threshold) reaches the compiler as its switch
    and digits; anything else after the switch is refused by both wrappers."""

    (tmp_path / "channels").mkdir()
    checker = tmp_path / "checker"
    build_native_wrapper(checker, "-DMLGO_GUARD_CHECK")
    for value, ok in (("400", True), ("0400", True), ("4e2", False), ("400x", False)):
        flags = ["-mllvm", f"-inline-threshold={value}"]
        native = subprocess.run([checker, "lease", str(tmp_path), *flags], capture_output=True)
        assert native.stdout == (b"1\n" if ok else b"0\n"), value
        if ok:
            check_lease_flags(flags, tmp_path)
        else:
            with pytest.raises(ServiceError, match="base must be digits alone"):
                check_lease_flags(flags, tmp_path)


ONLY_OURS = "a lease may carry only the served problems' -mllvm options"
NOT_OURS = "not one of the served problems' options"
IN_CHANNELS = "a channel must be a FIFO directly in"
IN_CACHE = "a lease may load only a plugin mlgo built there"
DIGITS = "a policy's base must be digits alone"


@pytest.mark.parametrize(
    "flags, why",
    [
        (["-DPWNED=1"], ONLY_OURS),
        (["-mllvm", "-print-after-all"], NOT_OURS),
        (["-mllvm", "-inliner-interactive-channel-base=CHANNELS/../x"], IN_CHANNELS),
        (["-mllvm", "-inliner-interactive-channel-base=ELSEWHERE/x"], IN_CHANNELS),
        (["-fpass-plugin=ELSEWHERE/evil.so"], IN_CACHE),
        (["-fpass-plugin=CACHE/plugin/../evil.so"], IN_CACHE),
        (["-mllvm"], NOT_OURS),
        (["-mllvm", "-inline-threshold=400 -print-after-all"], DIGITS),
        (["-mllvm", "-inline-threshold="], DIGITS),
        (["-mllvm", "-inline-threshold=-1"], DIGITS),
    ],
)
def test_flags_no_lease_may_carry_are_refused(flags, why, cc, canary, tmp_path):
    """Even our own service (a fake one here) gets no say beyond its channels and plugins;
    the warning says which flag and which rule it breaks."""
    for d in ("channels", "elsewhere", "cache/plugin"):
        (tmp_path / d).mkdir(parents=True)
    (tmp_path / "elsewhere" / "evil.so").write_bytes(b"")
    (tmp_path / "cache" / "evil.so").write_bytes(b"")
    flags = [
        f.replace("CHANNELS", str(tmp_path / "channels"))
        .replace("ELSEWHERE", str(tmp_path / "elsewhere"))
        .replace("CACHE", str(tmp_path / "cache"))
        for f in flags
    ]
    fake = start_fake(tmp_path / "mlgo.sock", {"lease": "1", "flags": flags, "policies": []})
    try:
        env = dict(os.environ, MLGO_SOCKET=str(tmp_path / "mlgo.sock"))
        env["MLGO_CACHE"] = str(tmp_path / "cache")
        assert_falls_back(cc, canary, tmp_path / "canary.o", env, why)
    finally:
        fake.kill()
        fake.wait()


def serve(socket_file: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [*MLGO, "serve", "--socket", str(socket_file), "--backend", "python", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_serve_never_replaces_a_file(tmp_path):
    data = tmp_path / "precious.txt"
    data.write_text("the user's data\n")
    r = serve(data)
    assert r.returncode != 0 and data.read_text() == "the user's data\n"
    assert "exists and is not a socket" in one_line(r.stderr)


def test_a_second_serve_leaves_the_first_alone(tmp_path):
    first = Service(tmp_path, "--policy", str(SHIPPED), "--backend", "python")
    try:
        base = request({"op": "channel", "ttl_s": 120}, path=first.socket)["base"]
        inode = first.socket.stat().st_ino
        r = serve(first.socket, "--policy", str(SHIPPED))
        assert r.returncode != 0 and "already listening" in one_line(r.stderr)
        assert "serving" not in r.stderr
        assert Path(base + ".in").exists() and Path(base + ".out").exists()
        assert first.socket.stat().st_ino == inode
        flags = get_problem("inlining-size").channel_flags(base)
        cmd = ["clang-22", "-Oz", "-c", str(SOURCES[0]), "-o", str(tmp_path / "a.o"), *flags]
        assert subprocess.run(cmd, timeout=60).returncode == 0  # the channel still works
    finally:
        first.stop()


def test_a_stale_socket_and_fifos_are_cleaned_up(tmp_path):
    """What a killed service leaves (its socket, its FIFOs) goes at the next start."""
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(str(tmp_path / "mlgo.sock"))
    stale.close()  # bound, then nobody listens: a stale socket
    (tmp_path / "channels").mkdir()
    os.mkfifo(tmp_path / "channels" / "1-1-inlining-size.in")
    service = subprocess.Popen(
        [*MLGO, "serve", "--socket", str(tmp_path / "mlgo.sock"), "--backend", "python"]
    )
    try:
        wait_until_serving(tmp_path / "mlgo.sock", service)
        assert not list((tmp_path / "channels").iterdir())
    finally:
        service.terminate()
        service.wait(30)


def wait_until_serving(socket_file: Path, proc: subprocess.Popen) -> None:
    deadline = time.monotonic() + 120
    while True:
        assert proc.poll() is None and time.monotonic() < deadline, "did not start"
        try:
            request({"op": "status"}, path=socket_file)
            return
        except ServiceError:
            time.sleep(0.1)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_stops_the_service_cleanly(signum, tmp_path):
    proc = subprocess.Popen(
        [*MLGO, "serve", "--socket", str(tmp_path / "mlgo.sock"), "--backend", "python"],
        stderr=subprocess.PIPE,
        text=True,
    )
    wait_until_serving(tmp_path / "mlgo.sock", proc)
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 0, stderr
    assert not (tmp_path / "mlgo.sock").exists() and "Traceback" not in stderr


@pytest.fixture(scope="module")
def python_service(tmp_path_factory) -> Iterator[Service]:
    service = Service(
        tmp_path_factory.mktemp("py"), "--policy", str(SHIPPED), "--backend", "python"
    )
    yield service
    service.stop()


@pytest.mark.parametrize("value", ["abc", "", "-1", "0", "nan", "inf", "0x10"])
def test_a_bad_timeout_loses_no_compile(value, cc, python_service, tmp_path):
    """One warning, and the file still compiled with the policy (under strict: an error)."""
    before = python_service.status()["compilations"]
    r = mlgo_cc(cc, SOURCES[0], tmp_path / "a.o", python_service.env(MLGO_TIMEOUT=value))
    assert r.returncode == 0 and (tmp_path / "a.o").exists(), r.stderr
    line = one_line(r.stderr)
    assert f"MLGO_TIMEOUT={value!r} is not a positive number" in line and "900 s" in line
    assert python_service.status()["compilations"] == before + 1
    r = mlgo_cc(
        cc, SOURCES[0], tmp_path / "b.o", python_service.env(MLGO_TIMEOUT=value, MLGO_STRICT="1")
    )
    assert r.returncode == 1 and "mlgo-cc: error: MLGO_TIMEOUT" in one_line(r.stderr)


def test_the_lease_names_its_policies(python_service):
    reply = request({"op": "compile", "level": "-Oz", "language": "c"}, path=python_service.socket)
    assert reply["policies"] == [str(SHIPPED.resolve())]


def test_a_service_with_other_policies_is_not_taken_silently(cc, python_service, tmp_path):
    other = tmp_path / "other-policy"
    shutil.copytree(SHIPPED, other)
    r = mlgo_cc(cc, SOURCES[0], tmp_path / "a.o", python_service.env(MLGO_POLICY=str(SHIPPED)))
    assert r.returncode == 0 and not r.stderr, r.stderr
    before = python_service.status()["decisions"]
    env = python_service.env(MLGO_POLICY=str(other))
    r = mlgo_cc(cc, SOURCES[0], tmp_path / "b.o", env)
    assert r.returncode == 0 and (tmp_path / "b.o").exists()
    line = one_line(r.stderr)
    assert f"not MLGO_POLICY={other}" in line and str(SHIPPED.resolve()) in line
    assert python_service.status()["decisions"] > before  # the served policy compiled it
    r = mlgo_cc(cc, SOURCES[0], tmp_path / "c.o", dict(env, MLGO_STRICT="1"))
    assert r.returncode == 1 and f"not MLGO_POLICY={other}" in one_line(r.stderr)


def test_a_fixed_policy_is_retried_at_once(native_cc, tmp_path):
    """After a failed start the wrapper falls back for a while, but not once the policy
    files it failed on have changed."""
    policy = tmp_path / "policy"
    policy.mkdir()
    (policy / "policy.json").write_text("{ truncated")
    env = dict(os.environ, XDG_RUNTIME_DIR=str(tmp_path), MLGO_BACKEND="python")
    env["MLGO_POLICY"] = str(policy)
    env.pop("MLGO_SOCKET", None)
    r = mlgo_cc(native_cc, SOURCES[0], tmp_path / "a.o", env, timeout=300)
    assert r.returncode == 0 and "did not start" in one_line(r.stderr)
    r = mlgo_cc(native_cc, SOURCES[0], tmp_path / "a.o", env, timeout=300)
    assert "failed to start recently" in one_line(r.stderr)
    shutil.rmtree(policy)
    shutil.copytree(SHIPPED, policy)
    socket_file = tmp_path / "mlgo" / "mlgo.sock"
    try:
        r = mlgo_cc(native_cc, SOURCES[0], tmp_path / "b.o", env, timeout=300)
        assert r.returncode == 0 and not r.stderr, r.stderr
    finally:
        if socket_file.exists():
            pid = request({"op": "status"}, path=socket_file)["pid"]
            subprocess.run([*MLGO, "stop", "--socket", str(socket_file)], timeout=60)
            deadline = time.monotonic() + 30
            while Path(f"/proc/{pid}").exists() and time.monotonic() < deadline:
                time.sleep(0.1)
