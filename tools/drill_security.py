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

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from mlgo.data import shipped_policy  # noqa: E402
from tests.test_security import CANARY, FAKE_SERVICE  # noqa: E402  (the tests' own fake)

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
MLGO = [sys.executable, "-m", "mlgo.cli"]
SHIPPED = shipped_policy("inlining-size")
MINIPKG = ROOT / "tests" / "data" / "minipkg"
NOBODY = 65534


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


# -- bad input ----------------------------------------------------------------------
_corpus: list[Path] = []


def corpus(work: Path) -> Path:
    """A copy of tests/data/minipkg's corpus (3 modules at -Oz), recorded once per drill by
    the real recording build and LLVM's extract_ir."""
    from mlgo.corpus.extract import build_corpus, combine
    from mlgo.llvm.toolchain import find_toolchain

    if not _corpus:
        root = Path(tempfile.mkdtemp(prefix="mlgo-drill-corpus-"))
        shutil.copytree(MINIPKG, root / "src")
        build = tuple(f'"$CC" -O2 -c {c.name}' for c in sorted((root / "src").glob("*.c")))
        build_corpus("minipkg", root / "src", (), build, find_toolchain(), root / "c", root / "w")
        combine(root / "c")
        _corpus.append(root / "c")
    shutil.copytree(_corpus[0], work / "corpus")
    return work / "corpus"


def spoilt_policy(work: Path, how: str) -> Path:
    """The shipped policy with one NaN weight, or its weights file truncated."""
    import numpy as np

    policy = work / f"policy-{how}"
    shutil.copytree(SHIPPED, policy, ignore=shutil.ignore_patterns("saved_model", "aot"))
    npz = policy / "policy.npz"
    if how == "truncated":
        npz.write_bytes(npz.read_bytes()[:3000])
    else:
        with np.load(npz) as z:
            weights = [z[f"arr_{i}"] for i in range(len(z.files))]
        weights[0][0, 0] = np.nan
        np.savez(npz, *weights)
    return policy


@case("7", "a policy with a NaN weight is refused by eval and serve")
def nan_policy(work: Path) -> Result:
    policy, data = spoilt_policy(work, "nan"), corpus(work)
    ev = run([*MLGO, "eval", "--policy", str(policy), "--corpus", str(data)], env_for(work))
    sv = run(serve(work / "s.sock", policy), env_for(work))
    ok = all(r.returncode == 2 and one_line(r, "policy.npz") for r in (ev, sv))
    return ok, first_line(ev.stderr)


@case("8", "a truncated policy.npz, and --directions 0, are one line")
def truncated_policy(work: Path) -> Result:
    policy, out = spoilt_policy(work, "truncated"), work / "exported"
    ex = run([*MLGO, "export", "--policy", str(policy), "--out", str(out)], env_for(work))
    args = ["--corpus", str(work), "--out", str(work / "run"), "--directions", "0"]
    tr = run([*MLGO, "train", "--algo", "es", *args], env_for(work))
    ok = ex.returncode == 2 and one_line(ex, "policy.npz") and not out.exists()
    return ok and tr.returncode == 2 and one_line(tr, "--directions"), first_line(ex.stderr)


@case("9", "numeric options are range-checked when parsed")
def bad_numbers(work: Path) -> Result:
    common = ["--corpus", str(work), "--out", str(work / "o")]
    tries = [
        ["train", *common, "--steps", "-1"],
        ["train", *common, "--batch", "0"],
        ["collect", "--problem", "inlining-size", *common, "--timeout", "0"],
    ]
    results = [run([*MLGO, *args], env_for(work)) for args in tries]
    ok = all(r.returncode == 2 and one_line(r, "Invalid value") for r in results)
    return ok and not (work / "o").exists(), first_line(results[0].stderr)


@case("11", "corpus stats sees a same-size corrupted module and a truncated one")
def corrupted_modules(work: Path) -> Result:
    data = corpus(work)
    env = env_for(work, MLGO_CACHE=str(work / "cache"))
    run([*MLGO, "corpus", "stats", str(data)], env)
    first, second = sorted(data.rglob("*.bc"))[:2]
    first.write_bytes(first.read_bytes()[:100] + bytes(first.stat().st_size - 100))
    second.write_bytes(second.read_bytes()[:200])
    r = run([*MLGO, "corpus", "stats", str(data)], env)
    failed = [ln for ln in (r.stdout + r.stderr).splitlines() if ln.startswith("failed")]
    return len(
        failed
    ) == 2, f"{len(failed)} modules reported failed: {first_line(failed[0]) if failed else ''}"


