"""Talking to the policy service: where it listens, and its JSON-lines protocol.

Standard library only (and mlgo.runtime.messages, which is too), because `mlgo-cc` imports
this on every compiler invocation.
The service listens on a Unix socket in a private runtime directory (0700, socket 0600):
`$MLGO_SOCKET`, else `$XDG_RUNTIME_DIR/mlgo/mlgo.sock`, else `/tmp/mlgo-UID/mlgo.sock`.
Whatever answers there may put flags on the compiler's command line, so a client trusts
only a socket, and a directory, that this user owns and no one else may write, served by a
process of this user (SO_PEERCRED on the connection: the check no file swap can race).

Protocol: one JSON object per line each way.
- `{"op": "compile", "level": "-Oz", "language": "c"}` (the compile's effective -O level,
  and "c", "c++" or null, see mlgo.llvm.languages) opens a lease: the reply carries the
  compiler flags (one channel per problem served for that compile) and the resolved paths of
  the served policies, plus a `note` the first time a level and language leave some policy to
  clang's default. While the compiler runs the service may push
  `{"event": "error", ...}`; `{"op": "done", "returncode": N}` ends the lease and is answered
  with its tally. A lease also ends when its connection closes, so a killed client leaks
  nothing. For a compile no policy serves the reply has no `lease`: no flags, nothing to end.
- `{"op": "channel", "problem": P}`: a channel for one compilation run by hand, whatever
  backend serves P (a plugin-served policy gets a channel backend on the first request).
- `{"op": "flags", "level": L, "problem": P, "language": G}` (P, G optional): the flags of a
  compilation by hand at level L in language G, each policy by its fastest route (the
  plugin, else a channel that serves one compilation), plus the `note` when L and G leave
  some policy to clang's default.
- `{"op": "status"}`, `{"op": "stop"}`.
"""

from __future__ import annotations

import errno
import json
import os
import socket
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

from mlgo.errors import MlgoError
from mlgo.runtime.lifetime import die_with_parent
from mlgo.runtime.messages import WHOLE_LINE, error_line
from mlgo.runtime.trust import UntrustedPathError, private_dir

RUNTIME_WAY_OUT = "set XDG_RUNTIME_DIR to a directory of yours (or MLGO_SOCKET)"


class ServiceError(MlgoError):
    """The service is unreachable or answered an error; the message is one line."""


class UntrustedError(ServiceError):
    """The socket is not this user's alone: never used, never replaced by a new service."""


class NoServiceError(ServiceError):
    """No one listens on the socket (no file, or a connect refused): the one case in which
    a service may be started there, and a stale socket of this user's removed."""


class BusyError(ServiceError):
    """A service listens but does not answer in time (its backlog full, or stopped): never
    a reason to start another one or to touch its socket."""


# The longest line a client reads from the service: its replies are a few kB (the flags,
# the policies' paths, a note); anything longer is not the service speaking.
MAX_REPLY_BYTES = 1 << 20


def runtime_dir() -> Path:
    """The private runtime directory, created 0700; refused if anyone else could use it."""
    base = os.environ.get("XDG_RUNTIME_DIR")
    path = Path(base) / "mlgo" if base else Path(f"/tmp/mlgo-{os.getuid()}")
    try:
        return private_dir(path, "the mlgo runtime directory", RUNTIME_WAY_OUT)
    except UntrustedPathError as e:
        raise ServiceError(str(e)) from e


def socket_path() -> Path:
    explicit = os.environ.get("MLGO_SOCKET")
    return Path(explicit) if explicit else runtime_dir() / "mlgo.sock"


