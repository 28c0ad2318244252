"""The policy service's socket server: one JSON request a connection, on a 0600 Unix socket."""

from __future__ import annotations

import contextlib
import json
import os
import queue
import signal
import socketserver
import stat
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import BinaryIO

from mlgo.errors import UsageError
from mlgo.llvm.languages import LANGUAGES
from mlgo.problems import STAGES
from mlgo.runtime.inputs import MAX_JSON_DEPTH, json_depth
from mlgo.serve.client import Connection, NoServiceError, ServiceError
from mlgo.serve.service import Lease, Service

# The longest request line read: a client's requests are a few hundred bytes (an op, a
# level, a language, a problem's name); a longer one ends its connection with one error
# reply, before it costs the service its memory.
MAX_REQUEST_BYTES = 64 << 10
# How long a lease by hand waits for its compiler (`ttl_s`): by default, and at most.
DEFAULT_TTL_S = 600.0
MAX_TTL_S = 86400.0
# Pooled handler threads kept waiting for a connection; beyond them a thread whose
# connection ended exits, so a burst of connections leaves no lasting crowd.
MAX_IDLE_THREADS = 8
# How long a connection may take to send its first request: a client that connects and
# says nothing must not hold a handler thread for good.
REQUEST_WAIT_S = 10.0


def _request(rfile: BinaryIO) -> dict | None:
    """The next request on a connection (None once the client is done), bounded before it
    is parsed: a line over MAX_REQUEST_BYTES or nested deeper than MAX_JSON_DEPTH is a
    UsageError, not the service's memory or a RecursionError."""
    line = rfile.readline(MAX_REQUEST_BYTES + 1)
    if not line:
        return None
    if len(line) > MAX_REQUEST_BYTES:
        raise UsageError(f"a request is at most {MAX_REQUEST_BYTES} bytes, a line")
    if json_depth(line) > MAX_JSON_DEPTH:
        raise UsageError(f"a request nests at most {MAX_JSON_DEPTH} levels deep")
    message = json.loads(line)
    if not isinstance(message, dict):
        raise UsageError(f"a request is a JSON object, not {line[:80]!r}")
    return message


def _ttl(message: dict) -> float:
    """A lease by hand's `ttl_s`: a number of seconds up to MAX_TTL_S (NaN, infinities and
    values of no lease's lifetime are refused, before any lease is opened)."""
    ttl = message.get("ttl_s", DEFAULT_TTL_S)
    if isinstance(ttl, bool) or not isinstance(ttl, int | float) or not 0 < ttl <= MAX_TTL_S:
        raise UsageError(f"a lease's ttl_s is a number of seconds up to {MAX_TTL_S:g}, not {ttl!r}")
    return float(ttl)


def _stage(message: dict) -> str:
    """A request's stage: a link (`mlgo-cc` driving a full-LTO link) or, by default, a
    compile (what wrappers built before links were served send)."""
    stage = message.get("stage", "compile")
    if stage not in STAGES:
        raise UsageError(f"a request's stage is one of {', '.join(STAGES)}, not {stage!r}")
    return stage


def _language(language: object) -> str | None:
    """A request's language: one `mlgo.llvm.languages` knows, None for anything else (a
    policy calibrated for some languages leaves such a compile to clang's default)."""
    return language if language in LANGUAGES else None


