"""The policy service: a long-lived daemon that answers many compilations at once.

It loads each policy once and hands every compilation the compiler flags that bring it
the policies (a lease). Backends:
- `plugin`: the inlining policy compiled into a clang pass plugin (mlgo/ship/plugin.py), so
  clang decides in-process; the lease is only a flag. The fastest, by far.
- `native`: a fresh FIFO channel per problem, answered by the AOT-compiled policy server
  (mlgo/ship/aot.py) in a C++ thread with no Python per decision.
- `python`: a channel answered by the trained numpy policy in a Python thread (the
  reference, and the fallback where no C++ compiler is available).
`auto` (the default) takes the plugin for the problems that have one, native otherwise.
The daemon only does the control plane: leases, cleanup, error events and statistics.

A channel that fails (policy crash, garbage answer, a compiler with another feature
layout) raises an error event on its lease at once, so `mlgo-cc` can kill the stuck
compiler and fall back to the default heuristic: clang waits forever for advice that
never comes, so the event, not a timeout, is what keeps builds from hanging.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import queue
import signal
import socketserver
import stat
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

import numpy as np

from mlgo.problems import Problem, get_problem
from mlgo.serve.client import Connection, ServiceError, UntrustedError, runtime_dir

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

    def __init__(self, policy_dir: Path):
        from mlgo.llvm.toolchain import find_toolchain
        from mlgo.ship.plugin import inliner_plugin

        self.flags = [f"-fpass-plugin={inliner_plugin(policy_dir, find_toolchain())}"]

    def latency(self) -> dict[str, float]:
        return {}

    def close(self) -> None:
        pass


class PythonBackend:
    """Serves each channel from a Python thread with the trained numpy policy."""

    name = "python"

    def __init__(self, policy_dir: Path, events: Events):
        from mlgo.problems.policy import MLPPolicy

        self.policy = MLPPolicy.load(policy_dir)
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


Backend = NativeBackend | PythonBackend | PluginBackend


@dataclass
class ServedPolicy:
    problem: Problem
    path: Path
    backend: Backend


@dataclass
class Lease:
    id: str
    channels: dict[str, tuple[ServedPolicy, str]]  # channel id -> (policy, FIFO base)
    plugin_flags: list[str] = field(default_factory=list)
    notify: Callable[[dict], None] | None = None  # events to the client holding the lease
    detached: bool = False
    decisions: int = 0
    sessions: int = 0
    errors: list[str] = field(default_factory=list)
    ended: threading.Event = field(default_factory=threading.Event)

    @property
    def flags(self) -> list[str]:
        channels = [
            f for p, base in self.channels.values() for f in p.problem.flags_for_serving(base)
        ]
        return channels + self.plugin_flags


class Service:
    """The daemon's state: policies, leases and counters."""

    def __init__(self, policy_dirs: list[Path], backend: str, runtime: Path | None = None):
        self.runtime = runtime or runtime_dir()
        self.channel_dir = self.runtime / "channels"
        self.channel_dir.mkdir(mode=0o700, exist_ok=True)
        self.started = time.time()
        self.leases: dict[str, Lease] = {}
        self._by_channel: dict[str, Lease] = {}
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self.compilations = self.decisions = self.failed = 0
        self.last_activity = time.monotonic()
        self.policies = [self._load(Path(d), backend) for d in policy_dirs]
        if len({p.problem.name for p in self.policies}) != len(self.policies):
            raise ValueError("two policies for the same problem; serve one per problem")

    def _load(self, directory: Path, backend: str) -> ServedPolicy:
        try:
            meta = json.loads((directory / "policy.json").read_text())
        except (OSError, ValueError) as e:
            raise ValueError(f"{directory}: not a policy directory ({e})") from e
        problem = get_problem(meta["problem"])
        if backend in ("auto", "plugin"):
            from mlgo.ship.plugin import PLUGIN_PROBLEMS

            if problem.name in PLUGIN_PROBLEMS:
                return ServedPolicy(problem, directory.resolve(), PluginBackend(directory))
            if backend == "plugin":
                raise ValueError(f"{directory}: {problem.name} has no plugin; use --backend native")
            backend = "native"
        if backend == "native":
            from mlgo.ship.aot import native_server

            binary = native_server(directory / "saved_model")
            log = self.runtime / f"policy-server-{problem.name}.log"
            served: Backend = NativeBackend(binary, log, self)
        elif backend == "python":
            served = PythonBackend(directory, self)
        else:
            raise ValueError(f"unknown backend {backend!r}; use auto, plugin, native or python")
        return ServedPolicy(problem, directory.resolve(), served)

    # -- events from backends -------------------------------------------------------
    def on_session(self, cid: str, decisions: int) -> None:
        with self._lock:
            lease = self._by_channel.get(cid)
            if lease is None:
                return
            lease.decisions += decisions
            lease.sessions += 1
        if lease.detached:  # a by-hand channel serves one compilation
            threading.Thread(target=self.end_lease, args=(lease,), daemon=True).start()

    def on_error(self, cid: str, message: str) -> None:
        with self._lock:
            lease = self._by_channel.get(cid)
            if lease is None:
                return
            lease.errors.append(message)
        if lease.notify is not None:
            lease.notify({"event": "error", "message": message})
        if lease.detached:
            threading.Thread(target=self.end_lease, args=(lease,), daemon=True).start()

    # -- leases ----------------------------------------------------------------------
    def open_lease(
        self, problem: str | None = None, notify: Callable[[dict], None] | None = None
    ) -> Lease:
        """A lease for one compilation. NOTIFY gets its error events as they happen; a lease
        without one is detached: a channel by hand, which ends after one compilation."""
        detached = notify is None
        chosen = [p for p in self.policies if problem in (None, p.problem.name)]
        if not chosen:
            raise ValueError(f"this service serves no policy for {problem!r}")
        if detached:  # a channel by hand: a plugin has none to give
            chosen = [p for p in chosen if not isinstance(p.backend, PluginBackend)]
            if not chosen:
                raise ValueError(
                    "this service's policy runs inside clang (-fpass-plugin), not on a "
                    "channel; for a channel by hand, serve with --backend native"
                )
        with self._lock:
            lease = Lease(f"{os.getpid()}-{next(self._ids)}", {}, notify=notify, detached=detached)
            self.leases[lease.id] = lease
            self.last_activity = time.monotonic()
        for p in chosen:
            if isinstance(p.backend, PluginBackend):  # no channel: a flag is all it takes
                lease.plugin_flags += p.backend.flags
                continue
            cid = f"{lease.id}-{p.problem.name}"
            base = str(self.channel_dir / cid)
            os.mkfifo(base + ".in", 0o600)
            os.mkfifo(base + ".out", 0o600)
            lease.channels[cid] = (p, base)
            with self._lock:
                self._by_channel[cid] = lease
            p.backend.start(cid, base, p.problem)
        return lease

    def end_lease(self, lease: Lease, returncode: int | None = None) -> dict:
        with self._lock:
            if lease.ended.is_set():
                return self._tally(lease)
            lease.ended.set()
        for cid, (p, base) in lease.channels.items():
            assert not isinstance(p.backend, PluginBackend)  # it has no channels
            p.backend.stop(cid, base)
            for suffix in (".in", ".out"):
                Path(base + suffix).unlink(missing_ok=True)
        with self._lock:
            for cid in lease.channels:
                self._by_channel.pop(cid, None)
            self.leases.pop(lease.id, None)
            self.compilations += 1
            self.decisions += lease.decisions
            self.failed += bool(lease.errors) or bool(returncode)
            self.last_activity = time.monotonic()
        return self._tally(lease)

    @staticmethod
    def _tally(lease: Lease) -> dict:
        return {"decisions": lease.decisions, "sessions": lease.sessions, "errors": lease.errors}

    def status(self) -> dict:
        with self._lock:
            counters = {
                "pid": os.getpid(),
                "uptime_s": time.time() - self.started,
                "active_leases": len(self.leases),
                "compilations": self.compilations,
                "decisions": self.decisions,
                "failed_compilations": self.failed,
            }
        counters["policies"] = [
            {
                "problem": p.problem.name,
                "path": str(p.path),
                "backend": p.backend.name,
                "latency": p.backend.latency(),
            }
            for p in self.policies
        ]
        return counters

    def clear_stale_channels(self) -> None:
        """Removes the FIFOs of a service that was killed: only once no service is live."""
        for stale in self.channel_dir.iterdir():
            stale.unlink()

    def close(self) -> None:
        for lease in list(self.leases.values()):
            self.end_lease(lease)
        for p in self.policies:
            p.backend.close()


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def _send(self, message: dict) -> None:
        with self.write_lock:
            self.wfile.write(json.dumps(message).encode() + b"\n")
            self.wfile.flush()

    def handle(self) -> None:
        self.write_lock = threading.RLock()
        service = self.server.service
        line = self.rfile.readline()
        try:
            message = json.loads(line or b"{}")
            op = message.get("op")
            if op == "compile":
                self._compile(service)
            elif op == "channel":
                lease = service.open_lease(message.get("problem"))
                (_policy, base), *_ = lease.channels.values()
                self._send({"base": base, "lease": lease.id})
                expiry = threading.Timer(
                    float(message.get("ttl_s", 600)), service.end_lease, (lease,)
                )
                expiry.daemon = True
                expiry.start()
            elif op == "status":
                self._send(service.status())
            elif op == "stop":
                self._send({"stopping": True})
                threading.Thread(target=self.server.shutdown, daemon=True).start()
            else:
                self._send({"error": f"unknown request {line[:80]!r}"})
        except (ValueError, OSError, AttributeError) as e:
            with contextlib.suppress(OSError):  # the client may be gone too
                self._send({"error": f"{type(e).__name__}: {e}"})

    def _notify(self, event: dict) -> None:
        """Sends an event as it happens, from whichever thread saw it; the lock keeps it
        whole and before the tally."""
        with contextlib.suppress(OSError):  # a killed client: its lease ends on its own
            self._send(event)

    def _compile(self, service: Service) -> None:
        with self.write_lock:  # no event before the flags
            lease = service.open_lease(notify=self._notify)
            policies = [str(p.path) for p in service.policies]  # what answers, for MLGO_POLICY
            self._send({"lease": lease.id, "flags": lease.flags, "policies": policies})
        returncode = None
        try:
            line = self.rfile.readline()  # blocks until the client is done or gone
            if line:
                returncode = json.loads(line).get("returncode")
        except (ValueError, OSError):
            pass
        finally:
            tally = service.end_lease(lease, returncode)
        with contextlib.suppress(OSError):  # a killed client: its lease is cleaned up already
            self._send(tally)


