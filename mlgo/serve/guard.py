"""MLGO_GUARD=size: no object larger than clang's default makes it.

After the policy's compile has written the object (and everything else the command line
asks for: dependency files, remarks, traces), the same file is compiled again with the
default heuristic into a scratch directory in the private runtime directory (never beside
the object: another user who may write there could swap it for a link to a directory of
root's), writing nothing else, and the smaller object is kept (by executable bytes, as
mlgo.llvm.sizes measures them; a tie keeps the default's), put in place through one
descriptor of the object's directory (`put_in_place`). The dependency file the policy's
compile wrote stays right: both compiles read the same headers and name the same object.

Only a compile that writes one ELF object can be guarded. Compile-and-link, -S, -emit-llvm,
LTO bitcode, and outputs whose bytes name their own path (split DWARF's .dwo, coverage's
.gcno/.gcda) keep the policy's output alone.

An LTO link served by a link-time policy is guarded the same way: the program or shared
library linked again with lld's own inliner beside it, the one with less `.text` kept. A
link that writes anything else (a map, temporaries, a ThinLTO cache) keeps the policy's.
The native mlgo-cc hands a guarded link to Python: it costs a second link, not a second
interpreter's start.

The native mlgo-cc (mlgo/serve/native/mlgo_cc.c) guards by these same rules without starting
Python, running the two compiles at once; tests/test_guard.py holds both to agree. Which
output a guarded compile served by the plugin, or a guarded link, kept is remembered
(`memo`): a rebuild of unchanged inputs compiles or links once, with that one. The native
wrapper remembers its compiles; the compiles it hands to this module are guarded every time.
"""

from __future__ import annotations

import errno
import os
import secrets
import shutil
import signal
import subprocess
import tempfile
from pathlib import Path

from mlgo.llvm.cmdline import GUARDS, LINKER_SIDE_OUTPUTS, linker_options, without_outputs
from mlgo.llvm.driver import joined_output, link_output, lto
from mlgo.runtime.trust import UntrustedPathError, path_problem

# The object is not plain ELF code, or its bytes name files of its own (split DWARF's .dwo,
# coverage's .gcda), or a second compile would rewrite what the first wrote (-save-temps).
UNGUARDED = {"-S", "-emit-llvm", "-save-temps", "--coverage", "-ftest-coverage", "-fprofile-arcs"}
UNGUARDED_PREFIXES = ("-save-temps=", "-gsplit-dwarf")
# The scratch directories' prefix, in the runtime directory; the native wrapper is built with it.
GUARD_SCRATCH = "guard-"


def guard_from_env() -> tuple[str | None, str | None]:
    """MLGO_GUARD's guard (None: none), and what is wrong with it (then none is used)."""
    value = os.environ.get("MLGO_GUARD") or None
    if value is None or value in GUARDS:
        return value, None
    return None, f"MLGO_GUARD={value!r} is not one of: {', '.join(GUARDS)}"


def guarded_object(args: list[str], sources: list[str]) -> Path | None:
    """The object this compile writes, if the guard can compare it; None if it cannot."""
    if "-c" not in args or len(sources) != 1 or lto(args):
        return None
    if any(a in UNGUARDED or a.startswith(UNGUARDED_PREFIXES) for a in args):
        return None
    output = None
    rest = iter(args)
    for a in rest:
        if a == "-o":
            output = next(rest, None)
        elif joined_output(a):
            output = a[2:]
    if output == "-":
        return None
    return Path(output) if output else Path(Path(sources[0]).stem + ".o")


def guarded_link(args: list[str]) -> Path | None:
    """The program or library this LTO link writes, if the guard can compare it; None if
    the link writes anything else (a map, temporaries, a ThinLTO cache) or to stdout."""
    if any(a in UNGUARDED or a.startswith(UNGUARDED_PREFIXES) for a in args):
        return None
    if any(o.startswith(LINKER_SIDE_OUTPUTS) for o in linker_options(args)):
        return None
    output = link_output(args)
    return None if output == "-" else Path(output)


