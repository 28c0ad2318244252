"""`mlgo-cc` / `mlgo-c++`: drop-in CC and CXX that compile with the served policies.

Every argument passes through untouched. A compilation that optimizes code gets a lease
from the policy service (started on demand) and the `-mllvm` flags of its channels;
anything else (preprocessing, `--version`, pure links) runs the compiler as is. A policy
serves only compiles at the -O level it was trained for (the last -O flag, as clang reads
it): the others run the compiler as is, and the first of each level in the service's
lifetime prints one note saying so. What the wrapper reads to decide this is what clang's
driver reads: `@file` response files expanded (the compiler still gets them as they are), and
an input without a C or C++ suffix that `-x c` or `-x c++` makes a source (an existing file,
not an option's value); the native wrapper hands both cases to this module.

A build must never fail or hang because of the policy. If the service is down or cannot
start, if a channel fails (policy crash, garbage answer, unknown feature layout), if the
service dies mid-compilation or the compile outlives MLGO_TIMEOUT, the compiler is killed
and the file is compiled again with the default heuristic, with a one-line warning.
The same happens when the socket is not this user's (mlgo.serve.client) or the lease carries a
flag no lease may carry: only the channel options of the served problems, on a FIFO in
this user's runtime directory, and a plugin from this user's cache of built plugins that no
other user could have written (mlgo.runtime.trust), given to the compiler by the resolved
path that was checked. MLGO_STRICT=1 turns that warning into
an error instead. A compile that fails with the policy's flags is done again plainly: if
that passes, the flags broke it (a plugin that does not load, a compiler that is not
clang), which is one warning; under MLGO_STRICT the failure stands, as clang reported it.

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

import fcntl
import hashlib
import json
import math
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from contextlib import nullcontext
from functools import cache
from pathlib import Path

from mlgo.data import default_policies
from mlgo.errors import UsageError
from mlgo.llvm.cmdline import (
    ADVISED,
    DEPARTED,
    DEPARTURES_ENV,
    DEPARTURES_PREFIX,
    link_output,
    made_default_object,
)
from mlgo.llvm.languages import LANGUAGES, source_language
from mlgo.runtime.csource import c_string
from mlgo.runtime.files import cache_dir
from mlgo.runtime.messages import error_line
from mlgo.runtime.trust import UntrustedPathError, path_problem
from mlgo.serve.client import (
    Connection,
    ServiceError,
    UntrustedError,
    launch_service,
    runtime_dir,
    socket_path,
)
from mlgo.serve.guard import (
    GUARD_SCRATCH,
    GUARDS,
    guard_from_env,
    guarded_link,
    guarded_object,
    keep_smaller,
)

SOURCE_SUFFIXES = (".c", ".cc", ".cpp", ".cxx", ".c++", ".C", ".i", ".ii", ".m", ".mm")
NO_CODEGEN = {"-E", "-M", "-MM", "-fsyntax-only", "-###", "--version", "--help", "-"}
# LLVM options of a user's own (-mllvm X) that only report what the compiler did, so a
# compile with them is still served: the block address map's frequencies (block_costs).
# Any other -mllvm option leaves the compile to clang, whose options it may be setting.
REPORTING_LLVM_OPTIONS = ("-pgo-analysis-map=",)
CONNECT_TIMEOUT_S = 10.0
TIMED_OUT = "no result within MLGO_TIMEOUT"
START_TIMEOUT_S = 180.0  # the first start may AOT-compile the policy (about 20 s)
START_RETRY_S = 60.0  # after a failed start, fall back at once for this long (same policies)
DEFAULT_TIMEOUT_S = 900.0
# What a lease may carry: the -mllvm switches and channel options of the registered problems'
# serving flags (`lease_allow_list`; a channel's FIFO base must lie in the runtime directory's
# channels/), their base switches with a number, and -fpass-plugin= (a plugin in the cache of
# built ones, trusted).
PLUGIN_FLAG = "-fpass-plugin="
DEFAULT_POLICY = os.pathsep.join(str(p) for p in default_policies())
LEVELS = ("-O0", "-O1", "-O2", "-O3", "-Os", "-Oz", "-Og", "-Ofast")
# Nested response files deeper than this stay unexpanded (clang stops only at a cycle).
RESPONSE_FILE_DEPTH = 8
# Driver options whose value is the next argument (clang's Separate and JoinedOrSeparate ones,
# and GCC's long spellings): that value is never an input, whatever -x says. Every -X option
# (-Xclang, -Xlinker, ...) takes one too. The native wrapper skips -o, -MF, -MT, -MQ, -MJ,
# --serialize-diagnostics and -X* alike (a subset: what it does not skip, it hands over).
SEPARATE_VALUE_OPTIONS = frozenset({
    "-o", "--output", "-MF", "-MT", "-MQ", "-MJ", "--serialize-diagnostics",
    "-serialize-diagnostics", "-dependency-file", "-dependency-dot", "-include", "--include",
    "-include-pch", "-imacros", "--imacros", "-idirafter", "-iprefix", "-iquote", "-isysroot",
    "-isystem", "-isystem-after", "-iwithprefix", "-iwithprefixbefore", "-iwithsysroot",
    "-iframework", "-iframeworkwithsysroot", "-ivfsoverlay", "-vfsoverlay", "-cxx-isystem",
    "-stdlib++-isystem", "-iapinotes-modules", "-I", "--include-directory", "-L",
    "--library-directory", "-F", "-B", "-D", "--define-macro", "-U", "--undefine-macro", "-A",
    "--assert", "-T", "-G", "-b", "-z", "-l", "-u", "-e", "-mllvm", "-mmlir", "-arch", "-target",
    "--sysroot", "--config", "--language", "-resource-dir", "-working-directory", "-dumpdir",
    "-dsym-dir", "-ccc-gcc-name", "-ccc-install-dir", "-module-dependency-dir",
    "-gen-cdb-fragment-path", "-meabi", "-mthread-model", "-darwin-target-variant",
    "-darwin-target-variant-triple", "-hlsl-entry", "-fmodules-user-build-path",
    "--analyzer-output", "-filelist", "-framework", "-rpath", "--param",
})  # fmt: skip


def split_response_file(text: str) -> list[str]:
    """The arguments in a response file, split as clang splits them on Unix (LLVM's
    TokenizeGNUCommandLine, which differs from a shell's): whitespace separates, '...' and
    "..." quote, a backslash escapes the next character even inside quotes, an unclosed quote
    ends at the end, and a quoted empty string is no argument."""
    words: list[str] = []
    token: list[str] = []
    i, n = 0, len(text)
    while i < n:
        c = text[i]
        if c == "\\" and i + 1 < n:
            token.append(text[i + 1])
            i += 1
        elif c in "'\"":
            i += 1
            while i < n and text[i] != c:
                if text[i] == "\\" and i + 1 < n:
                    i += 1
                token.append(text[i])
                i += 1
        elif c in " \t\r\n":
            if token:
                words.append("".join(token))
                token = []
        else:
            token.append(c)
        i += 1
    if token:
        words.append("".join(token))
    return words


def expand_response_files(args: list[str], depth: int = 0) -> list[str]:
    """ARGS as clang's driver reads them: each `@FILE` replaced by the arguments in FILE,
    nested ones too (named relative to the working directory, as clang does), up to
    RESPONSE_FILE_DEPTH. A FILE that cannot be read stays as the literal argument, as in
    clang, and so does one that is not a regular file: reading a pipe (`@<(...)`) would take
    its arguments from the compiler. For what the wrapper decides only: the compiler is given
    ARGS as they are."""
    expanded: list[str] = []
    for a in args:
        if not a.startswith("@") or depth >= RESPONSE_FILE_DEPTH or not os.path.isfile(a[1:]):
            expanded.append(a)
            continue
        try:
            with open(a[1:], "rb") as f:
                data = f.read()
        except OSError:
            expanded.append(a)
            continue
        text = data.removeprefix(b"\xef\xbb\xbf").decode(errors="surrogateescape")
        expanded += expand_response_files(split_response_file(text), depth + 1)
    return expanded


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


def link_stage(args: list[str]) -> str | None:
    """The stage of an LTO link (no source compiled, the last -flto switch not -fno-lto):
    "link" for full LTO, whose link optimizes the whole program's bitcode once more, or
    "thin-link" for ThinLTO, whose backends optimize each module again after import. A
    link-time policy answers there; None for anything else."""
    if NO_CODEGEN.intersection(args) or {"-c", "-S"}.intersection(args) or source_files(args):
        return None
    switches = [a for a in args if a in ("-flto", "-fno-lto") or a.startswith("-flto=")]
    if not switches or switches[-1] == "-fno-lto":
        return None
    return "thin-link" if switches[-1] == "-flto=thin" else "link"


def links_with_lld(args: list[str]) -> bool:
    """Does clang's driver run lld (the last -fuse-ld or --ld-path names it)? Only lld loads
    a pass plugin into its LTO backend; GNU ld's LLVM gold plugin cannot."""
    linker = ""
    for a in args:
        if a.startswith(("-fuse-ld=", "--ld-path=")):
            linker = a.partition("=")[2]
    return linker == "lld" or Path(linker).name.startswith(("ld.lld", "lld"))


def at_link(flags: list[str]) -> list[str]:
    """A link lease's flags (checked) as clang hands them to lld: the plugin as
    --load-pass-plugin, through -Xlinker, which splits no commas (unlike -Wl). A link is
    served by a plugin only (`ServedPolicy.why_not`): lld's full-LTO inliner opens no
    channel, and its ThinLTO backends would share one."""
    if not all(f.startswith(PLUGIN_FLAG) for f in flags):
        raise ServiceError(f"a link's lease carries a flag lld cannot take: {flags}")
    return [a for f in flags for a in ("-Xlinker", f"--load-pass-plugin={f[len(PLUGIN_FLAG) :]}")]


def is_source(arg: str) -> bool:
    """Is ARG a source file the driver compiles (by its suffix)?"""
    return arg.endswith(SOURCE_SUFFIXES) and not arg.startswith("-")


def typed_sources(args: list[str]) -> set[int]:
    """The positions in ARGS of inputs without a source suffix that clang compiles as C or
    C++ because `-x c` or `-x c++` comes before them (until `-x none`): existing regular
    files that are not an option's value. Those clang cannot read are its errors to report."""
    found: set[int] = set()
    x = "none"
    rest = iter(enumerate(args))
    for i, a in rest:
        if a == "-x":
            x = next(rest, (i, "none"))[1]
        elif a.startswith("-x") and len(a) > 2:
            x = a[2:]
        elif a in SEPARATE_VALUE_OPTIONS or (a.startswith("-X") and len(a) > 2):
            next(rest, None)
        elif x in LANGUAGES and not a.startswith("-") and not is_source(a) and os.path.isfile(a):
            found.add(i)
    return found


def source_files(args: list[str]) -> list[str]:
    """The source files among ARGS, by suffix or by -x (the guard compares only a compile of
    one)."""
    typed = typed_sources(args)
    return [a for i, a in enumerate(args) if is_source(a) or i in typed]


def opt_level(args: list[str]) -> str | None:
    """The -O level clang compiles at, read as its driver reads it: the last -O flag wins, -O
    alone is -O1, -O4 and up are -O3, none is -O0; None for a level clang refuses (and says
    so). An argument handed on to another tool (-Xclang X, -Xlinker X) is not the driver's."""
    level = "-O0"
    rest = iter(args)
    for a in rest:
        if a.startswith("-X") and len(a) > 2:
            next(rest, None)
        elif a == "--optimize" or a.startswith("--optimize="):
            level = "-O" + a.removeprefix("--optimize").removeprefix("=")
        elif a.startswith("-O") and a not in ("-ObjC", "-ObjC++"):
            level = a
    digits = level[2:]
    if not digits:
        return "-O1"
    if digits.isascii() and digits.isdigit():
        return f"-O{min(int(digits), 3)}"
    return level if level in LEVELS else None


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
        return Connection(path, CONNECT_TIMEOUT_S)


def connect(path: Path, may_start: bool) -> Connection:
    """A connection to the service at PATH, starting one there if none runs and MAY_START
    (an explicitly named service is not ours to start, nor one we do not trust)."""
    try:
        return Connection(path, CONNECT_TIMEOUT_S)
    except ServiceError as e:
        if not may_start or isinstance(e, UntrustedError):
            raise
        return start_service(path)


def by_hand(path: Path, may_start: bool, message: dict) -> dict:
    """The service's answer to MESSAGE for a compilation run by hand (`mlgo channel`, `mlgo
    flags`), starting it as mlgo-cc would. A first channel on a plugin-served policy starts
    its native server, so the answer may take as long as a start."""
    with connect(path, may_start) as conn:
        conn.sock.settimeout(START_TIMEOUT_S)
        conn.send(message)
        return conn.receive()


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


@cache
def lease_allow_list() -> tuple[frozenset[str], frozenset[str], frozenset[str]]:
    """The -mllvm switches, channel options (names, without `=BASE`) and numbered switches
    (names, without `=N`: a policy's base, `MLPPolicy.base`) that a lease may carry:
    exactly what the registered problems serve with, with and without the compiler's own
    decision. The one source of them: the native wrapper is built with the same lists
    (`build_native_wrapper`). Read only for a lease with -mllvm flags: the problems' modules
    cost this process about 0.1 s to import."""
    from mlgo.problems import problems

    mark = "/\0base"  # no real option ends so
    switches: set[str] = set()
    channels: set[str] = set()
    for problem in problems():
        for default in (False, True):
            flags = problem.flags_for_serving(mark, default)
            if flags[0::2] != ["-mllvm"] * (len(flags) // 2) or len(flags) % 2:
                raise ValueError(f"{problem.name}: serving flags must be -mllvm pairs: {flags}")
            for option in flags[1::2]:
                if option.endswith("=" + mark):
                    channels.add(option.removesuffix("=" + mark))
                else:
                    switches.add(option)
    numbered = frozenset(p.base_switch for p in problems() if p.base_switch)
    return frozenset(switches), frozenset(channels), numbered


def check_lease_flags(flags: list[str], runtime: Path) -> list[str]:
    """FLAGS as the compiler gets them, each plugin by its resolved path (the one checked:
    a link on the way could be pointed elsewhere after the check). Refuses any flag a lease
    may not carry (see lease_allow_list), saying which rule it breaks: whatever answers on
    the socket must not get to choose what the compiler runs; nor a plugin that another user
    could have written (mlgo.runtime.trust)."""
    channels = (runtime / "channels").resolve()
    try:
        plugins = cache_dir() / "plugin"  # resolved: mlgo.runtime.files.cache_dir
    except UntrustedPathError as e:  # nothing from that cache is loaded
        raise UntrustedError(str(e)) from e
    checked = []
    rest = iter(flags)
    for flag in rest:
        if flag == "-mllvm":
            option = next(rest, "")
            name, eq, base = option.partition("=")
            fifo = Path(base)
            switches, channel_options, numbered = lease_allow_list()
            if (
                option in switches
                or (eq and name in numbered and base.isascii() and base.isdigit())
                or (
                    eq
                    and name in channel_options
                    and fifo.name not in ("", ".", "..")
                    and fifo.parent.resolve() == channels
                )
            ):
                checked += [flag, option]
                continue
            if eq and name in channel_options:
                why = f"a channel must be a FIFO directly in {channels}"
            elif eq and name in numbered:
                why = "a policy's base must be digits alone"
            else:
                why = "not one of the served problems' options"
            raise ServiceError(f"the lease carries -mllvm {option[:160]!r}: {why}")
        if not flag.startswith(PLUGIN_FLAG):
            raise ServiceError(
                f"the lease carries {flag[:160]!r}: a lease may carry only the served "
                f"problems' -mllvm options and {PLUGIN_FLAG} with a plugin mlgo built"
            )
        plugin = Path(os.path.realpath(flag.removeprefix(PLUGIN_FLAG)))
        if plugins not in plugin.parents:
            raise ServiceError(
                f"the lease carries {flag[:160]!r}: {plugin} is not in {plugins}, "
                "and a lease may load only a plugin mlgo built there"
            )
        if problem := path_problem(plugin):  # checked as it is loaded, not only as built
            raise UntrustedError(f"refusing the plugin {plugin}: {problem}")
        checked.append(PLUGIN_FLAG + str(plugin))
    return checked


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
    level: str, language: str | None, stage: str = "compile"
) -> tuple[Connection | None, list[str], str | None, str | None, str | None]:
    """A lease for a compile (or a link: STAGE) at LEVEL in LANGUAGE: its connection (None
    when no policy serves it), its flags (checked), what is wrong with its policies, the
    service's note, and the guard its policies must be served under."""
    path = socket_path()
    conn = connect(path, may_start=not os.environ.get("MLGO_SOCKET"))
    try:
        conn.send({"op": "compile", "level": level, "language": language, "stage": stage})
        reply = conn.receive()
        flags = reply["flags"]
        if not (isinstance(flags, list) and all(isinstance(f, str) for f in flags)):
            raise ServiceError(f"flags that are not a list of strings: {str(flags)[:80]}")
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
    compiler: str, args: list[str], sources: list[str], stage: str, source: str, strict: bool
) -> int:
    """MLGO_GUARD=size after the policy's compile (or link) succeeded: the smaller output
    stays. SOURCE: what the messages name."""
    output = guarded_object(args, sources) if stage == "compile" else guarded_link(args)
    problem = output and keep_smaller(compiler, args, output, socket_path().parent)
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


