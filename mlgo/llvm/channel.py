"""The interactive channel: a FIFO pair on which the compiler asks and a policy answers.

LLVM's InteractiveModelRunner opens `BASE.in` (advice, policy -> compiler) for reading
first and `BASE.out` (observations, compiler -> policy) for writing second. The policy
side must open in the same order or both sides block forever, so the write end is opened
non-blocking in a polling loop that also watches the compiler, and every read has a
deadline. Nothing here can hang: a dead, crashed or stuck compiler becomes a
`ChannelError` naming what happened, with the compiler's last stderr line.
"""

from __future__ import annotations

import atexit
import fcntl
import os
import re
import select
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from mlgo.errors import MlgoError
from mlgo.llvm.log_format import (
    ChannelTimeout,
    Header,
    LogFormatError,
    LogReader,
    Observation,
    TimedReader,
)
from mlgo.runtime.lifetime import dying_with_parent
from mlgo.runtime.trust import private_temp_dir

# A policy sees one observation and answers the advice (an int, or an array for
# multi-element advice).
Policy = Callable[[Observation], "int | np.ndarray"]


class ChannelError(MlgoError):
    """A compilation through the channel failed; the message is one line."""


@dataclass
class Decision:
    observation: Observation
    advice: np.ndarray


@dataclass
class SessionResult:
    header: Header | None  # None when the compiler never opened the channel
    decisions: list[Decision] = field(default_factory=list)
    returncode: int = 0
    stderr: str = ""
    seconds: float = 0.0


_run_dirs: dict[int, Path] = {}  # per process id: a forked child makes its own
_locks: list[int] = []  # held open for the life of the process


def run_dir() -> Path:
    """This process's directory for the FIFOs it makes, TMPDIR/mlgo-UID/run-XXXX.

    A killed process (SIGKILL, a lost machine) cannot remove its temp directories, so each
    process holds a lock on a file in its own; the first channel of every later process
    removes each run directory whose lock nobody holds, i.e. whose process is gone."""
    pid = os.getpid()
    if pid not in _run_dirs:
        root = private_temp_dir()
        for lock in root.glob("run-*/lock"):
            try:
                with open(lock) as f:
                    fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    shutil.rmtree(lock.parent, ignore_errors=True)
            except BlockingIOError:
                continue  # its process is alive
            except FileNotFoundError:
                continue  # a sibling process swept it first
        mine = Path(tempfile.mkdtemp(prefix="run-", dir=root))
        # locked before it is named `lock`: a sweeper never sees it unlocked
        fd, tmp = tempfile.mkstemp(dir=mine)
        fcntl.flock(fd, fcntl.LOCK_EX)
        os.rename(tmp, mine / "lock")
        _locks.append(fd)
        atexit.register(shutil.rmtree, mine, True)
        _run_dirs[pid] = mine
    return _run_dirs[pid]


@contextmanager
def fifo_pair(directory: str | None = None) -> Iterator[str]:
    """Creates BASE.in and BASE.out as FIFOs in a private temp dir (in this process's
    run_dir unless DIRECTORY is given); yields BASE."""
    with tempfile.TemporaryDirectory(prefix="ch-", dir=directory or run_dir()) as d:
        base = os.path.join(d, "ch")
        os.mkfifo(base + ".in", 0o600)
        os.mkfifo(base + ".out", 0o600)
        yield base


# In a crash dump: a stack frame with a symbol, and the pass that was running.
_FRAME = re.compile(r"^#\d+ 0x[0-9a-f]+ ([^\s(]+)")
_PASS = re.compile(r'Running pass "([^"<(]+)[^"]*" on function "([^"]+)"')


def last_line(text: str) -> str:
    """The one line of clang's stderr that says what went wrong: an error or a failed
    assertion; for a crash, the first frame past LLVM's signal handling and the pass."""
    lines = [ln.strip() for ln in text.strip().splitlines() if ln.strip()]
    for ln in lines:
        if "error:" in ln.lower() or "Assertion" in ln:
            return ln[:300]
    frames = [
        m[1] for ln in lines if (m := _FRAME.match(ln)) and not m[1].startswith("llvm::sys::")
    ]
    if frames:
        passes = [m for ln in lines if (m := _PASS.search(ln))]
        where = f" (pass {passes[-1][1]} on {passes[-1][2]})" if passes else ""
        return f"crashed in {frames[0]}{where}"[:300]
    return lines[-1][:300] if lines else "(no stderr)"


def _open_advice_end(path: str, alive: Callable[[], bool], timeout_s: float) -> int | None:
    """Opens BASE.in for writing as soon as the compiler opens it for reading.

    A blocking open in a thread returns the moment the compiler arrives (no polling
    latency); if the compiler dies or the deadline passes, opening the FIFO's read end
    ourselves releases that thread. Returns None if the compiler finished without ever
    opening the channel.
    """
    box: dict = {}

    def opener() -> None:
        try:
            box["fd"] = os.open(path, os.O_WRONLY)
        except OSError as e:
            box["error"] = e

    thread = threading.Thread(target=opener, name="mlgo-open", daemon=True)
    thread.start()
    deadline = time.monotonic() + timeout_s
    while thread.is_alive():
        thread.join(0.01)
        timed_out = time.monotonic() > deadline
        if thread.is_alive() and (timed_out or not alive()):
            release = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
            thread.join()
            os.close(release)
            if "fd" in box:
                os.close(box["fd"])
            if timed_out:
                raise ChannelTimeout(f"compiler did not open the channel within {timeout_s:g} s")
            return None
    if "error" in box:
        raise box["error"]
    return box["fd"]


