"""`mlgo-cc` / `mlgo-c++`: drop-in CC and CXX that compile with the served policies.

Every argument passes through untouched. A compilation that optimizes code gets a lease
from the policy service (started on demand) and the `-mllvm` flags of its channels;
anything else (preprocessing, `--version`, pure links) runs the compiler as is. A policy
serves only compiles at the -O level it was trained for (the last -O flag, as clang reads
it): the others run the compiler as is, and the first of each level in the service's
lifetime prints one note saying so. What the wrapper reads to decide this is what clang's
driver reads (mlgo.llvm.driver): `@file` response files expanded (the compiler still gets
them as they are), and an input without a C or C++ suffix that `-x c` or `-x c++` makes a
source (an existing file, not an option's value); the native wrapper hands both cases to this
module.

A build must never fail or hang because of the policy. If the service is down or cannot
start, if a channel fails (policy crash, garbage answer, unknown feature layout), if the
service dies mid-compilation or the compile outlives MLGO_TIMEOUT, the compiler is killed
and the file is compiled again with the default heuristic, with a one-line warning.
The same happens when the socket is not this user's (mlgo.serve.client) or the lease carries a
flag no lease may carry (mlgo.serve.lease): only the channel options of the served problems,
on a FIFO in this user's runtime directory, and a plugin from this user's cache of built
plugins that no other user could have written (mlgo.runtime.trust), given to the compiler by
the resolved path that was checked. MLGO_STRICT=1 turns that warning into an error instead.
A compile that fails with the policy's flags is done again plainly: if that passes, the flags
broke it (a plugin that does not load, a compiler that is not clang), which is one warning;
under MLGO_STRICT the failure stands, as clang reported it.

Environment: MLGO_CC / MLGO_CXX (default clang-22 / clang++-22), MLGO_POLICY (policy
directories, ':'-separated, for a service started on demand; default: the shipped
inlining policies, per file and at full-LTO links), MLGO_BACKEND (auto, plugin, native or
python), MLGO_TIMEOUT (seconds, default 900), MLGO_STRICT, MLGO_DISABLE (plain compiler),
MLGO_SOCKET, MLGO_GUARD (`size`: keep the smaller of the policy's and the default's object,
or program at an LTO link, mlgo.serve.guard).
A bad MLGO_TIMEOUT or MLGO_GUARD is a warning (the default, or no guard, is used), and a
running service that serves other policies than MLGO_POLICY names is too; all are errors
under MLGO_STRICT.
"""

from __future__ import annotations

import hashlib
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from pathlib import Path
from typing import IO

from mlgo.data import default_policies
from mlgo.errors import UsageError
from mlgo.llvm.cmdline import (
    DEPARTURES_ENV,
    DEPARTURES_PREFIX,
    made_default_object,
)
from mlgo.llvm.driver import (
    NO_CODEGEN,
    compile_language,
    expand_response_files,
    link_output,
    link_stage,
    links_with_lld,
    opt_level,
    source_files,
)
from mlgo.runtime.files import held_lock
from mlgo.runtime.messages import error_line
from mlgo.serve import memo
from mlgo.serve.client import (
    BusyError,
    Connection,
    NoServiceError,
    ServiceError,
    launch_service,
    runtime_dir,
    socket_path,
)
from mlgo.serve.guard import (
    GUARDS,
    guard_from_env,
    guarded_link,
    guarded_object,
    keep_smaller,
)
from mlgo.serve.lease import PLUGIN_FLAG, at_link, check_lease_flags

# LLVM options of a user's own (-mllvm X) that only report what the compiler did, so a
# compile with them is still served: the block address map's frequencies (block_costs).
# Any other -mllvm option leaves the compile to clang, whose options it may be setting.
REPORTING_LLVM_OPTIONS = ("-pgo-analysis-map=",)
CONNECT_TIMEOUT_S = 10.0
TIMED_OUT = "no result within MLGO_TIMEOUT"
START_TIMEOUT_S = 180.0  # the first start may AOT-compile the policy (about 20 s)
START_RETRY_S = 60.0  # after a failed start, fall back at once for this long (same policies)
DEFAULT_TIMEOUT_S = 900.0
DEFAULT_POLICY = os.pathsep.join(str(p) for p in default_policies())