def compile_language(args: list[str], cxx_driver: bool) -> str | None:
    """The language the sources among ARGS compile as, None if mixed or neither C nor C++."""
    typed = {args[i] for i in typed_sources(args)}
    return source_language(args, cxx_driver, lambda a: is_source(a) or a in typed)


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
        conn, flags, problem, note, policy_guard = _lease(level, language, stage)
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
        if problem and strict:
            conn.close()
            return _error(problem, source)
        if problem:  # the served policies still compile it: say they are not the ones asked
            _warn(problem)
        # served by the plugin, a guarded compile says whether it made clang's own object
        by_plugin = any(f.startswith(PLUGIN_FLAG) for f in flags)
        want_marks = bool(guard) and stage == "compile" and by_plugin
        with (
            conn,
            tempfile.TemporaryFile() as err,
            tempfile.NamedTemporaryFile(prefix=DEPARTURES_PREFIX)
            if want_marks
            else nullcontext() as marks,
        ):
            env = {**os.environ, DEPARTURES_ENV: marks.name} if marks else None
            proc = subprocess.Popen([compiler, *args, *flags], stderr=err, env=env)
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
                return _guard(compiler, seen, sources, stage, source, strict)
            return proc.returncode
    if strict:
        return _error(problem, source)
    _warn(f"{problem}; {doing} {source} with the default heuristic")
    os.execvp(compiler, [compiler, *args])