@case("12", "a corpus on read-only storage can be evaluated")
def read_only_corpus(work: Path) -> Result:
    if os.getuid() != 0:
        raise Skip("needs root for a read-only bind mount")
    data, ro = corpus(work), work / "ro"
    ro.mkdir()
    if run(["mount", "--bind", str(data), str(ro)]).returncode != 0:
        raise Skip("cannot bind-mount here")
    try:
        run(["mount", "-o", "remount,ro,bind", str(ro)])
        args = ["--policy", str(SHIPPED), "--corpus", str(ro), "--out", str(work / "ev")]
        r = run([*MLGO, "eval", *args], env_for(work, MLGO_CACHE=str(work / "cache")))
    finally:
        run(["umount", str(ro)])
    return r.returncode == 0, first_line(r.stdout)


@case("13", "mlgo eval exits 1 when a module failed, unless --allow-failures")
def eval_failures(work: Path) -> Result:
    data = corpus(work)
    sorted(data.rglob("*.bc"))[0].write_bytes(b"junk")
    args = [*MLGO, "eval", "--policy", str(SHIPPED), "--corpus", str(data)]
    strict = run([*args, "--out", str(work / "ev1")], env_for(work))
    allowed = run([*args, "--out", str(work / "ev2"), "--allow-failures"], env_for(work))
    said = [ln for ln in (strict.stdout + strict.stderr).splitlines() if "modules failed" in ln]
    ok = strict.returncode == 1 and allowed.returncode == 0 and said
    return bool(ok), said[0] if said else first_line(strict.stderr)


@case("14", "a module name that escapes the corpus is refused")
def escaping_module(work: Path) -> Result:
    data = corpus(work)
    description = data / "corpus_description.json"
    meta = json.loads(description.read_text())
    meta["modules"].append("../evil")
    description.write_text(json.dumps(meta))
    out = work / "traces"
    args = ["--problem", "inlining-size", "--corpus", str(data), "--out", str(out)]
    r = run([*MLGO, "collect", *args], env_for(work))
    ok = r.returncode == 2 and one_line(r, "../evil") and not (work / "evil.tfrecord").exists()
    return ok, first_line(r.stderr)


@case("15", "the FIFOs of a killed run are removed by the next run")
def killed_run_fifos(work: Path) -> Result:
    data, tmp = corpus(work), work / "tmp"
    tmp.mkdir()
    env = env_for(work, TMPDIR=str(tmp))
    fifo_root = tmp / f"mlgo-{os.getuid()}"
    args = [*MLGO, "collect", "--problem", "inlining-size", "--corpus", str(data), "--workers", "1"]
    proc = subprocess.Popen(
        [*args, "--out", str(work / "t1")],
        env=env,
        start_new_session=True,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    deadline = time.monotonic() + 120
    while not list(fifo_root.glob("run-*/**/*.in")) and time.monotonic() < deadline:
        time.sleep(0.01)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    left = list(fifo_root.glob("run-*"))
    r = run([*args, "--out", str(work / "t2")], env)
    after = [d for d in left if d.exists()]
    ok = bool(left) and not after and r.returncode == 0
    return ok, f"{len(left)} run directories left by the kill, {len(after)} after the next run"


@case("17", "a failed corpus build or train writes nothing")
def failed_commands(work: Path) -> Result:
    new_corpus, new_run = work / "NEW", work / "RUN"
    build = run([*MLGO, "corpus", "build", "nosuch", "--out", str(new_corpus)], env_for(work))
    train = run(
        [*MLGO, "train", "--corpus", str(work / "nowhere"), "--out", str(new_run)], env_for(work)
    )
    ok = build.returncode != 0 and train.returncode != 0
    ok = ok and not new_corpus.exists() and not new_run.exists()
    return ok, first_line(train.stderr)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("-k", action="append", default=[], help="run only this item (repeat)")
    args = parser.parse_args()
    table = Table(title="mlgo trust-and-bad-input drill")
    for column in ("item", "case", "result", "seen"):
        table.add_column(column, overflow="fold")
    failed = 0
    for item, title, fn in sorted(CASES, key=lambda c: int(c[0])):
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
    for leftover in _corpus:
        shutil.rmtree(leftover.parent)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