def sets_llvm_options(args: list[str]) -> bool:
    """Does ARGS set an LLVM option (-mllvm X, -mllvm=X) other than a reporting one?"""
    for i, a in enumerate(args):
        if a.startswith("-mllvm"):
            value = args[i + 1] if a == "-mllvm" and i + 1 < len(args) else a[len("-mllvm=") :]
            if not value.startswith(REPORTING_LLVM_OPTIONS):
                return True
    return False


def optimizes(args: list[str]) -> bool:
    """Does this invocation compile a source file (so the optimizer may ask)?"""
    if NO_CODEGEN.intersection(args) or sets_llvm_options(args):
        return False
    return bool(source_files(args))


def _warn(message: str) -> None:
    print(f"mlgo-cc: warning: {message}", file=sys.stderr, flush=True)


def _policies() -> str:
    return os.environ.get("MLGO_POLICY") or DEFAULT_POLICY


def _start_fingerprint() -> str:
    """What a service start depends on: the policies named, the backend, and the size and
    mtime of every file in the policy directories. A failed start is retried at once when
    it changes (the user fixed the cause)."""
    digest = hashlib.sha256(f"{_policies()}\0{os.environ.get('MLGO_BACKEND')}\0".encode())
    for directory in _policies().split(os.pathsep):
        for path in sorted(Path(directory).rglob("*")):
            try:
                st = path.stat()
            except OSError:  # gone while we looked: the next fingerprint differs anyway
                continue
            digest.update(f"{path}\0{st.st_size}\0{st.st_mtime_ns}\0".encode())
    return digest.hexdigest()


def _failed_recently(marker: Path, fingerprint: str) -> bool:
    try:
        recent = time.time() - marker.stat().st_mtime < START_RETRY_S
        return recent and marker.read_text() == fingerprint
    except OSError:
        return False


def _error(problem: str, source: str) -> int:
    print(f"mlgo-cc: error: {problem} ({source})", file=sys.stderr, flush=True)
    return 1


def start_service(path: Path, timeout_s: float) -> Connection:
    """Starts a service for MLGO_POLICY and connects (within TIMEOUT_S once it answers); one
    starter at a time."""
    runtime = runtime_dir()
    failed_marker = runtime / "start-failed"
    with held_lock(runtime / "start.lock"):
        try:  # another wrapper may have started it while we waited for the lock
            return Connection(path, timeout_s)
        except NoServiceError:
            pass
        fingerprint = _start_fingerprint()
        if _failed_recently(failed_marker, fingerprint):
            raise ServiceError(f"the mlgo service failed to start recently ({failed_marker})")
        backend = os.environ.get("MLGO_BACKEND", "auto")
        policies = _policies().split(os.pathsep)
        try:
            launch_service(path, policies, backend, runtime / "service.log", 600, START_TIMEOUT_S)
        except ServiceError:
            failed_marker.write_text(fingerprint)
            raise
        failed_marker.unlink(missing_ok=True)
        return Connection(path, timeout_s)


def connect(path: Path, may_start: bool, timeout_s: float = CONNECT_TIMEOUT_S) -> Connection:
    """A connection to the service at PATH within TIMEOUT_S, starting one there if no one
    listens and MAY_START (an explicitly named service is not ours to start, nor one we do
    not trust, nor one that is there but busy)."""
    try:
        return Connection(path, timeout_s)
    except NoServiceError:
        if not may_start:
            raise
        return start_service(path, timeout_s)


def by_hand(path: Path, may_start: bool, message: dict) -> dict:
    """The service's answer to MESSAGE for a compilation run by hand (`mlgo channel`, `mlgo
    flags`), starting it as mlgo-cc would. A first channel on a plugin-served policy starts
    its native server, so the answer may take as long as a start."""
    with connect(path, may_start) as conn:
        conn.send(message)
        return conn.receive(START_TIMEOUT_S)


