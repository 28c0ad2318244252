"""The trust-and-bad-input drill: each case of issue 19 run end to end as a user would,
with the installed `mlgo` and `mlgo-cc`, real clang and real services, in a scratch
directory. Prints a pass/fail table and exits 1 if any case failed.

    .venv/bin/python tools/drill_security.py            # every case
    .venv/bin/python tools/drill_security.py -k 1 -k 6  # some of them

The cases about another user's socket need root and `setpriv` (they run a fake service as
uid 65534); elsewhere they are reported as skipped, with the reason.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MLGO = [sys.executable, "-m", "mlgo.cli"]
SHIPPED = ROOT / "policies" / "inlining-size"
MINIPKG = ROOT / "tests" / "data" / "minipkg"
NOBODY = 65534
# Compiles only if nothing defines PWNED: an injected -D shows as a compile error.
CANARY = "#ifdef PWNED\n#error PWNED was injected\n#endif\nint f(int x) { return x + 1; }\n"
# A stand-in for a service that answers every lease with argv[2].
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


class Skip(Exception):
    """A case that cannot run here; the message says why."""


Result = tuple[bool, str]  # passed, what was seen
CASES: list[tuple[str, str, Callable[[Path], Result]]] = []


def case(item: str, title: str) -> Callable[[Callable[[Path], Result]], Callable[[Path], Result]]:
    def register(fn: Callable[[Path], Result]) -> Callable[[Path], Result]:
        CASES.append((item, title, fn))
        return fn

    return register


def run(
    cmd: list[str], env: dict[str, str] | None = None, cwd: Path | None = None, timeout: float = 300
) -> subprocess.CompletedProcess:
    return subprocess.run(
        cmd,
        capture_output=True,
        text=True,
        env=env,
        cwd=cwd,
        timeout=timeout,
        stdin=subprocess.DEVNULL,
    )


def first_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[0] if lines else "(nothing)"


def one_line(r: subprocess.CompletedProcess, *words: str) -> bool:
    """Exactly one line on stderr, holding every word: the project's rule for bad input."""
    return r.stderr.count("\n") == 1 and all(w in r.stderr for w in words)


def env_for(work: Path, **extra: str) -> dict[str, str]:
    """A private runtime directory per case, so cases never share a service."""
    runtime = work / "run"
    runtime.mkdir(mode=0o700, exist_ok=True)
    env = {k: v for k, v in os.environ.items() if k != "MLGO_SOCKET"}
    return dict(env, XDG_RUNTIME_DIR=str(runtime), MLGO_BACKEND="python", **extra)


def compile_canary(work: Path, env: dict[str, str]) -> subprocess.CompletedProcess:
    src = work / "canary.c"
    src.write_text(CANARY)
    (work / "canary.o").unlink(missing_ok=True)
    return run([str(BIN / "mlgo-cc"), "-Oz", "-c", str(src), "-o", str(work / "canary.o")], env)