def serve(
    base: str,
    policy: Policy,
    alive: Callable[[], bool],
    timeout_s: float,
    validate: Callable[[Observation, np.ndarray], None] | None = None,
) -> tuple[Header | None, list[Decision]]:
    """Answers every decision of one compilation on channel BASE until the compiler closes it.

    `validate` checks an answer against the observation (e.g. a regalloc mask) before the
    compiler sees it and raises ValueError for an illegal one.
    """
    wfd = _open_advice_end(base + ".in", alive, timeout_s)
    if wfd is None:
        return None, []
    rfd = os.open(base + ".out", os.O_RDONLY | os.O_NONBLOCK)
    decisions: list[Decision] = []
    try:
        reader = LogReader(TimedReader(rfd, timeout_s, alive))
        spec = reader.header.advice
        if spec is None:
            raise LogFormatError("channel header has no advice tensor")
        for obs in reader.observations():
            try:
                answer = policy(obs)
                if isinstance(answer, int | np.integer):  # the common case, kept cheap
                    advice = np.array([answer], spec.dtype)
                else:
                    advice = np.asarray(answer, dtype=spec.dtype).reshape(-1)
            except Exception as e:  # the policy is user code: report, don't propagate raw
                raise ChannelError(
                    f"policy failed on decision {obs.index}: {type(e).__name__}: {e}"
                ) from e
            if advice.size != spec.num_elements:
                raise ChannelError(
                    f"policy answered {advice.size} values on decision "
                    f"{obs.index}; advice {spec.name} wants {spec.num_elements}"
                )
            if validate is not None:
                try:
                    validate(obs, advice)
                except ValueError as e:
                    raise ChannelError(f"illegal advice on decision {obs.index}: {e}") from e
            os.write(wfd, advice.tobytes())
            decisions.append(Decision(obs, advice))
        return reader.header, decisions
    finally:
        os.close(rfd)
        os.close(wfd)


def compile_interactive(
    cmd: list[str],
    policy: Policy,
    channel_flags: Callable[[str], list[str]],
    timeout_s: float = 300.0,
    validate: Callable[[Observation, np.ndarray], None] | None = None,
    cwd: str | Path | None = None,
) -> SessionResult:
    """Runs the compiler `cmd` + the channel flags and answers its decisions with `policy`.

    The compiler is always reaped; on any failure it is killed and a ChannelError says
    what went wrong, including the compiler's own stderr when it was the one that failed.
    """
    start = time.monotonic()
    with fifo_pair() as base, tempfile.TemporaryFile() as err:
        argv, preexec = dying_with_parent(cmd + channel_flags(base))
        proc = subprocess.Popen(  # a killed worker must not leave clang waiting
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=err,
            cwd=cwd,
            preexec_fn=preexec,
        )

        def stderr_text() -> str:
            err.seek(0)
            return err.read().decode(errors="replace")

        try:
            header, decisions = serve(
                base, policy, lambda: proc.poll() is None, timeout_s, validate
            )
            rc = _wait(proc, timeout_s)
        except (
            ChannelError,
            ChannelTimeout,
            LogFormatError,
            OSError,
            subprocess.TimeoutExpired,
        ) as e:
            raise ChannelError(_explain_failure(proc, e, stderr_text)) from e
        finally:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
        if rc != 0:
            raise ChannelError(f"compiler exited with {rc}: {last_line(stderr_text())}")
        return SessionResult(header, decisions, rc, stderr_text(), time.monotonic() - start)


def _wait(proc: subprocess.Popen, timeout_s: float) -> int:
    """Popen.wait(timeout) polls with sleeps of up to 50 ms, a lot next to a small
    compile; a pidfd wakes us the moment the compiler exits."""
    if proc.poll() is not None:
        return proc.returncode
    try:
        fd = os.pidfd_open(proc.pid)
    except ProcessLookupError:  # exited (and was reaped) just now
        return proc.wait()
    try:
        ready, _, _ = select.select([fd], [], [], timeout_s)
    finally:
        os.close(fd)
    if not ready:
        raise subprocess.TimeoutExpired(proc.args, timeout_s)
    return proc.wait()


def _explain_failure(proc: subprocess.Popen, e: Exception, stderr_text) -> str:
    """One line: the compiler's own error if it died, else what went wrong on our side."""
    if isinstance(e, LogFormatError | OSError):
        # A torn stream usually means the compiler is dying; give it a moment to finish.
        with suppress(subprocess.TimeoutExpired):
            proc.wait(timeout=1)
    rc = proc.poll()
    if rc not in (None, 0):
        return f"compiler exited with {rc}: {last_line(stderr_text())}"
    return str(e) if isinstance(e, ChannelError) else f"{type(e).__name__}: {e}"


def serve_in_thread(
    base: str, policy: Policy, timeout_s: float, validate=None
) -> tuple[threading.Thread, dict]:
    """Serves channel BASE from a thread, for an in-process compiler (llvmlite).

    The returned dict receives 'header' and 'decisions', or 'error'. The caller sets
    'done' once its compilation returns so that the server stops waiting.
    """
    box: dict = {}

    def run() -> None:
        try:
            box["header"], box["decisions"] = serve(
                base, policy, lambda: not box.get("done"), timeout_s, validate
            )
        except Exception as e:  # handed to the caller's thread
            box["error"] = e

    thread = threading.Thread(target=run, name="mlgo-channel", daemon=True)
    thread.start()
    return thread, box