def main_c() -> None:
    sys.exit(run(os.environ.get("MLGO_CC", "clang-22"), sys.argv[1:]))


def main_cxx() -> None:
    sys.exit(run(os.environ.get("MLGO_CXX", "clang++-22"), sys.argv[1:], cxx_driver=True))


NATIVE_SOURCE = Path(__file__).parent / "native" / "mlgo_cc.c"


def native_lists() -> dict[str, list[str]]:
    """The string lists the native wrapper is built with (-D options): the lease allow-list
    of the registered problems, the LLVM options that only report, how a plugin's compile
    tells the size guard that it made clang's own object, the flag that names a plugin and
    the prefix of the guard's scratch directories."""
    switches, channels, numbered = lease_allow_list()
    return {
        "MLGO_LEASE_SWITCHES": sorted(switches),
        "MLGO_LEASE_CHANNELS": sorted(f"{c}=" for c in channels),
        "MLGO_LEASE_NUMBERED": sorted(f"{n}=" for n in numbered),
        "MLGO_REPORTING_LLVM_OPTIONS": list(REPORTING_LLVM_OPTIONS),
        "MLGO_DEPARTURES_ENV": [DEPARTURES_ENV],
        "MLGO_DEPARTURES_PREFIX": [DEPARTURES_PREFIX],
        "MLGO_DEPARTED": [DEPARTED],
        "MLGO_ADVISED": [ADVISED],
        "MLGO_PLUGIN_FLAG": [PLUGIN_FLAG],
        "MLGO_GUARD_SCRATCH": [GUARD_SCRATCH],
    }