def check_owned(path: Path) -> None:
    """Refuses PATH unless this user owns it and no one else may write to it (nothing
    there is left to the caller: connecting says so)."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return
    except OSError as e:
        raise UntrustedError(f"cannot check {path}: {e.strerror}") from e
    if st.st_uid != os.getuid():
        raise UntrustedError(
            f"{path} belongs to uid {st.st_uid}, not to this user (uid {os.getuid()}); refusing it"
        )
    if st.st_mode & 0o022:
        mode = stat.S_IMODE(st.st_mode)
        raise UntrustedError(f"{path} is writable by other users (mode {mode:o}); refusing it")


def peer_uid(sock: socket.socket) -> int:
    """The uid of the process at the other end of a connected Unix socket."""
    creds = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    return struct.unpack("3i", creds)[1]


class Connection:
    """One connection to the service, line by line, refused unless this user serves it.
    Every wait is bounded by TIMEOUT_S: the connect, each send, and each line received as a
    whole (a peer sending a byte at a time cannot stretch it)."""

    def __init__(self, path: Path, timeout_s: float):
        self.path = path
        self.timeout_s = timeout_s
        check_owned(path.parent)
        check_owned(path)
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        # A Unix socket's connect cannot be polled: with the backlog full a nonblocking one
        # fails at once (EAGAIN), a blocking one waits for a free slot as long as the send
        # timeout says (0 would be forever).
        seconds, micros = divmod(max(round(timeout_s * 1e6), 1), 1_000_000)
        self.sock.setsockopt(
            socket.SOL_SOCKET, socket.SO_SNDTIMEO, struct.pack("ll", seconds, micros)
        )
        try:
            self.sock.connect(str(path))
        except OSError as e:
            self.sock.close()
            if e.errno == errno.EAGAIN:
                raise BusyError(self._silent()) from e
            absent = e.errno in (errno.ENOENT, errno.ECONNREFUSED)
            error = NoServiceError if absent else ServiceError
            raise error(f"no mlgo service at {path} ({e.strerror or e})") from e
        if (uid := peer_uid(self.sock)) != os.getuid():
            self.sock.close()
            raise UntrustedError(
                f"{path} is served by uid {uid}, not by this user (uid {os.getuid()}); refusing it"
            )
        self.sock.settimeout(timeout_s)
        self._buffer = b""

    def _silent(self) -> str:
        return f"the mlgo service at {self.path} did not answer within {self.timeout_s:g} s"

    def send(self, message: dict) -> None:
        try:
            self.sock.sendall(json.dumps(message).encode() + b"\n")
        except TimeoutError as e:
            raise BusyError(self._silent()) from e
        except OSError as e:
            raise ServiceError(f"the mlgo service at {self.path} went away ({e})") from e

    def _line(self, timeout_s: float) -> bytes:
        """The next line, whole by TIMEOUT_S from now; b"" when the service closed."""
        deadline = time.monotonic() + timeout_s
        while b"\n" not in self._buffer:
            if len(self._buffer) > MAX_REPLY_BYTES:
                raise ServiceError(f"the mlgo service sent a line over {MAX_REPLY_BYTES} bytes")
            left = deadline - time.monotonic()
            if left <= 0:
                raise BusyError(self._silent())
            self.sock.settimeout(left)
            try:
                chunk = self.sock.recv(65536)
            except TimeoutError as e:
                raise BusyError(self._silent()) from e
            except OSError as e:
                raise ServiceError(f"the mlgo service at {self.path} did not answer ({e})") from e
            if not chunk:
                return b""
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def receive(self, timeout_s: float | None = None) -> dict:
        """The next message, within TIMEOUT_S (the connection's, unless given)."""
        line = self._line(self.timeout_s if timeout_s is None else timeout_s)
        if not line:
            raise ServiceError(f"the mlgo service at {self.path} closed the connection")
        try:
            reply = json.loads(line)
        except (json.JSONDecodeError, RecursionError) as e:
            raise ServiceError(f"the mlgo service sent garbage: {line[:80]!r}") from e
        if "error" in reply and "event" not in reply:
            raise ServiceError(str(reply["error"]))
        return reply

    def fileno(self) -> int:
        return self.sock.fileno()

    def close(self) -> None:
        self.sock.close()

    def __enter__(self) -> Connection:
        return self

    def __exit__(self, *_exc: object) -> None:
        self.close()


def request(message: dict, timeout_s: float = 10.0, path: Path | None = None) -> dict:
    """One request, one reply."""
    with Connection(path or socket_path(), timeout_s) as conn:
        conn.send(message)
        return conn.receive()


def launch_service(
    path: Path,
    policies: list[str],
    backend: str,
    log: Path,
    idle_exit_s: float,
    timeout_s: float,
    bound: bool = False,
) -> subprocess.Popen:
    """Starts the service (`python -m mlgo.serve`, its entry point of its own) on PATH, in a
    session of its own, its output appended to LOG, and returns once it answers there. If it
    exits first or stays silent for TIMEOUT_S it is killed, and the ServiceError names the
    line of its output that says why. BOUND: it dies with this process (a build's own
    service, which never idles out: a killed tune must not leave it serving)."""
    cmd = [sys.executable, "-m", "mlgo.serve", "--socket", str(path)]
    cmd += ["--backend", backend, "--idle-exit", f"{idle_exit_s:g}"]
    cmd += [f"--policy={p}" for p in policies]
    with open(log, "ab") as out:
        start = out.tell()
        proc = subprocess.Popen(
            cmd,
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
            start_new_session=True,
            preexec_fn=die_with_parent if bound else None,
        )
    deadline = time.monotonic() + timeout_s
    while proc.poll() is None and (left := deadline - time.monotonic()) > 0:
        try:
            Connection(path, left).close()
            return proc
        except ServiceError:
            time.sleep(0.1)
    if proc.poll() is None:
        proc.kill()
        proc.wait()
    output = log.read_bytes()[start:].decode(errors="replace")
    raise ServiceError(f"the mlgo service did not start: {error_line(output, WHOLE_LINE)}")
