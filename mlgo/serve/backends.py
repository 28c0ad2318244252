"""The policy service's backends: what answers a channel (or, for the plugin, clang itself).

- `plugin`: the inlining policy compiled into a clang pass plugin (mlgo/ship/plugin.py), so
  clang decides in-process; the lease is only a flag. The fastest, by far.
- `native`: a fresh FIFO channel per problem, answered by the AOT-compiled policy server
  (mlgo/ship/aot.py) in a C++ thread with no Python per decision.
- `python`: a channel answered by the trained numpy policy in a Python thread (the
  reference, and the fallback where no C++ compiler is available).

A channel that fails (policy crash, garbage answer, a compiler with another feature
layout) reports an error event at once (see `Events`): clang waits forever for advice that
never comes, so the event, not a timeout, is what keeps builds from hanging.
"""

from __future__ import annotations

import contextlib
import os
import queue
import subprocess
import threading
import time
from collections import deque
from pathlib import Path
from typing import Protocol

import numpy as np

from mlgo.problems import Problem
from mlgo.problems.policy import MLPPolicy
from mlgo.serve.client import ServiceError

RELEASE_INTERVAL_S = 0.005
CLOSE_TIMEOUT_S = 5.0


class Events(Protocol):
    """What a backend reports about a channel, by channel id."""

    def on_session(self, cid: str, decisions: int) -> None: ...
    def on_error(self, cid: str, message: str) -> None: ...


def release(base: str) -> None:
    """Opens both FIFO ends both ways, non-blocking, and closes them again: whoever is
    blocked opening the channel (a serving thread or a compiler) gets in and sees EOF."""
    for path in (base + ".in", base + ".out"):
        for flags in (os.O_RDONLY | os.O_NONBLOCK, os.O_WRONLY | os.O_NONBLOCK):
            # OSError: no peer is blocked on this side, or the FIFO is gone already.
            with contextlib.suppress(OSError):
                os.close(os.open(path, flags))


def percentiles_us(samples_ns: list[int] | np.ndarray) -> dict[str, float]:
    if len(samples_ns) == 0:
        return {}
    p50, p90, p99 = np.percentile(np.asarray(samples_ns, np.float64), [50, 90, 99]) / 1e3
    return {"p50_us": p50, "p90_us": p90, "p99_us": p99, "max_us": max(samples_ns) / 1e3}


class NativeBackend:
    """Drives one AOT-compiled policy_server process over its stdin/stdout."""

    name = "native"

    def __init__(self, binary: Path, log: Path, events: Events):
        self.binary, self.log, self.events = binary, log, events
        self._proc: subprocess.Popen | None = None
        self._lock = threading.Lock()
        self._open: dict[str, subprocess.Popen] = {}  # channel id -> the process serving it
        self._closed: dict[str, threading.Event] = {}
        self._stats: queue.Queue[str] = queue.Queue()
        self.restarts = -1

    def _ensure_running(self) -> subprocess.Popen:
        if self._proc is None or self._proc.poll() is not None:
            with open(self.log, "ab") as log:
                self._proc = subprocess.Popen(
                    [str(self.binary)],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=log,
                    env=dict(os.environ, TF_CPP_MIN_LOG_LEVEL="3"),
                )
            self.restarts += 1
            threading.Thread(target=self._read, args=(self._proc,), daemon=True).start()
        return self._proc

    @property
    def pid(self) -> int:
        """The policy server's process id (started if it is not running)."""
        return self._ensure_running().pid

    def _command(self, line: str) -> None:
        proc = self._ensure_running()
        try:
            assert proc.stdin is not None
            proc.stdin.write(line.encode() + b"\n")
            proc.stdin.flush()
        except OSError as e:
            raise ServiceError(f"policy server is gone ({e})") from e

    def _read(self, proc: subprocess.Popen) -> None:
        assert proc.stdout is not None
        for raw in proc.stdout:
            verb, _, rest = raw.decode(errors="replace").rstrip("\n").partition(" ")
            cid, _, arg = rest.partition(" ")
            if verb == "session":
                self.events.on_session(cid, int(arg))
            elif verb == "error":
                self.events.on_error(cid, arg)
            elif verb == "closed":
                self._closed.setdefault(cid, threading.Event()).set()
            elif verb == "stats":
                self._stats.put(rest)
        code = proc.wait()
        with self._lock:
            orphans = [cid for cid, server in self._open.items() if server is proc]
        for cid in orphans:  # every channel it was serving is dead: say so, and release
            self.events.on_error(cid, f"policy server exited with code {code}")
            self._closed.setdefault(cid, threading.Event()).set()

    def start(self, cid: str, base: str, problem: Problem) -> None:
        with self._lock:
            self._closed[cid] = threading.Event()
            self._command(f"serve {cid} {base}")
            self._open[cid] = self._ensure_running()

    def stop(self, cid: str, base: str) -> None:
        with self._lock:
            if self._proc is not None and self._proc.poll() is None:
                with contextlib.suppress(ServiceError):
                    self._command(f"cancel {cid}")
        closed = self._closed[cid]
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        # The serving thread is usually blocked opening the channel for the next compiler:
        # release it at once rather than after a first wait.
        while True:
            release(base)
            if closed.wait(RELEASE_INTERVAL_S) or time.monotonic() > deadline:
                break
        with self._lock:
            self._open.pop(cid, None)
            del self._closed[cid]

    def latency(self) -> dict[str, float]:
        with self._lock:
            if self._proc is None or self._proc.poll() is not None:
                return {}
            self._command("stats")
        try:
            fields = [int(x) for x in self._stats.get(timeout=2).split()]
        except queue.Empty:
            return {}
        if not fields[0]:
            return {}
        p50, p90, p99, top = (f / 1e3 for f in fields[1:])
        return {"p50_us": p50, "p90_us": p90, "p99_us": p99, "max_us": top}

    def close(self) -> None:
        if self._proc is not None:
            assert self._proc.stdin is not None
            self._proc.stdin.close()  # the server exits when its stdin closes
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