class _Handler(socketserver.StreamRequestHandler):
    server: _Server

    def _send(self, message: dict) -> None:
        with self.write_lock:
            self.wfile.write(json.dumps(message).encode() + b"\n")
            self.wfile.flush()

    def handle(self) -> None:
        self.write_lock = threading.RLock()
        service = self.server.service
        try:
            self.connection.settimeout(REQUEST_WAIT_S)
            message = _request(self.rfile) or {}
            self.connection.settimeout(None)  # a compile's lease lasts as long as its compile
            op = message.get("op")
            if op == "compile":
                self._compile(service, message)
            elif op == "channel":
                ttl = _ttl(message)
                lease = service.open_lease(message.get("problem"), channel=True)
                (policy, _backend, base), *_ = lease.channels.values()
                flags = policy.channel_flags(base)
                self._send({"base": base, "lease": lease.id, "flags": flags})
                self._expire(service, lease, ttl)
            elif op == "flags":
                self._flags(service, message)
            elif op == "status":
                self._send(service.status())
            elif op == "stop":
                self._send({"stopping": True})
                threading.Thread(target=self.server.shutdown, daemon=True).start()
            else:
                self._send({"error": f"unknown request {str(message)[:80]!r}"})
        except (ValueError, OSError, AttributeError) as e:
            with contextlib.suppress(OSError):  # the client may be gone too
                self._send({"error": f"{type(e).__name__}: {e}"})

    @staticmethod
    def _expire(service: Service, lease: Lease, ttl_s: float) -> None:
        """Ends a lease by hand after TTL_S seconds if its compiler never came."""
        if lease.channels:
            expiry = threading.Timer(ttl_s, service.end_lease, (lease,))
            expiry.daemon = True
            expiry.start()

    def _flags(self, service: Service, message: dict) -> None:
        """The flags of a compilation by hand at the request's level, by each served policy's
        fastest route, and the note when the level leaves some policy to clang's default."""
        problem, level = message.get("problem"), message.get("level")
        language, stage = _language(message.get("language")), _stage(message)
        if not isinstance(level, str):
            raise UsageError(f"a flags request names its -O level, not {level!r}")
        ttl = _ttl(message)
        served, note = service.level_note(level, problem, language, stage)
        reply: dict = {"note": note} if note else {}
        if not served:
            self._send({"flags": [], **reply})
            return
        lease = service.open_lease(problem, level=level, language=language, stage=stage)
        if lease.guard:  # mlgo-cc guards it; a command line of the user's cannot
            unguarded = f"a served policy ships with the {lease.guard} guard: only mlgo-cc gives it"
            reply["note"] = f"{note}; {unguarded}" if note else unguarded
        self._send({"flags": lease.flags, "lease": lease.id, **reply})
        self._expire(service, lease, ttl)

    def _notify(self, event: dict) -> None:
        """Sends an event as it happens, from whichever thread saw it; the lock keeps it
        whole and before the tally."""
        with contextlib.suppress(OSError):  # a killed client: its lease ends on its own
            self._send(event)

    def _compile(self, service: Service, message: dict) -> None:
        """A lease for a compile at its level in its language; for one no policy serves, no
        lease: no flags and, the first time, the note saying why. A request without a
        language is from a native mlgo-cc built before languages were sent: refused, so that
        it hands the compile to the Python one, which sends it."""
        level, language = message.get("level"), _language(message.get("language"))
        stage = _stage(message)
        if not isinstance(level, str):
            raise UsageError(f"a compile request names its -O level, not {level!r}")
        if "language" not in message:
            raise UsageError("a compile request names its language; run mlgo install-wrappers")
        served, note = service.serving(level, language, stage)
        stale = _stale_native(message.get("native"))
        note = "; ".join(n for n in (note, stale and service.once(stale)) if n) or None
        policies = [str(p.path) for p in service.policies]  # what answers, for MLGO_POLICY
        reply: dict = {"policies": policies} | ({"note": note} if note else {})
        if not served:
            self._send({"flags": [], **reply})
            return
        with self.write_lock:  # no event before the flags
            lease = service.open_lease(
                notify=self._notify, level=level, language=language, stage=stage
            )
            guard = {"guard": lease.guard} if lease.guard else {}
            self._send({"lease": lease.id, "flags": lease.flags, **guard, **reply})
        returncode, handed_over = None, False
        try:
            done = _request(self.rfile) or {}  # blocks until the client is done or gone
            returncode, handed_over = done.get("returncode"), bool(done.get("handed_over"))
        except (ValueError, OSError):
            pass
        finally:
            tally = service.end_lease(lease, returncode, handed_over)
        with contextlib.suppress(OSError):  # a killed client: its lease is cleaned up already
            self._send(tally)


class _Server(socketserver.UnixStreamServer):
    """Handles each connection on a pooled daemon thread: starting a thread for every
    compilation cost the service more CPU than the lease itself. At most MAX_IDLE_THREADS
    wait for the next one; the others end with their connection."""

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
                if self._idle >= MAX_IDLE_THREADS:
                    return
                self._idle += 1


def claim_socket(socket_file: Path) -> None:
    """Makes SOCKET_FILE free to bind, touching nothing while a service answers there: only
    a stale socket of this user (no one listening) is removed; anything else is an error."""
    try:
        Connection(socket_file, 2.0).close()
    except NoServiceError:
        pass  # no one listens there: a connect refused, or no file at all
    except ServiceError as e:  # busy, stopped, or not ours: it stays as it is
        raise ServiceError(f"{e}; leaving {socket_file} as it is") from e
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
    bound = os.stat(socket_file)

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
        _unlink_if_ours(socket_file, bound)
        service.close()


def _unlink_if_ours(socket_file: Path, bound: os.stat_result) -> None:
    """Removes SOCKET_FILE if it is still the socket this service bound: another service
    may have taken the path since (after unlinking it), and its socket is not ours."""
    with contextlib.suppress(OSError):
        now = os.stat(socket_file)
        if (now.st_dev, now.st_ino) == (bound.st_dev, bound.st_ino):
            socket_file.unlink()


def run_service(
    policies: list[Path],
    backend: str,
    socket_file: Path,
    idle_exit_s: float,
    say: Callable[[str], None] = print,
) -> None:
    """The service, from its policy directories to its socket, until stopped: what `mlgo
    serve` and the service's own entry point (`python -m mlgo.serve`) both run."""
    claim_socket(socket_file)  # before loading anything: a live service there is left alone
    service = Service(policies, backend, runtime=socket_file.parent)  # channels beside it
    names = ", ".join(f"{p.problem.name} ({p.backend.name})" for p in service.policies)
    say(f"mlgo: serving {names} on {socket_file}")
    serve_forever(service, socket_file, idle_exit_s)


def _stale_native(build_id: object) -> str | None:
    """What to tell a user whose native mlgo-cc (BUILD_ID: the one it sends) was built by
    another mlgo than this service's: its lists may refuse what this one serves, and every
    compile it refuses goes through the Python wrapper, much slower. None when it is this
    mlgo's, or the request is not from a native wrapper."""
    from mlgo.serve.native_wrapper import native_build_id

    if build_id is None or build_id == native_build_id():
        return None
    return "the native mlgo-cc was built for another version of mlgo; run mlgo install-wrappers"
