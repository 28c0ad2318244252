"""`mlgo-cc` / `mlgo-c++`: drop-in CC and CXX that compile with the served policies.

Every argument passes through untouched. A compilation that optimizes code gets a lease
from the policy service (started on demand) and the `-mllvm` flags of its channels;
anything else (preprocessing, `--version`, pure links) runs the compiler as is.

A build must never fail or hang because of the policy. If the service is down or cannot
start, if a channel fails (policy crash, garbage answer, unknown feature layout), if the
service dies mid-compilation or the compile outlives MLGO_TIMEOUT, the compiler is killed
and the file is compiled again with the default heuristic, with a one-line warning.
MLGO_STRICT=1 turns that warning into an error instead.

Environment: MLGO_CC / MLGO_CXX (default clang-22 / clang++-22), MLGO_POLICY (policy
directories, ':'-separated, for a service started on demand; default: the shipped
inlining policy), MLGO_BACKEND (auto, plugin, native or python), MLGO_TIMEOUT (seconds,
default 900), MLGO_STRICT, MLGO_DISABLE (plain compiler), MLGO_SOCKET.
"""

from __future__ import annotations

import fcntl
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from mlgo.serve.client import Connection, ServiceError, runtime_dir, socket_path

SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".c++", ".C", ".i", ".ii", ".m", ".mm")
NO_CODEGEN = {"-E", "-M", "-MM", "-fsyntax-only", "-###", "--version", "--help", "-"}
CONNECT_TIMEOUT_S = 10.0
TIMED_OUT = "no result within MLGO_TIMEOUT"
START_TIMEOUT_S = 180.0  # the first start may AOT-compile the policy (about 20 s)
START_RETRY_S = 60.0  # after a failed start, fall back at once for this long
SHIPPED_POLICY = Path(__file__).resolve().parents[2] / "policies" / "inlining-size"


def optimizes(args: list[str]) -> bool:
    """Does this invocation compile a source file (so the optimizer may ask)?"""
    if NO_CODEGEN.intersection(args) or any(a.startswith("-mllvm") for a in args):
        return False
    return any(a.endswith(SOURCE_SUFFIXES) and not a.startswith("-") for a in args)


def _warn(message: str) -> None:
    print(f"mlgo-cc: warning: {message}", file=sys.stderr, flush=True)