def flags_by_hand(
    path: Path,
    may_start: bool,
    problem: str | None,
    cflags: list[str],
    language: str,
    stage: str = "compile",
) -> tuple[list[str], str | None]:
    """The flags that bring the served policies (PROBLEM's only, if named) to the user's own
    clang command with CFLAGS for compiles in LANGUAGE, or for an LTO link by lld (STAGE link
    or thin-link: in the linker's spelling), checked as a lease's are, and the note when that
    level or language leaves some policy to clang's default (no flags when it leaves them
    all)."""
    level = opt_level(cflags)
    if level is None:
        raise UsageError(f"clang accepts no such -O level: {' '.join(cflags)}")
    if stage != "compile" and link_stage(cflags) != stage:
        lto = "-flto=thin" if stage == "thin-link" else "-flto"
        raise UsageError(f"the {stage} step is a link with {lto}, not: {' '.join(cflags)}")
    language_sent = language if stage == "compile" else None
    request = {"op": "flags", "level": level, "problem": problem, "language": language_sent}
    reply = by_hand(path, may_start, request | {"stage": stage})
    flags = reply.get("flags")
    if not (isinstance(flags, list) and all(isinstance(f, str) for f in flags)):
        raise ServiceError(f"the mlgo service sent flags that are not strings: {str(flags)[:80]}")
    flags = check_lease_flags(flags, path.parent)
    note = reply.get("note")
    linked = at_link(flags) if stage != "compile" else flags
    return linked, note if isinstance(note, str) else None


def check_policies(served: object) -> str | None:
    """What is wrong when MLGO_POLICY is set and the service serves other policies."""
    wanted = os.environ.get("MLGO_POLICY")
    if not wanted:
        return None
    if sorted(os.path.realpath(p) for p in wanted.split(os.pathsep)) == sorted(served or ()):
        return None
    names = ", ".join(served) if isinstance(served, list) else "unnamed policies"
    return f"the running mlgo service serves {names}, not MLGO_POLICY={wanted} (mlgo stop it)"


def _lease(
    level: str, language: str | None, stage: str, timeout_s: float
) -> tuple[Connection | None, list[str], str | None, str | None, str | None]:
    """A lease for a compile (or a link: STAGE) at LEVEL in LANGUAGE within TIMEOUT_S (at
    most CONNECT_TIMEOUT_S: a service silent that long is not answering): its connection
    (None when no policy serves it), its flags (checked), what is wrong with its policies,
    the service's note, and the guard its policies must be served under."""
    path = socket_path()
    wait = min(timeout_s, CONNECT_TIMEOUT_S)  # what a busy service's line says it waited
    deadline = time.monotonic() + wait
    conn = connect(path, not os.environ.get("MLGO_SOCKET"), wait)
    try:
        conn.send({"op": "compile", "level": level, "language": language, "stage": stage})
        reply = conn.receive(deadline - time.monotonic())
        flags = reply["flags"]
        if not (isinstance(flags, list) and all(isinstance(f, str) for f in flags)):
            raise ServiceError(f"flags that are not a list of strings: {str(flags)[:80]}")
    except BusyError:  # it did not answer: said as it is, it refused nothing
        conn.close()
        raise
    except (ServiceError, KeyError, TypeError) as e:
        conn.close()
        raise ServiceError(f"the mlgo service refused a lease: {e}") from e
    note = reply.get("note") if isinstance(reply.get("note"), str) else None
    if "lease" not in reply:
        conn.close()
        return None, [], None, note, None
    guard = reply.get("guard")
    try:
        flags = check_lease_flags(flags, path.parent)
        if guard is not None and guard not in GUARDS:
            raise ServiceError(f"the mlgo service asks for an unknown guard {str(guard)[:40]!r}")
    except ServiceError:
        conn.close()
        raise
    return conn, flags, check_policies(reply.get("policies")), note, guard


def timeout_from_env() -> tuple[float, str | None]:
    """MLGO_TIMEOUT in seconds, and what is wrong with it (then the default is used)."""
    text = os.environ.get("MLGO_TIMEOUT")
    if text is None:
        return DEFAULT_TIMEOUT_S, None
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if math.isfinite(value) and value > 0:
        return value, None
    return DEFAULT_TIMEOUT_S, f"MLGO_TIMEOUT={text!r} is not a positive number of seconds"