def default_args(args: list[str], output: Path) -> list[str]:
    """ARGS compiling to OUTPUT and writing nothing else the original command line asks for
    (the policy's compile wrote it)."""
    return [*without_outputs(args), "-o", str(output)]


# What stops a build (make's Ctrl-C, a killed job, a closed terminal), as the native wrapper has it.
STOPPING = (signal.SIGHUP, signal.SIGINT, signal.SIGTERM)


def scratch_dir(runtime: Path) -> Path:
    """A new scratch directory (0700) in RUNTIME, resolved, if no other user could change
    RUNTIME or a directory above it (mlgo.runtime.trust); else UntrustedPathError."""
    real = os.path.realpath(runtime)
    if problem := path_problem(real):
        raise UntrustedPathError(f"refusing {real} for the guard's scratch: {problem}")
    return Path(tempfile.mkdtemp(prefix=GUARD_SCRATCH, dir=real))


def put_in_place(kept: Path, target: Path) -> None:
    """KEPT (in the scratch directory) becomes TARGET, through one descriptor of TARGET's
    directory, so that a directory swapped for a link meanwhile cannot send it elsewhere:
    renamed, or across file systems copied into a new file beside TARGET (O_EXCL: never one
    someone put there) that is renamed over it."""
    directory = os.open(target.parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        try:
            os.rename(kept, target.name, dst_dir_fd=directory)
            return
        except OSError as e:
            if e.errno != errno.EXDEV:
                raise
        flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
        mode = kept.stat().st_mode & 0o777
        while True:
            temp = f".{target.name[:200]}.{secrets.token_hex(4)}"
            try:
                fd = os.open(temp, flags, mode, dir_fd=directory)
                break
            except FileExistsError:
                continue
        try:
            with open(fd, "wb") as out, kept.open("rb") as source:
                shutil.copyfileobj(source, out)
            os.rename(temp, target.name, src_dir_fd=directory, dst_dir_fd=directory)
        except BaseException:
            os.unlink(temp, dir_fd=directory)
            raise
    finally:
        os.close(directory)


def keep_smaller(
    compiler: str, args: list[str], obj: Path, runtime: Path
) -> tuple[str | None, str | None]:
    """With the policy's OBJ written, compiles (or links) ARGS with the default into a scratch
    directory in RUNTIME and keeps the smaller of the two in OBJ. Returns what went wrong
    (then OBJ is the policy's), or None, and which one was kept ("policy" or "default"; None
    where nothing was compared)."""
    from mlgo.llvm.sizes import text_size
    from mlgo.runtime.messages import error_line

    if not obj.is_file():  # -o /dev/null and the like: nothing to keep
        return None, None
    scratch: Path | None = None
    # Held off until the handler is in place and the directory is where it looks.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, STOPPING)
    previous = {sig: signal.signal(sig, _stopped) for sig in STOPPING}
    try:
        try:
            scratch = scratch_dir(runtime)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        default = scratch / obj.name
        cmd = [compiler, *default_args(args, default)]
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL, capture_output=True, text=True)
        if proc.returncode != 0:
            return f"the default heuristic's run failed: {error_line(proc.stderr)}", None
        if text_size(default) > text_size(obj):
            return None, "policy"
        put_in_place(default, obj)
        return None, "default"
    except (OSError, ValueError) as e:
        return error_line(e), None
    except Stopped as stop:  # the compile is killed (subprocess.run does it); then die of it
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)
        signal.signal(stop.signum, signal.SIG_DFL)
        os.kill(os.getpid(), stop.signum)
        raise
    finally:
        for sig, handler in previous.items():
            if handler is not None:  # None: set outside Python, which cannot be put back
                signal.signal(sig, handler)
        if scratch:
            shutil.rmtree(scratch, ignore_errors=True)


class Stopped(Exception):
    """A stop signal during the guard's compile: raised so that the scratch directory is
    removed before the wrapper dies of the signal, as the native one does."""

    def __init__(self, signum: int) -> None:
        super().__init__(signum)
        self.signum = signum


def _stopped(signum: int, _frame: object) -> None:
    raise Stopped(signum)