def start_service(path: Path) -> Connection:
    """Starts a service for MLGO_POLICY and connects; one starter at a time."""
    runtime = runtime_dir()
    failed_marker = runtime / "start-failed"
    with open(runtime / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:  # another wrapper may have started it while we waited for the lock
            return Connection(path, CONNECT_TIMEOUT_S)
        except ServiceError:
            pass
        if failed_marker.exists() and time.time() - failed_marker.stat().st_mtime < START_RETRY_S:
            raise ServiceError(f"the mlgo service failed to start recently ({failed_marker})")
        policies = os.environ.get("MLGO_POLICY") or str(SHIPPED_POLICY)
        cmd = [sys.executable, "-m", "mlgo.cli", "serve", "--idle-exit", "600"]
        cmd += ["--backend", os.environ.get("MLGO_BACKEND", "auto")]
        for p in policies.split(os.pathsep):
            cmd += ["--policy", p]
        log_path = runtime / "service.log"
        with open(log_path, "ab") as log:
            proc = subprocess.Popen(
                cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True
            )
        deadline = time.monotonic() + START_TIMEOUT_S
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                conn = Connection(path, CONNECT_TIMEOUT_S)
                failed_marker.unlink(missing_ok=True)
                return conn
            except ServiceError:
                time.sleep(0.1)
        if proc.poll() is None:
            proc.kill()
        failed_marker.touch()
        lines = log_path.read_text(errors="replace").strip().splitlines() or ["(no output)"]
        raise ServiceError(f"the mlgo service did not start: {lines[-1][:200]}")


def connect(path: Path, may_start: bool) -> Connection:
    """A connection to the service at PATH, starting one there if none runs and MAY_START
    (an explicitly named service is not ours to start)."""
    try:
        return Connection(path, CONNECT_TIMEOUT_S)
    except ServiceError:
        if not may_start:
            raise
        return start_service(path)


def _lease() -> tuple[Connection, list[str]]:
    conn = connect(socket_path(), may_start=not os.environ.get("MLGO_SOCKET"))
    try:
        conn.send({"op": "compile"})
        return conn, list(conn.receive()["flags"])
    except (ServiceError, KeyError) as e:
        conn.close()
        raise ServiceError(f"the mlgo service refused a lease: {e}") from e


def _watch(proc: subprocess.Popen, conn: Connection, timeout_s: float) -> str | None:
    """Waits for the compiler; kills it and says why on a channel error, a dead service
    or the timeout. Returns None when the compiler finished by itself."""
    pidfd = os.pidfd_open(proc.pid)
    deadline = time.monotonic() + timeout_s
    try:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                problem = f"{TIMED_OUT}={timeout_s:g} s"
                break
            ready, _, _ = select.select([pidfd, conn], [], [], remaining)
            if pidfd in ready:
                proc.wait()
                return None
            if ready:
                try:
                    event = conn.receive()
                    problem = str(event.get("message", event))
                except ServiceError as e:
                    problem = str(e)
                break
    finally:
        os.close(pidfd)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    return problem


def run(compiler: str, args: list[str]) -> int:
    if os.environ.get("MLGO_DISABLE") or not optimizes(args):
        os.execvp(compiler, [compiler, *args])
    strict = bool(os.environ.get("MLGO_STRICT"))
    source = next((a for a in args if a.endswith(SOURCE_SUFFIXES)), "?")
    timeout_s = float(os.environ.get("MLGO_TIMEOUT", "900"))
    try:
        conn, flags = _lease()
    except ServiceError as e:
        problem = str(e)
    else:
        with conn, tempfile.TemporaryFile() as err:
            proc = subprocess.Popen([compiler, *args, *flags], stderr=err)
            problem = _watch(proc, conn, timeout_s)
            try:
                conn.send({"op": "done", "returncode": proc.returncode})
                # After a timeout the answer is not awaited: whatever hung may hold it up
                # too, and MLGO_TIMEOUT bounds the whole compilation.
                if not (problem or "").startswith(TIMED_OUT):
                    while "event" in (tally := conn.receive()):
                        problem = problem or tally.get("message")
                    if tally["errors"]:
                        problem = problem or tally["errors"][0]
            except (ServiceError, KeyError) as e:
                problem = problem or str(e)
            if problem is None and proc.returncode < 0:
                problem = f"the compiler died of signal {-proc.returncode}"
            if problem is None:
                err.seek(0)
                sys.stderr.buffer.write(err.read())
                sys.stderr.flush()
                return proc.returncode
    if strict:
        print(f"mlgo-cc: error: {problem} ({source})", file=sys.stderr)
        return 1
    _warn(f"{problem}; compiling {source} with the default heuristic")
    os.execvp(compiler, [compiler, *args])


def main_c() -> None:
    sys.exit(run(os.environ.get("MLGO_CC", "clang-22"), sys.argv[1:]))


def main_cxx() -> None:
    sys.exit(run(os.environ.get("MLGO_CXX", "clang++-22"), sys.argv[1:]))


def install_native_wrappers(bindir: Path) -> list[Path]:
    """Builds mlgo/serve/native/mlgo_cc.c and installs it as BINDIR/mlgo-cc and mlgo-c++ (over the
    Python entry points it hands uncommon cases to), each renamed into place."""
    source = Path(__file__).parent / "native" / "mlgo_cc.c"
    fd, tmp = tempfile.mkstemp(prefix=".mlgo-cc.", dir=bindir)
    os.close(fd)
    try:
        cmd = ["cc", "-O2", "-Wall", "-Werror", f'-DMLGO_PYTHON="{sys.executable}"']
        proc = subprocess.run([*cmd, str(source), "-o", tmp], capture_output=True, text=True)
        if proc.returncode != 0:
            lines = proc.stderr.strip().splitlines() or ["(no output)"]
            raise OSError(f"cannot build {source.name}: {lines[0]}")
        installed = []
        for name in ("mlgo-cc", "mlgo-c++"):
            staged = bindir / f".{name}.new"
            staged.unlink(missing_ok=True)
            os.link(tmp, staged)
            os.chmod(staged, 0o755)
            os.replace(staged, bindir / name)
            installed.append(bindir / name)
        return installed
    finally:
        Path(tmp).unlink(missing_ok=True)


if __name__ == "__main__":  # the native wrapper hands over: python -m mlgo.serve.cc cc|c++ ARGS
    language = sys.argv[1] if len(sys.argv) > 1 else "cc"
    sys.argv = [f"mlgo-{language}", *sys.argv[2:]]
    main_cxx() if language == "c++" else main_c()