def _temporary_file() -> IO[bytes]:
    """The compiler's stderr, kept to be shown or not, in TMPDIR (else /tmp, as tempfile
    chooses): one that cannot be made (a full or unusable directory) is a ServiceError, so
    the compile falls back to clang's own, never fails."""
    try:
        return tempfile.TemporaryFile()
    except OSError as e:
        raise ServiceError(f"cannot create a temporary file ({e})") from e


def _marks_file() -> IO[bytes] | nullcontext[None]:
    """Where a plugin says whether it made clang's own object; none when it cannot be made
    (the guard then compiles the default as well, as the native wrapper does)."""
    try:
        return tempfile.NamedTemporaryFile(prefix=DEPARTURES_PREFIX)
    except OSError:
        return nullcontext()


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
            # select() cannot wait past a time_t; a huge MLGO_TIMEOUT just loops.
            ready, _, _ = select.select([pidfd, conn], [], [], min(remaining, 86400.0))
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


def _guard(
    compiler: str,
    args: list[str],
    sources: list[str],
    stage: str,
    source: str,
    strict: bool,
    entry: Path | None,
    began: float,
) -> int:
    """MLGO_GUARD=size after the policy's compile (or link) succeeded: the smaller output
    stays, and where there is an ENTRY its winner is remembered there (`memo`), with the
    inputs as they were when it BEGAN. SOURCE: what the messages name."""
    output = guarded_object(args, sources) if stage == "compile" else guarded_link(args)
    problem, winner = (
        keep_smaller(compiler, args, output, socket_path().parent) if output else (None, None)
    )
    if winner and entry:
        memo.remember(entry, winner, memo.link_inputs(args), began)
    if not problem:
        return 0
    if strict:
        return _error(f"the size guard failed: {problem}", source)
    what = "object" if stage == "compile" else "link"
    _warn(f"the size guard failed: {problem}; keeping the policy's {what} for {source}")
    return 0


def _compile_plain_after(
    returncode: int, failure: bytes, compiler: str, args: list[str], source: str, stage: str
) -> int:
    """The compile with the policy failed: compile SOURCE as plain clang does. If that fails
    too, the error is the user's and shows as clang says it; if it passes, the policy's
    flags broke the compile (a plugin that does not load, an MLGO_CC that is not clang):
    one warning, and the object is plain clang's. A failing compile so costs two."""
    plain = subprocess.run([compiler, *args]).returncode
    if plain == 0:
        why = error_line(failure.decode(errors="replace"))
        what, done = ("compile", "compiled") if stage == "compile" else ("link", "linked")
        _warn(
            f"the {what} with the policy failed (exit {returncode}: {why}); "
            f"{done} {source} with the default heuristic"
        )
    return plain


def _tallied(conn: Connection, returncode: int, problem: str | None) -> str | None:
    """The lease's end: the compile's RETURNCODE told, then every event and the tally read
    within one wait (a service that keeps sending events cannot hold the build); PROBLEM,
    or else the first the service reports. After a timeout the answer is not awaited:
    whatever hung may hold it up too, and MLGO_TIMEOUT bounds the whole compilation."""
    try:
        conn.send({"op": "done", "returncode": returncode})
        if not (problem or "").startswith(TIMED_OUT):
            tally_by = time.monotonic() + CONNECT_TIMEOUT_S
            while "event" in (tally := conn.receive(tally_by - time.monotonic())):
                problem = problem or tally.get("message")
            if tally["errors"]:
                problem = problem or tally["errors"][0]
    except (ServiceError, KeyError) as e:
        problem = problem or str(e)
    return problem