@cache
def native_build_id(source: Path = NATIVE_SOURCE) -> str:
    """What a native wrapper built from SOURCE by this mlgo is: its source and its lists,
    hashed. It sends it with every compile, so that the service can say when the one
    installed is another mlgo's (it then hands every compile to the slower Python one)."""
    facts = source.read_bytes() + json.dumps(native_lists(), sort_keys=True).encode()
    return hashlib.sha256(facts).hexdigest()[:16]


def build_native_wrapper(
    out: Path, *defines: str, python: str = sys.executable, source: Path = NATIVE_SOURCE
) -> None:
    """Compiles SOURCE (the native wrapper; another revision's, for a benchmark) to OUT,
    handing uncommon cases to PYTHON, with DEFINES (-D options: tests build its checking
    entry point so), `native_lists` and its `native_build_id`."""
    cmd = ["cc", "-O2", "-Wall", "-Werror", f"-DMLGO_PYTHON={c_string(python)}", *defines]
    cmd += [f"-DMLGO_BUILD_ID={c_string(native_build_id(source))}"]
    cmd += [f"-D{name}={', '.join(map(c_string, v))}" for name, v in native_lists().items()]
    proc = subprocess.run([*cmd, str(source), "-o", str(out)], capture_output=True, text=True)
    if proc.returncode != 0:
        raise OSError(f"cannot build {source.name}: {error_line(proc.stderr)}")


def install_native_wrappers(bindir: Path) -> list[Path]:
    """Builds mlgo/serve/native/mlgo_cc.c and installs it as BINDIR/mlgo-cc and mlgo-c++ (over the
    Python entry points it hands uncommon cases to), each renamed into place."""
    fd, tmp = tempfile.mkstemp(prefix=".mlgo-cc.", dir=bindir)
    os.close(fd)
    try:
        build_native_wrapper(Path(tmp))
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