class _Server(socketserver.UnixStreamServer):
    """Handles each connection on a pooled daemon thread: starting a thread for every
    compilation cost the service more CPU than the lease itself."""

    service: Service

    def __init__(self, path: str):
        super().__init__(path, _Handler)
        self._pending: queue.SimpleQueue[tuple] = queue.SimpleQueue()
        self._idle = 0  # pooled threads waiting for a connection, none promised one yet
        self._idle_lock = threading.Lock()

    def process_request(self, request, client_address) -> None:
        with self._idle_lock:
            start_one = self._idle == 0
            self._idle -= not start_one
        self._pending.put((request, client_address))
        if start_one:
            threading.Thread(target=self._work, daemon=True).start()

    def _work(self) -> None:
        while True:
            request, client_address = self._pending.get()
            try:
                self.finish_request(request, client_address)
            except Exception:
                self.handle_error(request, client_address)
            finally:
                self.shutdown_request(request)
            with self._idle_lock:
                self._idle += 1


def claim_socket(socket_file: Path) -> None:
    """Makes SOCKET_FILE free to bind, touching nothing while a service answers there: only
    a stale socket of this user (no one listening) is removed; anything else is an error."""
    try:
        Connection(socket_file, 2.0).close()
    except UntrustedError:
        raise
    except ServiceError:
        pass  # no one listens there
    else:
        raise ServiceError(f"an mlgo service is already listening on {socket_file}")
    try:
        st = socket_file.lstat()
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(st.st_mode):
        raise ServiceError(
            f"{socket_file} exists and is not a socket; not replacing it (choose another --socket)"
        )
    socket_file.unlink()  # a stale socket of a dead service


def serve_forever(service: Service, socket_file: Path, idle_exit_s: float = 0.0) -> None:
    """Listens on SOCKET_FILE (0600) until stopped, idle for IDLE_EXIT_S seconds, or sent
    SIGTERM or SIGINT; the socket is removed on the way out."""
    claim_socket(socket_file)
    service.clear_stale_channels()
    old_umask = os.umask(0o177)
    try:
        server = _Server(str(socket_file))
    finally:
        os.umask(old_umask)
    server.service = service

    def idle_watch() -> None:
        while idle_exit_s > 0:
            time.sleep(min(idle_exit_s, 5.0))
            idle = time.monotonic() - service.last_activity
            if not service.leases and idle >= idle_exit_s:
                server.shutdown()
                return

    def stop(_signum: int, _frame: object) -> None:
        # shutdown() waits for serve_forever's loop, which runs on this very thread.
        threading.Thread(target=server.shutdown, daemon=True).start()

    threading.Thread(target=idle_watch, daemon=True).start()
    for signum in (signal.SIGTERM, signal.SIGINT):
        signal.signal(signum, stop)
    try:
        server.serve_forever(poll_interval=0.2)
    finally:
        server.server_close()
        socket_file.unlink(missing_ok=True)
        service.close()