def run(compiler: str, args: list[str], cxx_driver: bool = False) -> int:
    if os.environ.get("MLGO_DISABLE"):
        os.execvp(compiler, [compiler, *args])
    # What clang reads decides (response files expanded); the compiler gets ARGS as they are.
    # The guard's default compile is a command of its own: it takes the expanded arguments,
    # since it must leave out the outputs that a response file may name.
    seen = expand_response_files(args)
    stage = link_stage(seen) or "compile"
    level = opt_level(seen) if stage != "compile" or optimizes(seen) else None
    if level is None:
        os.execvp(compiler, [compiler, *args])
    strict = bool(os.environ.get("MLGO_STRICT"))
    sources = source_files(seen)
    source = sources[0] if sources else link_output(seen)  # what the messages name
    doing = "compiling" if stage == "compile" else "linking"
    timeout_s, problem = timeout_from_env()
    if problem:
        if strict:
            return _error(problem, source)
        _warn(f"{problem}; using {DEFAULT_TIMEOUT_S:g} s")
    guard, problem = guard_from_env()
    if problem:
        if strict:
            return _error(problem, source)
        _warn(f"{problem}; {doing} {source} without a guard")
    try:
        language = compile_language(seen, cxx_driver) if stage == "compile" else None
        err = _temporary_file()
        conn, flags, problem, note, policy_guard = _lease(level, language, stage, timeout_s)
        guard = guard or policy_guard  # a policy shipped guarded is served so
    except ServiceError as e:
        problem = str(e)
    else:
        if note:
            print(f"mlgo-cc: note: {note} (first: {source})", file=sys.stderr, flush=True)
        if conn is None:  # no policy serves this level or language: the compiler as is
            os.execvp(compiler, [compiler, *args])
        if stage != "compile" and not links_with_lld(seen):
            conn.close()
            print(
                f"mlgo-cc: note: a link-time policy needs lld (-fuse-ld=lld); "
                f"linking {source} with clang's default",
                file=sys.stderr,
                flush=True,
            )
            os.execvp(compiler, [compiler, *args])
        if stage != "compile":
            flags = at_link(flags)
        # a guarded link remembered: the winner alone (a compile's memory is the native one's)
        linked = guard and stage != "compile" and guarded_link(seen)
        entry = memo.link_entry(compiler, seen, flags) if linked else None
        winner = memo.remembered(entry) if entry else None
        if winner == "default":
            conn.close()
            os.execvp(compiler, [compiler, *args])
        if winner == "policy":
            guard = None
        began = time.time()
        if problem and strict:
            conn.close()
            return _error(problem, source)
        if problem:  # the served policies still compile it: say they are not the ones asked
            _warn(problem)
        # served by the plugin, a guarded compile says whether it made clang's own object
        by_plugin = any(f.startswith(PLUGIN_FLAG) for f in flags)
        want_marks = bool(guard) and stage == "compile" and by_plugin
        with conn, err, _marks_file() if want_marks else nullcontext() as marks:
            env = {**os.environ, DEPARTURES_ENV: marks.name} if marks else None
            proc = subprocess.Popen([compiler, *args, *flags], stderr=err, env=env)
            problem = _tallied(conn, proc.returncode, _watch(proc, conn, timeout_s))
            if problem is None and proc.returncode < 0:
                problem = f"the compiler died of signal {-proc.returncode}"
            err.seek(0)
            failure = err.read()
            if problem is None and (proc.returncode == 0 or strict):
                sys.stderr.buffer.write(failure)
                sys.stderr.flush()
            if marks and made_default_object(Path(marks.name).read_text()):
                guard = None  # the guard's compile would make the same object
        if problem is None and proc.returncode != 0 and not strict:
            return _compile_plain_after(proc.returncode, failure, compiler, args, source, stage)
        if problem is None:  # the lease is over: a guard's second compile holds nothing
            if guard and proc.returncode == 0:
                return _guard(compiler, seen, sources, stage, source, strict, entry, began)
            return proc.returncode
    if strict:
        return _error(problem, source)
    _warn(f"{problem}; {doing} {source} with the default heuristic")
    os.execvp(compiler, [compiler, *args])


def main_c() -> None:
    sys.exit(run(os.environ.get("MLGO_CC", "clang-22"), sys.argv[1:]))


def main_cxx() -> None:
    sys.exit(run(os.environ.get("MLGO_CXX", "clang++-22"), sys.argv[1:], cxx_driver=True))


if __name__ == "__main__":  # the native wrapper hands over: python -m mlgo.serve.cc cc|c++ ARGS
    language = sys.argv[1] if len(sys.argv) > 1 else "cc"
    sys.argv = [f"mlgo-{language}", *sys.argv[2:]]
    main_cxx() if language == "c++" else main_c()
