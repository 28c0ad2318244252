"""Building and installing the native mlgo-cc (native/mlgo_cc.c), the fast path of
mlgo.serve.cc. Its lists are not written in C: they are defined when it is built, from the
Python modules that own them (clang's command line as mlgo.llvm.driver reads it, the lease
allow-list, the LLVM options that only report, the plugin's marks for the guard), so the two
wrappers cannot drift apart; its build id says which mlgo built it.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
from functools import cache
from pathlib import Path

from mlgo.llvm.cmdline import (
    ADVISED,
    DEPARTED,
    DEPARTURES_ENV,
    DEPARTURES_PREFIX,
    SIDE_OUTPUT_PREFIXES,
    SIDE_OUTPUTS,
    SIDE_OUTPUTS_WITH_VALUE,
)
from mlgo.llvm.driver import (
    LEVELS,
    NO_CODEGEN,
    NOT_LEVELS,
    OUTPUT_OPTIONS,
    SOURCE_SUFFIXES,
    SOURCE_TYPES,
    TYPE_LANGUAGES,
)
from mlgo.llvm.languages import LANGUAGES
from mlgo.runtime.csource import c_string
from mlgo.runtime.messages import error_line
from mlgo.serve import memo
from mlgo.serve.cc import CONNECT_TIMEOUT_S, REPORTING_LLVM_OPTIONS
from mlgo.serve.guard import GUARD_SCRATCH, UNGUARDED, UNGUARDED_PREFIXES
from mlgo.serve.lease import PLUGIN_FLAG, lease_allow_list

NATIVE_SOURCE = Path(__file__).parent / "native" / "mlgo_cc.c"
NETTLE = "-l:libnettle.a"  # Debian's nettle-dev


def native_lists() -> dict[str, list[str]]:
    """The string lists the native wrapper is built with (-D options): the lease allow-list
    of the registered problems, the LLVM options that only report, how a plugin's compile
    tells the size guard that it made clang's own object, the flag that names a plugin, the
    prefix of the guard's scratch directories, its memory's directory and entry format, the
    options the guard leaves alone or keeps away from its second compile, and how clang's
    driver reads a command line (mlgo.llvm.driver)."""
    switches, channels, numbered = lease_allow_list()
    return {
        "MLGO_SOURCE_SUFFIXES": list(SOURCE_SUFFIXES),
        "MLGO_C_SUFFIXES": suffixes_of("c"),
        "MLGO_CXX_SUFFIXES": suffixes_of("c++"),
        "MLGO_LANGUAGES": list(LANGUAGES),
        "MLGO_NO_CODEGEN": sorted(NO_CODEGEN),
        "MLGO_LEVELS": list(LEVELS),
        "MLGO_NOT_LEVELS": list(NOT_LEVELS),
        "MLGO_OUTPUT_OPTIONS": list(OUTPUT_OPTIONS),
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
        "MLGO_GUARD_CACHE": [memo.GUARD_CACHE],
        "MLGO_MEMO_VERSION": [memo.VERSION],
        "MLGO_MEMO_WINNERS": [memo.WINNERS["policy"], memo.WINNERS["default"]],
        "MLGO_MEMO_END": [memo.END],
        "MLGO_MEMO_ENVIRONMENT": list(memo.ENVIRONMENT),
        "MLGO_UNGUARDED": sorted(UNGUARDED),
        "MLGO_UNGUARDED_PREFIXES": list(UNGUARDED_PREFIXES),
        "MLGO_SIDE_OUTPUTS": sorted(SIDE_OUTPUTS),
        "MLGO_SIDE_OUTPUTS_WITH_VALUE": sorted(SIDE_OUTPUTS_WITH_VALUE),
        "MLGO_SIDE_OUTPUT_PREFIXES": list(SIDE_OUTPUT_PREFIXES),
    }


def native_numbers() -> dict[str, int]:
    """The numbers the native wrapper is built with (-D options): the largest entry of the
    guard's memory (`memo`) it reads or writes, and how long it waits for a lease (at most,
    as mlgo.serve.cc does)."""
    return {
        "MLGO_MEMO_MAX_BYTES": memo.MAX_ENTRY_BYTES,
        "MLGO_LEASE_WAIT_MS": round(CONNECT_TIMEOUT_S * 1000),
    }


def suffixes_of(language: str) -> list[str]:
    """The source suffixes of LANGUAGE (mlgo.llvm.languages): the C wrapper's table of
    `driver.suffix_language`."""
    return [s for s, kind in SOURCE_TYPES.items() if TYPE_LANGUAGES.get(kind) == language]


@cache
def native_build_id(source: Path = NATIVE_SOURCE) -> str:
    """What a native wrapper built from SOURCE by this mlgo is: its source and its lists,
    hashed. It sends it with every compile, so that the service can say when the one
    installed is another mlgo's (it then hands every compile to the slower Python one)."""
    built_with = {**native_lists(), **native_numbers()}
    facts = source.read_bytes() + json.dumps(built_with, sort_keys=True).encode()
    return hashlib.sha256(facts).hexdigest()[:16]


def build_native_wrapper(
    out: Path, *defines: str, python: str = sys.executable, source: Path = NATIVE_SOURCE
) -> None:
    """Compiles SOURCE (the native wrapper; another revision's, for a benchmark) to OUT,
    handing uncommon cases to PYTHON, with DEFINES (-D options: tests build its checking
    entry point so), `native_lists`, `native_numbers` and its `native_build_id`."""
    cmd = ["cc", "-O2", "-Wall", "-Werror", f"-DMLGO_PYTHON={c_string(python)}", *defines]
    cmd += [f"-DMLGO_BUILD_ID={c_string(native_build_id(source))}"]
    cmd += [f"-D{name}={', '.join(map(c_string, v))}" for name, v in native_lists().items()]
    cmd += [f"-D{name}={n}" for name, n in native_numbers().items()]
    # nettle's SHA-256 (the guard's memory), linked in: no library to load at each compile
    cmd += [str(source), NETTLE, "-o", str(out)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
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