@contextmanager
def process(
    cmd: list[str], env: dict[str, str] | None = None, ready: Path | None = None
) -> Iterator[subprocess.Popen]:
    """A background process (up once READY exists), ended by pid on the way out."""
    proc = subprocess.Popen(
        cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    try:
        deadline = time.monotonic() + 120
        while ready is not None and not ready.exists():
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{cmd[-1]} did not start: {first_line(proc.stderr.read())}")
            time.sleep(0.05)
        yield proc
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def serve(socket: Path, *policies: Path, backend: str = "python") -> list[str]:
    args = [*MLGO, "serve", "--socket", str(socket), "--backend", backend]
    for p in policies or (SHIPPED,):
        args += ["--policy", str(p)]
    return args


# -- the service side ---------------------------------------------------------------
@case("1", "another user's socket is refused; its -D is never compiled in")
def other_users_socket(work: Path) -> Result:
    if os.getuid() != 0 or not shutil.which("setpriv"):
        raise Skip("needs root and setpriv to run a service as another user")
    work.chmod(0o755)  # the other user must reach its directory
    theirs = work / "theirs"
    theirs.mkdir()
    os.chown(theirs, NOBODY, NOBODY)
    theirs.chmod(0o755)
    sock = theirs / "mlgo.sock"
    reply = json.dumps({"lease": "1", "flags": ["-DPWNED=1"], "policies": []})
    as_nobody = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
    with process([*as_nobody, sys.executable, "-c", FAKE_SERVICE, str(sock), reply], ready=sock):
        r = compile_canary(work, env_for(work, MLGO_SOCKET=str(sock)))
    ok = r.returncode == 0 and (work / "canary.o").exists()
    return ok and one_line(r, "warning", f"uid {NOBODY}", "default heuristic"), first_line(r.stderr)


@case("2", "a lease's flag that no lease may carry is refused")
def bad_lease_flags(work: Path) -> Result:
    sock = work / "own.sock"
    reply = json.dumps({"lease": "1", "flags": ["-DPWNED=1"], "policies": []})
    with process([sys.executable, "-c", FAKE_SERVICE, str(sock), reply], ready=sock):
        r = compile_canary(work, env_for(work, MLGO_SOCKET=str(sock)))
        strict = compile_canary(work, env_for(work, MLGO_SOCKET=str(sock), MLGO_STRICT="1"))
    ok = r.returncode == 0 and one_line(r, "no lease may carry") and strict.returncode == 1
    return ok, first_line(r.stderr)


@case("3", "mlgo serve never replaces a file at its socket path")
def serve_over_a_file(work: Path) -> Result:
    precious = work / "precious.txt"
    precious.write_text("data\n")
    r = run([*serve(precious)], env_for(work))
    ok = r.returncode != 0 and one_line(r, "not a socket") and precious.read_text() == "data\n"
    return ok, first_line(r.stderr)


@case("4", "a second mlgo serve leaves the running one alone")
def second_serve(work: Path) -> Result:
    sock = work / "s.sock"
    env = env_for(work)
    with process(serve(sock), env, ready=sock):
        channel = run([*MLGO, "channel", "--socket", str(sock)], env)
        second = run(serve(sock), env)
        fifos = Path(channel.stdout.strip() + ".in").exists()
        status = run([*MLGO, "status", "--socket", str(sock)], env)
    ok = second.returncode != 0 and one_line(second, "already listening") and fifos
    return ok and status.returncode == 0, first_line(second.stderr)


@case("5", "SIGTERM and SIGINT stop the service and remove its socket")
def signals(work: Path) -> Result:
    seen = []
    for sig in (signal.SIGTERM, signal.SIGINT):
        sock = work / f"{sig.name}.sock"
        with process(serve(sock), env_for(work), ready=sock) as proc:
            proc.send_signal(sig)
            code = proc.wait(30)
        seen.append(f"{sig.name}: exit {code}, socket {'left' if sock.exists() else 'gone'}")
    return all(s.endswith("exit 0, socket gone") for s in seen), "; ".join(seen)


@case("6", "a bad MLGO_TIMEOUT loses no compile")
def bad_timeout(work: Path) -> Result:
    seen = []
    for value in ("abc", "", "-1", "0"):
        r = compile_canary(work, env_for(work, MLGO_TIMEOUT=value))
        good = r.returncode == 0 and (work / "canary.o").exists()
        seen.append(good and one_line(r, "MLGO_TIMEOUT"))
    return all(seen), first_line(r.stderr)


@case("10", "a running service with other policies than MLGO_POLICY is not taken silently")
def policy_mismatch(work: Path) -> Result:
    other = work / "other-policy"
    shutil.copytree(SHIPPED, other)
    env = env_for(work)
    sock = work / "run" / "mlgo" / "mlgo.sock"
    sock.parent.mkdir(mode=0o700, exist_ok=True)
    with process(serve(sock), env, ready=sock):
        r = compile_canary(work, dict(env, MLGO_POLICY=str(other)))
    return r.returncode == 0 and one_line(r, "MLGO_POLICY"), first_line(r.stderr)


@case("16", "after a failed start, a fixed policy is tried at once")
def retry_after_fix(work: Path) -> Result:
    policy = work / "policy"
    policy.mkdir()
    (policy / "policy.json").write_text("{ truncated")
    env = env_for(work, MLGO_POLICY=str(policy))
    failed = compile_canary(work, env)
    shutil.rmtree(policy)
    shutil.copytree(SHIPPED, policy)
    fixed = compile_canary(work, env)
    run([*MLGO, "stop"], env)
    ok = "did not start" in failed.stderr and fixed.returncode == 0 and not fixed.stderr
    return ok, first_line(fixed.stderr) if fixed.stderr else "compiled with the policy"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", action="append", default=[], help="run only this item (repeat)")
    args = parser.parse_args()
    table = Table(title="mlgo trust-and-bad-input drill")
    for column in ("item", "case", "result", "seen"):
        table.add_column(column, overflow="fold")
    failed = 0
    for item, title, fn in CASES:
        if args.k and item not in args.k:
            continue
        with tempfile.TemporaryDirectory(prefix=f"mlgo-drill-{item}-") as tmp:
            try:
                passed, seen = fn(Path(tmp))
                result = "[green]pass" if passed else "[red]FAIL"
                failed += not passed
            except Skip as e:
                result, seen = "[yellow]skip", str(e)
            except Exception as e:  # a case that broke is a failed case, named
                result, seen = "[red]FAIL", f"{type(e).__name__}: {first_line(str(e))}"
                failed += 1
        table.add_row(item, title, result, seen)
    Console(width=160).print(table)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