class PluginBackend:
    """The policy inside clang (-fpass-plugin): no channel, no process, no decision to count."""

    name = "plugin"

    def __init__(self, policy: MLPPolicy):
        from mlgo.llvm.toolchain import find_toolchain
        from mlgo.ship.plugin import inliner_plugin

        plugin = inliner_plugin(policy, find_toolchain())
        self.flags = [f"-fpass-plugin={plugin}", *policy.problem.advisor_flags, *policy.base_flags]

    def latency(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class PythonBackend:
    """Serves each channel from a Python thread with the trained numpy policy."""

    name = "python"

    def __init__(self, policy: MLPPolicy, events: Events):
        self.policy = policy
        self.events = events
        self._threads: dict[str, tuple[threading.Thread, threading.Event]] = {}
        self._latencies_ns: deque[int] = deque(maxlen=200_000)

    def _answer(self, obs):
        start = time.perf_counter_ns()
        answer = self.policy(obs)
        self._latencies_ns.append(time.perf_counter_ns() - start)
        return answer

    def _serve(self, cid: str, base: str, problem: Problem, cancelled: threading.Event) -> None:
        from mlgo.llvm.channel import ChannelError, serve
        from mlgo.llvm.log_format import ChannelTimeout, EmptyLog, LogFormatError

        def alive() -> bool:
            return not cancelled.is_set()

        while alive():
            try:
                header, decisions = serve(base, self._answer, alive, 86400.0, problem.validate)
            except EmptyLog:
                # The previous compiler still held BASE.in open as we reopened it, and
                # BASE.out had no writer yet: nobody has spoken. Wait for the next one.
                time.sleep(0.005)
                continue
            except (ChannelError, ChannelTimeout, LogFormatError, OSError, KeyError) as e:
                self.events.on_error(cid, f"{type(e).__name__}: {e}")
                return
            if header is None:
                return
            self.events.on_session(cid, len(decisions))

    def start(self, cid: str, base: str, problem: Problem) -> None:
        cancelled = threading.Event()
        thread = threading.Thread(
            target=self._serve, args=(cid, base, problem, cancelled), daemon=True
        )
        self._threads[cid] = (thread, cancelled)
        thread.start()

    def stop(self, cid: str, base: str) -> None:
        thread, cancelled = self._threads.pop(cid)
        cancelled.set()
        deadline = time.monotonic() + CLOSE_TIMEOUT_S
        while thread.is_alive() and time.monotonic() < deadline:
            release(base)
            thread.join(RELEASE_INTERVAL_S)

    def latency(self) -> dict[str, float]:
        return percentiles_us(list(self._latencies_ns))

    def close(self) -> None:
        pass


ChannelBackend = NativeBackend | PythonBackend
Backend = ChannelBackend | PluginBackend
