"""Decisions as data: a build's inlining decisions in a directory that plain clang replays,
with no policy, plugin or Python at build time (docs/usage.md, "Decisions as data").

The directory DIR holds:
- `FORMAT`: the format's name and version, the clang that recorded it, the key format, scope;
- `flags`: what every compile adds so that call sites have the recorded keys (a -g0 build
  needs locations: `-Rpass=` with a regex no pass matches, and `-gcolumn-info`, leave its
  object as it was), which the wrappers add themselves: never CFLAGS, where libtool takes
  `-R...` for a run path; `link.flags`: for a full-LTO link by lld (its program's file named);
- `cc`, `c++`: POSIX sh wrappers (native/decisions_cc.sh) that replay a source's file;
- `files/<source path from the project root>.inl`, `links/<program>.inl`: replay lines
  (mlgo.llvm.replay), a no-op header first, sorted by caller and key; a source's file has
  a second no-op line with the source's POSIX `cksum`, by which its compile says, once, that
  the source changed since (its moved call sites get clang's own decisions);
- `summary.json`: per file and per function, counts and departures from clang's own, and
  each source's digest for a cheap `check`;
- `default.profdata`, where the decisions were made on code optimized with a profile (a
  tune on top of PGO, `mlgo tune --pgo`): that profile, which every compile then uses, so
  that the directory alone is what the build needs.

The recorder (the plugin's, mlgo/ship/native/inline_plugin.cc) writes every answer the
inliner got. A site answered both ways (the inliner visits some again) cannot be replayed as
one answer, so it is dropped, and counted: clang's own heuristic decides it in the replay,
which is why the replayed build, not the recorded one, is the build these decisions give.
An inline the recorder refused (marked: clang itself would never make it, as inlining a
varargs callee or one with a computed goto changes what a program does, and clang's replay
does not check) is dropped and counted too; `check` finds such lines in a handed directory.
"""

from __future__ import annotations

import hashlib
import json
import os
import shlex
import shutil
import subprocess
import tempfile
from collections import Counter
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from mlgo.data import shipped_policy
from mlgo.errors import UsageError
from mlgo.llvm.driver import SOURCE_SUFFIXES, named_output
from mlgo.llvm.profiles import (
    INDEXED_MAGIC,
    MAX_PROFILE_BYTES,
    MERGED,
    PROFILE_USE,
    PROFILE_USE_FLAGS,
    open_profile,
)
from mlgo.llvm.replay import (
    AT_CALLSITE,
    CLANG_ADVISOR,
    DECISIONS_ADVISOR_ENV,
    DECISIONS_OUT_ENV,
    INLINED_INTO,
    KEY_FORMAT,
    LINE_PREFIX,
    NOT_INLINED_INTO,
    REPLAY_ADVISOR_PREFIX,
    SCOPE,
    Decision,
    parse_line,
    parse_recorded,
    replay_flags,
)
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems.policy_files import load_policy
from mlgo.runtime.files import atomic_directory
from mlgo.runtime.inputs import read_bytes, read_json
from mlgo.runtime.messages import error_line
from mlgo.runtime.trust import private_temp_dir
from mlgo.ship.plugin import inliner_plugin

FORMAT_NAME, FORMAT_VERSION = "mlgo-decisions", 1


def _no_op(text: str) -> str:
    """A line clang parses and that matches no call site (no function has this name): a
    decisions file names its format on its first line, where a `#` comment is a compile
    error, and a source's file its source's checksum on the second."""
    return Decision("mlgo", "mlgo:0:0", text, False).line()


HEADER = _no_op(f"{FORMAT_NAME} {FORMAT_VERSION}")
SOURCE_MARK = "source cksum"  # then the source's `cksum` output
# Makes clang keep call-site locations in a -g0 build without emitting any; the regex is
# meant to match no pass. The object is byte-identical to plain -g0's.
LOCATION_FLAGS = ("-Rpass=mlgo-locations-only", "-gcolumn-info")
WRAPPER = Path(__file__).parent / "native" / "decisions_cc.sh"
# Where the wrappers find the project's root when it is not where DIR/FORMAT says: a copy
# of the project built elsewhere (a CI checkout, the tune's own build from the decisions).
ROOT_ENV = "MLGO_DECISIONS_ROOT"
_ERE_SPECIAL = set(".[]()*+?{}|^$\\")


# Bounds on what a handed directory may make mlgo read: its FORMAT and flags are a few
# lines, a `.inl` about 100 bytes a decision, a summary about 200 bytes a function.
MAX_FORMAT_BYTES = 4 << 10
MAX_INL_BYTES = 64 << 20
MAX_SUMMARY_BYTES = 64 << 20
# The largest source digested (an amalgamation such as sqlite3.c is under 10 MB).
MAX_SOURCE_BYTES = 64 << 20
NAME_MAX = 255  # bytes in one path component, on Linux's file systems


class DecisionsError(UsageError):
    """A decisions directory or file mlgo cannot use; the message names it."""


def _read_text(path: Path, limit: int) -> str:
    """PATH of a decisions directory as UTF-8 text: a regular file of at most LIMIT bytes,
    read without blocking; else one line naming it."""
    try:
        data = read_bytes(path, limit, DecisionsError)
    except FileNotFoundError:
        raise DecisionsError(f"{path}: no such file") from None
    except OSError as e:
        raise DecisionsError(f"{path}: cannot be read ({e.strerror})") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise DecisionsError(f"{path}: not UTF-8 text") from None


def name_problem(kind: str, name: str) -> str | None:
    """Why NAME cannot name a unit of KIND ("files": a source's path from the project's
    root; "links": a program), or None. A name becomes a path under DIR, a word of a
    linker's options (where clang splits -Wl, at commas) and a line of `show`, so it holds
    no whitespace, comma or control character and starts no part with `-`; a source's
    path stays under the root, and a program's is one file name."""
    if not name or any(c.isspace() or c == "," or not c.isprintable() for c in name):
        return "holds whitespace, a comma or a control character"
    parts = name.split("/")
    if kind == "links" and len(parts) > 1:
        return "is not a file name"
    if any(p in ("", ".", "..") for p in parts):
        return "is not a path under the project's root"
    if any(p.startswith("-") for p in parts):
        return "starts with '-'"
    if len(f"{parts[-1]}.inl".encode()) > NAME_MAX:
        return f"is too long for its decisions file (over {NAME_MAX} bytes with .inl)"
    return None


def _checked_name(kind: str, name: str, where: object) -> str:
    problem = name_problem(kind, name)
    if problem is not None:
        raise DecisionsError(f"{where}: {kind} name {name[:120]!r} {problem}")
    return name


class _Names:
    """A summary's mapping from unit names of KIND (None: any printable name) to VALUE."""

    def __init__(self, kind: str | None, value: object) -> None:
        self.kind, self.value = kind, value


_TEXT = {"decisions": int, "clang": int, "saved": int}
_FUNCTION = {"decisions": int, "inlined": int, "departures?": int, "text_saved?": int}
_UNIT = {
    "decisions": int,
    "inlined": int,
    "conflicts": int,
    "refused?": int,
    "departures": (int, None),
    "sha256": (str, None),
    "found_by?": str,
    "policy_saved?": int,
    "text?": _TEXT,
    "functions": _Names(None, _FUNCTION),
}
_LEFT = {"why?": str, "departures?": (int, None), "text?": _TEXT, "sha256?": str}
_SUMMARY = {
    "format": int,
    "files": _Names("files", _UNIT),
    "links": _Names("links", _UNIT),
    "clangs_own?": _Names("unit", _LEFT),
    "refreshed?": {"judged_again": [str], "as_before": int},
}


def _check_shape(value: object, spec: object, where: str) -> None:
    """Refuses VALUE, at WHERE (a file and the keys into it), unless it has SPEC's shape: a
    type (int means one, not a bool), None, a tuple of choices, a list of one element's
    shape, `_Names`, or a dict of keys (`?` ending those that may be missing)."""
    if isinstance(spec, tuple):
        errors = []
        for choice in spec:
            try:
                return _check_shape(value, choice, where)
            except DecisionsError as e:
                errors.append(e)
        raise errors[0]
    if spec is None or isinstance(spec, type):
        ok = value is None if spec is None else isinstance(value, spec)
        if not ok or (spec is int and isinstance(value, bool)):
            wanted = "null" if spec is None else {int: "an integer", str: "a string"}[spec]
            raise DecisionsError(f"{where} is not {wanted}")
    elif isinstance(spec, list):
        if not isinstance(value, list):
            raise DecisionsError(f"{where} is not a list")
        for i, item in enumerate(value):
            _check_shape(item, spec[0], f"{where}[{i}]")
    else:
        if not isinstance(value, dict):
            raise DecisionsError(f"{where} is not a mapping")
        if isinstance(spec, _Names):
            for name, item in value.items():
                _check_unit_key(spec.kind, name, where)
                _check_shape(item, spec.value, f"{where}[{name!r}]")
            return
        assert isinstance(spec, dict)
        for key, shape in spec.items():
            name = key.rstrip("?")
            if name in value:
                _check_shape(value[name], shape, f"{where}.{name}")
            elif not key.endswith("?"):
                raise DecisionsError(f"{where} has no {name}")


def _check_unit_key(kind: str | None, name: str, where: str) -> None:
    """A key of a summary's mapping: a unit's name of KIND, `files/NAME` or `links/NAME`
    for "unit", and for None (a function) any name that prints as one line."""
    if kind == "unit":
        kind, _, unit = name.partition("/")
        if kind not in ("files", "links"):
            raise DecisionsError(f"{where}: {name[:120]!r} is not files/NAME or links/NAME")
        name = unit
    if kind is not None:
        _checked_name(kind, name, where)
    elif not name or not name.isprintable():
        raise DecisionsError(f"{where}: function name {name[:120]!r} is not one printable line")


@dataclass
class UnitDecisions:
    """What one compile (a source) or one LTO link (a program) decided."""

    decisions: list[Decision]
    conflicts: int = 0  # sites answered both ways, dropped
    departures: dict[str, int] | None = None  # per caller, from clang's own; None: unknown
    digest: str | None = None  # the source's sha256, for `check`
    sizes: Sizes | None = None  # .text from these decisions and from clang's own, if measured
    cksum: str | None = None  # the source's POSIX cksum, for the wrappers' note when it changes
    judged: dict | None = None  # its summary as judged before, when its source is unchanged
    refused: int = 0  # inlines clang would refuse (`Refusal`), dropped
    # Whose they are: the policy's, served by the plugin, or the tune's search's, its cheapest
    # measured trajectory for the file (where it did not reach, or found less, the policy's).
    found_by: str = "policy"
    policy_saved: int | None = None  # found by the search: the .text the policy's saved

    def summary(self) -> dict:
        if self.judged is not None:
            return self.judged
        functions: dict[str, dict[str, int]] = {}

        def function(name: str) -> dict[str, int]:
            return functions.setdefault(name, {"decisions": 0, "inlined": 0})

        for d in self.decisions:
            function(d.caller)["decisions"] += 1
            function(d.caller)["inlined"] += d.inline
        for caller, n in (self.departures or {}).items():
            function(caller)["departures"] = n
        for name, saved in (self.sizes.saved_by_function() if self.sizes else {}).items():
            function(name)["text_saved"] = saved
        departed = None if self.departures is None else sum(self.departures.values())
        measured = {"text": self.sizes.totals()} if self.sizes else {}
        return {
            "decisions": len(self.decisions),
            "inlined": sum(d.inline for d in self.decisions),
            "conflicts": self.conflicts,
            **({"refused": self.refused} if self.refused else {}),
            "departures": departed,
            "sha256": self.digest,
            "found_by": self.found_by,
            **({"policy_saved": self.policy_saved} if self.policy_saved is not None else {}),
            **measured,
            "functions": dict(sorted(functions.items())),
        }


@dataclass(frozen=True)
class Sizes:
    """The .text of a unit's output (object or program) built from its decisions and by
    clang's own, in all and per function (`mlgo.llvm.sizes.function_sizes`)."""

    decisions: int
    clang: int
    decisions_functions: dict[str, int]
    clang_functions: dict[str, int]

    @property
    def saved(self) -> int:
        """Bytes fewer than clang's own (negative: more)."""
        return self.clang - self.decisions

    def totals(self) -> dict[str, int]:
        return {"decisions": self.decisions, "clang": self.clang, "saved": self.saved}

    def saved_by_function(self) -> dict[str, int]:
        """Per function whose bytes differ, those fewer than clang's own (a function gone,
        inlined everywhere, saves all of its bytes)."""
        ours, clangs = self.decisions_functions, self.clang_functions
        saved = {f: clangs.get(f, 0) - ours.get(f, 0) for f in ours.keys() | clangs.keys()}
        return {f: n for f, n in sorted(saved.items()) if n}


@dataclass
class Artifact:
    """A decisions directory as read back: its units' summaries, by file and by program."""

    path: Path
    files: dict[str, dict] = field(default_factory=dict)
    links: dict[str, dict] = field(default_factory=dict)
    root_from_dir: str = ".."
    clangs_own: dict[str, dict] = field(default_factory=dict)  # judged, and not kept
    refreshed: dict | None = None  # by a refresh: what it judged again, what it kept as before
    clang_major: str = ""  # as FORMAT records it

    def verdicts(self) -> dict[str, dict]:
        """Each source's unit judged, kept or not (`files/NAME`), that knows its source's
        digest: what a refresh need not judge again while the source stays the same."""
        units = {f"files/{name}": unit for name, unit in self.files.items()}
        units.update((n, u) for n, u in self.clangs_own.items() if n.startswith("files/"))
        return {name: unit for name, unit in units.items() if unit.get("sha256")}


@dataclass(frozen=True, order=True)
class Refusal:
    """An inline the recorder refused: clang itself would never make it (WHY, as clang says
    it), and its replay, which answers "always" at a replayed line, does not check."""

    decision: Decision
    why: str

    def __str__(self) -> str:
        d = self.decision
        return f"inlines {d.callee!r} into {d.caller!r} at {d.key}: clang refuses ({self.why})"


def from_recorder(text: str, where: str) -> tuple[list[Decision], int, list[Refusal]]:
    """The replayable decisions in what the recorder wrote (WHERE names it), how many sites
    were dropped for getting both answers, and the inlines it refused (dropped: clang's own
    heuristic, which refuses them too, decides there)."""
    answers: dict[tuple[str, str], set[Decision]] = {}
    refused: dict[tuple[str, str], Refusal] = {}
    for number, line in enumerate(text.splitlines(), 1):
        parsed = parse_recorded(line)
        if parsed is None:
            raise DecisionsError(f"{where}:{number}: not a recorded decision: {line[:120]!r}")
        decision, why = parsed
        if why is not None:
            refused.setdefault(decision.site, Refusal(decision, why))
        answers.setdefault(decision.site, set()).add(decision)
    sites = {site: a for site, a in answers.items() if site not in refused}
    # one answer in several callers (a template's instances share a key): the first caller's,
    # not a set's hash order, so that a file's lines do not change from run to run
    kept = [min(a) for a in sites.values() if len({d.inline for d in a}) == 1]
    return sorted(kept), len(sites) - len(kept), sorted(refused.values())


def record(
    command: list[str], cwd: Path | None = None, advisor: str | None = None
) -> tuple[list[Decision], int, list[Refusal]]:
    """Runs COMMAND (a compile or link that loads our plugin) with its recorder on, recording
    ADVISOR's answers (mlgo.llvm.replay: None for the policy's); the replayable decisions,
    the sites dropped for conflicts and the inlines refused, as `from_recorder` gives them."""
    with tempfile.TemporaryDirectory(prefix="mlgo-decisions-", dir=private_temp_dir()) as d:
        out = Path(d) / "recorded"
        env = {**os.environ, DECISIONS_OUT_ENV: str(out)}
        env.pop(DECISIONS_ADVISOR_ENV, None)
        if advisor is not None:
            env[DECISIONS_ADVISOR_ENV] = advisor
        proc = subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True)
        if proc.returncode != 0:
            raise DecisionsError(
                f"recording {shlex.join(command[:3])} ... failed (exit {proc.returncode}): "
                f"{error_line(proc.stderr)}"
            )
        text = out.read_text() if out.exists() else ""
    return from_recorder(text, shlex.join(command[:3]))


def record_source(
    compiler: str, plugin: Path, root: Path, source: str, cflags: list[str], obj: Path
) -> UnitDecisions:
    """Compiles SOURCE (a path from ROOT, in ROOT) to OBJ with PLUGIN's policy, recording
    its decisions, and once more to nowhere with clang's own, for the departures."""
    command = [compiler, *cflags, *compile_flags(cflags), f"-fpass-plugin={plugin}", "-c", source]
    ours, conflicts, refused = record([*command, "-o", str(obj)], root)
    clangs = record([*command, "-o", os.devnull], root, CLANG_ADVISOR)[0]
    digest, cksum = source_sums(root / source)
    return UnitDecisions(
        ours, conflicts, departures(ours, clangs), digest, cksum=cksum, refused=len(refused)
    )


def record_link(
    command: list[str], plugin: Path, cwd: Path, advisor: str | None = None
) -> UnitDecisions:
    """Runs COMMAND, a full-LTO link by lld of objects compiled with `compile_flags`, with
    PLUGIN's recorder on (ADVISOR's answers, as for `record`): the program's decisions."""
    ours, conflicts, refused = record([*command, f"-Wl,--load-pass-plugin={plugin}"], cwd, advisor)
    return UnitDecisions(ours, conflicts, refused=len(refused))


def departures(ours: Iterable[Decision], clangs: Iterable[Decision]) -> dict[str, int]:
    """Per caller, the sites where OURS answer otherwise than clang's own did."""
    own = {d.site: d.inline for d in clangs}
    return dict(Counter(d.caller for d in ours if own.get(d.site, d.inline) != d.inline))


def _source_bytes(path: Path) -> bytes:
    """A source's bytes, to digest: a regular file, bounded (a handed directory's names
    and root decide which file is read)."""
    return read_bytes(path, MAX_SOURCE_BYTES, DecisionsError)


def source_digest(path: Path) -> str:
    return hashlib.sha256(_source_bytes(path)).hexdigest()


def source_sums(path: Path) -> tuple[str, str]:
    """The source's sha256 (for `check`) and POSIX cksum (for the wrappers), as recorded."""
    data = _source_bytes(path)
    return hashlib.sha256(data).hexdigest(), posix_cksum(data)


def _crc_table() -> list[int]:
    table = []
    for byte in range(256):
        crc = byte << 24
        for _ in range(8):
            crc = ((crc << 1) ^ 0x04C11DB7) if crc & 0x80000000 else crc << 1
        table.append(crc & 0xFFFFFFFF)
    return table


_CRC = _crc_table()


def posix_cksum(data: bytes) -> str:
    """What POSIX `cksum` prints for DATA read from stdin ("CRC LENGTH"): the one checksum a
    wrapper of plain sh can compute on any machine."""
    length, tail = len(data), bytearray()
    while length:
        tail.append(length & 0xFF)
        length >>= 8
    crc = 0
    for byte in data + bytes(tail):
        crc = ((crc << 8) & 0xFFFFFFFF) ^ _CRC[(crc >> 24) ^ byte]
    return f"{~crc & 0xFFFFFFFF} {len(data)}"


def inl_text(decisions: Iterable[Decision], cksum: str | None = None) -> str:
    """A decisions file: the header, the line with its source's CKSUM (if one), the lines."""
    head = [HEADER] if cksum is None else [HEADER, _no_op(f"{SOURCE_MARK} {cksum}")]
    return "\n".join([*head, *(d.line() for d in sorted(decisions))]) + "\n"


def read_inl(path: Path) -> list[Decision]:
    """The decisions of a `.inl` file, checked as the wrappers check it: its format's header
    first, then only replay lines. A foreign or corrupt file is refused in one line."""
    lines = _read_text(path, MAX_INL_BYTES).split("\n")
    if lines[-1] == "":
        lines.pop()
    if not lines or lines[0] != HEADER:
        raise DecisionsError(f"{path}:1: not a decisions file of {FORMAT_NAME} {FORMAT_VERSION}")
    found = []
    for number, line in enumerate(lines[1:], 2):
        decision = parse_line(line)
        if decision is None:
            raise DecisionsError(f"{path}:{number}: not a decision line: {line[:120]!r}")
        if not (number == 2 and decision.callee.startswith(SOURCE_MARK)):
            found.append(decision)
    return found


def needs_locations(cflags: Iterable[str]) -> bool:
    """Whether a build with CFLAGS has no debug info (the last -g option says), so that its
    call sites have locations only with LOCATION_FLAGS."""
    level = "-g0"
    for a in cflags:
        if a.startswith("-g") and a not in ("-gcolumn-info", "-gno-column-info"):
            level = a
    return level == "-g0"


def compile_flags(cflags: Iterable[str]) -> list[str]:
    """What a build with CFLAGS adds to every compile: the recording's and the replay's."""
    return list(LOCATION_FLAGS) if needs_locations(cflags) else []


def link_flags(directory: Path, program: str) -> list[str]:
    """What lld's full-LTO link of PROGRAM adds to replay DIR's decisions for it."""
    return link_replay_flags(str(directory.resolve() / "links" / f"{program}.inl"))


def link_replay_flags(inl: str) -> list[str]:
    """clang's options for an lld LTO link that replay the decisions in the file INL: each
    word behind its own -Xlinker, which clang hands lld whole (-Wl, would split a path
    holding a comma into options of lld's)."""
    return [w for a in replay_flags(inl) for w in ("-Xlinker", a)]


def _ere(text: str) -> str:
    return "".join("\\" + c if c in _ERE_SPECIAL else c for c in text)


def _double_quoted(text: str) -> str:
    """TEXT as one sh word, in double quotes: readable where it holds single quotes."""
    return '"' + "".join("\\" + c if c in '"$`\\' else c for c in text) + '"'


def wrapper_text(
    compiler: str,
    root_from_dir: str,
    flags: list[str],
    every_compile: bool = False,
    profiled: bool = False,
) -> str:
    """The `cc`/`c++` wrapper for COMPILER (a name on PATH, as on any machine with clang),
    adding FLAGS to the compiles that replay a file (EVERY_COMPILE: to all of them), and,
    PROFILED, the directory's profile (MERGED) to every compile."""
    name = "[^']+"  # as mlgo.llvm.replay.LINE reads a name (grep reads no newline)
    line_ere = (
        f"^{_ere(LINE_PREFIX)}{name}({_ere(INLINED_INTO)}|{_ere(NOT_INLINED_INTO)})"
        f"{name}{_ere(AT_CALLSITE)}[^;]+;$"
    )
    marker = "\0"

    def with_path(words: list[str]) -> str:
        return " ".join(
            '"' + w.replace(marker, "$decisions") + '"' if marker in w else shlex.quote(w)
            for w in words
        )

    fills = {
        "@COMPILER@": shlex.quote(compiler),
        "@ROOT_FROM_DIR@": shlex.quote(root_from_dir),
        "@ROOT_ENV@": ROOT_ENV,
        "@HEADER@": _double_quoted(HEADER),
        "@LINE_ERE@": _double_quoted(line_ere),
        "@SUFFIX_FACT@": "mlgo.llvm.driver.SOURCE_SUFFIXES",
        "@SUFFIX_PATTERN@": " | ".join(f"*{s}" for s in SOURCE_SUFFIXES),
        "@REPLAY_FLAGS@": with_path(replay_flags(marker)),
        "@LINK_REPLAY_FLAGS@": with_path(link_replay_flags(marker)),
        "@VERSION@": str(FORMAT_VERSION),
        "@FLAGS@": " ".join(shlex.quote(f) for f in flags),
        "@LOCATE_EVERY_COMPILE@": "1" if every_compile else "''",
        "@SOURCE_PREFIX@": _double_quoted(f"{LINE_PREFIX}{SOURCE_MARK} "),
        "@PROFILED@": "1" if profiled else "''",
        "@MERGED@": MERGED,
        "@PROFILE_SIZE@": str(MAX_PROFILE_BYTES + 1),
        "@PROFILE_LIMIT@": f"{MAX_PROFILE_BYTES >> 20} MiB",
        "@PROFILE_MAGIC@": INDEXED_MAGIC.hex(" "),
        "@PROFILE_FLAGS@": " ".join(
            [f'"{PROFILE_USE}$profile"', *map(shlex.quote, PROFILE_USE_FLAGS)]
        ),
    }
    text = WRAPPER.read_text()
    for placeholder, value in fills.items():
        text = text.replace(placeholder, value)
    return text


def _relative_root(directory: Path, root: Path) -> str:
    """The project root as the wrappers find it from DIR: relative if it can be, so that
    the directory moves with the project."""
    return os.path.relpath(root.resolve(), directory.resolve())


def write(
    directory: Path,
    root: Path,
    files: Mapping[str, UnitDecisions],
    links: Mapping[str, UnitDecisions],
    flags: list[str],
    clang_major: int,
    clangs_own: Mapping[str, dict] | None = None,
    refreshed: Mapping[str, object] | None = None,
    profile: Path | None = None,
) -> Path:
    """Writes the decisions of a build of the project at ROOT (FILES by source path from
    ROOT, LINKS by program) whose compiles add FLAGS (`compile_flags`) as DIR, whole or not
    at all. CLANGS_OWN: the units judged and left to clang's own decisions (each `files/`
    or `links/` and its name: why, and the bytes measured), kept in the summary only;
    REFRESHED: what a refresh judged again, and what it kept as judged before; PROFILE:
    the profile the build was optimized with, copied in for every compile to use."""
    for kind, units in (("files", files), ("links", links)):
        for name in units:
            _checked_name(kind, name, directory)
    root_from_dir = _relative_root(directory, root)
    with atomic_directory(directory) as staging:
        (staging / "FORMAT").write_text(
            f"{FORMAT_NAME} {FORMAT_VERSION}\nclang {clang_major}\n"
            f"key {KEY_FORMAT}\nscope {SCOPE}\nroot {root_from_dir}\n"
        )
        (staging / "flags").write_text(" ".join(flags) + "\n")
        if profile is not None:
            opened = open_profile(profile)
            if isinstance(opened, str):
                raise DecisionsError(f"{profile}: {opened}")
            with opened, (staging / MERGED).open("wb") as copy:
                shutil.copyfileobj(opened, copy)
        programs = sorted(links)
        link_lines = [" ".join(link_flags(directory, p)) for p in programs]
        (staging / "link.flags").write_text("".join(f"{line}\n" for line in link_lines))
        for name, compiler in (("cc", f"clang-{clang_major}"), ("c++", f"clang++-{clang_major}")):
            text = wrapper_text(
                compiler, root_from_dir, flags, bool(links), profiled=profile is not None
            )
            (staging / name).write_text(text)
            (staging / name).chmod(0o755)
        for kind, units in (("files", files), ("links", links)):
            for name, unit in units.items():
                inl = staging / kind / f"{name}.inl"
                inl.parent.mkdir(parents=True, exist_ok=True)
                inl.write_text(inl_text(unit.decisions, unit.cksum))
        summary = {
            "format": FORMAT_VERSION,
            "files": {n: u.summary() for n, u in sorted(files.items())},
            "links": {n: u.summary() for n, u in sorted(links.items())},
            "clangs_own": dict(sorted((clangs_own or {}).items())),
            **({"refreshed": dict(refreshed)} if refreshed is not None else {}),
        }
        (staging / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    return directory


def read(directory: Path) -> Artifact:
    """DIR's summary, after its FORMAT says it is one mlgo reads: a handed directory is
    data, each of its files bounded and each field of its summary checked, so that what
    is wrong is one line naming the file."""
    fmt, path = directory / "FORMAT", directory / "summary.json"
    head = _read_text(fmt, MAX_FORMAT_BYTES).split("\n")
    if head[0] != f"{FORMAT_NAME} {FORMAT_VERSION}":
        raise DecisionsError(f"{fmt}:1: not {FORMAT_NAME} {FORMAT_VERSION}")
    roots = [line.split(" ", 1)[1] for line in head if line.startswith("root ")]
    if any(not r or not r.isprintable() for r in roots):
        raise DecisionsError(f"{fmt}: its root is not one printable line")
    try:
        summary = read_json(path, DecisionsError, MAX_SUMMARY_BYTES)
    except FileNotFoundError:
        raise DecisionsError(f"{directory}: not a decisions directory (no {path})") from None
    _check_shape(summary, _SUMMARY, str(path))
    left, refreshed = summary.get("clangs_own", {}), summary.get("refreshed")
    clangs = [line.split(" ", 1)[1] for line in head if line.startswith("clang ")]
    root = roots[0] if roots else ".."
    major = clangs[0] if clangs and clangs[0].isdigit() else ""
    return Artifact(directory, summary["files"], summary["links"], root, left, refreshed, major)


def foreign_wrappers(artifact: Artifact) -> list[str]:
    """DIR's `cc` and `c++` that are not byte for byte the wrappers mlgo writes for it (its
    FORMAT, flags, links and profile): a handed directory's scripts are code, run by
    every compile."""
    flags = _read_text(artifact.path / "flags", MAX_FORMAT_BYTES).split()
    profiled = (artifact.path / MERGED).exists()
    out = []
    for name, compiler in (("cc", "clang"), ("c++", "clang++")):
        expected = wrapper_text(
            f"{compiler}-{artifact.clang_major}",
            artifact.root_from_dir,
            flags,
            bool(artifact.links),
            profiled,
        )
        try:
            found = _read_text(artifact.path / name, 16 * MAX_FORMAT_BYTES)
        except DecisionsError as e:
            out.append(f"{name}: refused: {e}")
            continue
        if found != expected:
            out.append(f"{name}: refused: not the wrapper mlgo writes for this directory")
    return out


def _departed(unit: Mapping) -> str:
    n = unit.get("departures")
    return "departures unknown" if n is None else f"{n} departing from clang's own"


def _saved(saved: int) -> str:
    return f"{saved} bytes saved" if saved >= 0 else f"{-saved} bytes more"


def _refused(unit: Mapping) -> str:
    n = unit.get("refused")
    return f", {n} inlines clang refuses dropped" if n else ""


def _bought(unit: Mapping) -> str:
    """What a unit's decisions bought in .text against clang's own, where measured."""
    text = unit.get("text")
    return f", {_saved(text['saved'])}" if isinstance(text, Mapping) else ""


def show(artifact: Artifact, by_function: bool = False) -> list[str]:
    """Per file and program (and per function): its decisions, how many inline, how many
    depart from clang's own, how many sites were dropped for conflicting answers, and the
    .text they save against clang's own where measured; then the units left to clang."""
    out = []
    for kind, units in (("files", artifact.files), ("links", artifact.links)):
        for name, unit in units.items():
            out.append(
                f"{kind}/{name}: {unit['decisions']} decisions, {unit['inlined']} inline, "
                f"{_departed(unit)}, {unit['conflicts']} conflicting sites dropped"
                + _refused(unit)
                + _bought(unit)
                + _found_by(unit)
            )
            for caller, f in unit["functions"].items() if by_function else ():
                saved = f", {_saved(f['text_saved'])}" if "text_saved" in f else ""
                out.append(f"  {caller}: {f['decisions']} decisions, {f['inlined']} inline, "
                           f"{f.get('departures', 0)} departing{saved}")  # fmt: skip
    for name, left in artifact.clangs_own.items():
        why = left.get("why") if isinstance(left, Mapping) else None
        out.append(f"{name}: clang's own decisions ({why or 'not kept'})")
    return out


def _found_by(unit: Mapping) -> str:
    """What `show` says of a unit the search found (nothing of the policy's)."""
    if unit.get("found_by") != "search":
        return ""
    return f", found by the search (the policy's decisions saved {unit.get('policy_saved', 0)})"


def _unit_decisions(artifact: Artifact, kind: str, name: str) -> dict[tuple[str, str], Decision]:
    inl = artifact.path / kind / f"{name}.inl"
    return {d.site: d for d in read_inl(inl)} if inl.exists() or inl.is_symlink() else {}


def diff(old: Artifact, new: Artifact) -> list[str]:
    """What changed from OLD to NEW, per file or program and per function: decisions added
    (+), removed (-) and answered the other way (~)."""
    out = []
    for kind in ("files", "links"):
        names = sorted(set(getattr(old, kind)) | set(getattr(new, kind)))
        for name in names:
            a, b = _unit_decisions(old, kind, name), _unit_decisions(new, kind, name)
            changes: dict[str, Counter] = {}
            for site in a.keys() | b.keys():
                was, now = a.get(site), b.get(site)
                if was == now:
                    continue
                mark = "+" if was is None else "-" if now is None else "~"
                changes.setdefault((now or was).caller, Counter())[mark] += 1  # type: ignore[union-attr]
            if changes:
                total = sum(changes.values(), Counter())
                units = getattr(old, kind).get(name, {}), getattr(new, kind).get(name, {})
                out.append(f"{kind}/{name}: {_counts(total)}{_bought_change(*units)}")
                functions = [u.get("functions", {}) for u in units]
                out += [
                    f"  {caller}: {_counts(c)}"
                    + _bought_change(*(f.get(caller, {}) for f in functions), "text_saved")
                    for caller, c in sorted(changes.items())
                ]
    return out or ["no decision changed"]


def _bought_change(old: Mapping, new: Mapping, key: str = "text") -> str:
    """The .text OLD's and NEW's decisions save against clang's own, where both measured."""
    was, now = old.get(key), new.get(key)
    if was is None or now is None:
        return ""
    if key == "text":
        was, now = was["saved"], now["saved"]
    return f"; .text saved {was} -> {now} bytes"


def _counts(c: Counter) -> str:
    return " ".join(f"{mark}{c[mark]}" for mark in "+-~" if c[mark])


def file_states(artifact: Artifact, root: Path) -> dict[str, str]:
    """Per file of ARTIFACT, its source under ROOT: "unchanged" since decided (by digest:
    all its decisions still meet their call sites), "changed" or "gone"."""
    states = {}
    for name, unit in artifact.files.items():
        try:
            digest = source_digest(root / name)
        except FileNotFoundError:
            states[name] = "gone"
            continue
        states[name] = "unchanged" if unit.get("sha256") == digest else "changed"
    return states


def check(
    artifact: Artifact, root: Path, recheck: list[str] | None = None
) -> tuple[list[str], int]:
    """Per file (`file_states`): unchanged, changed or gone. With RECHECK (a compiler, its
    flags and our plugin's -fpass-plugin), each file that inlines is compiled once through
    clang's replay of it, recorded: a changed one says how many decisions still match, and
    each says which of its inlines clang refuses (`Refusal`: a handed line can change what
    the program means), counted. Headers are not digested."""
    out, refusals = [], 0
    for name, state in file_states(artifact, root).items():
        total = artifact.files[name]["decisions"]
        if state == "gone":
            out.append(f"{name}: gone ({total} decisions unused)")
            continue
        if recheck is None or (state == "unchanged" and not artifact.files[name]["inlined"]):
            visited, refused = None, []
        else:
            command = [*recheck, "-c", str((root / name).resolve()), "-o", os.devnull]
            visited, refused = replayed(artifact, name, command, root)
        if state == "unchanged":
            out.append(f"{name}: unchanged, all {total} decisions match")
        elif visited is None:
            out.append(f"{name}: changed since recorded, {total} decisions to recheck")
        else:
            matched, total = visited
            out.append(f"{name}: changed, {matched} of {total} decisions still match")
        out += [f"{name}: refused: {r}" for r in refused]
        refusals += len(refused)
    return out, refusals


def recheck_command(cflags: list[str]) -> list[str]:
    """What `check` recompiles a changed file with: clang with CFLAGS, as recorded, and the
    plugin of the shipped size policy, for its recorder (any policy's plugin has one)."""
    tc = find_toolchain()
    policy = load_policy(shipped_policy("inlining-size"))
    plugin = inliner_plugin(policy, tc)
    return [tc.clang, *cflags, *compile_flags(cflags), f"-fpass-plugin={plugin}"]


def build_flags(artifact: Artifact, cflags: list[str], link: bool) -> tuple[list[str], str]:
    """What a build with CFLAGS adds beside DIR's wrappers, and a note on how to build. A
    compile adds nothing: the wrappers add DIR/flags themselves, whose `-Rpass=` libtool
    would take for a run path in CFLAGS. A full-LTO link by plain clang (LINK: of the
    program CFLAGS name with -o, or DIR's only one) adds its replay as `-Wl,WORD` words
    without commas, which libtool and CMake pass on as they are."""
    recorded = _read_text(artifact.path / "flags", MAX_FORMAT_BYTES).split()
    if recorded != compile_flags(cflags):
        raise DecisionsError(
            f"{artifact.path / 'flags'}: recorded for a build "
            f"{'without' if recorded else 'with'} debug info, unlike these flags: "
            "call-site keys would not match"
        )
    wrappers = f"CC={artifact.path}/cc CXX={artifact.path}/c++"
    if not link:
        return [], f"compile with {wrappers}: they add what each compile needs, CFLAGS nothing"
    if any(c.isspace() or c in ",*?[\\'\"" for c in str(artifact.path.resolve())):
        raise DecisionsError(
            f"{artifact.path}: its path would split or glob in a shell's $(...), or split at "
            "-Wl,'s commas; link with its cc or c++ instead, which take any path"
        )
    named = named_output(cflags)
    programs = [Path(named).name] if named else list(artifact.links)
    if len(programs) != 1 or programs[0] not in artifact.links:
        known = ", ".join(artifact.links) or "none"
        raise DecisionsError(f"{artifact.path}: name the program with -o (programs: {known})")
    inl = artifact.path.resolve() / "links" / f"{programs[0]}.inl"
    return [f"-Wl,{w}" for w in replay_flags(str(inl))], (
        f"replays links/{programs[0]}.inl at a link by plain clang of objects compiled "
        f"with {wrappers} (which also link it so, with nothing in LDFLAGS)"
    )


def still_matching(artifact: Artifact, name: str, command: list[str], cwd: Path) -> tuple[int, int]:
    """Of file NAME's decisions, how many still meet their call site when COMMAND (its
    compile, loading our plugin) replays them, and how many there are. The rest are stale:
    clang's own heuristic decides there."""
    return replayed(artifact, name, command, cwd)[0]


def replayed(
    artifact: Artifact, name: str, command: list[str], cwd: Path
) -> tuple[tuple[int, int], list[Refusal]]:
    """File NAME replayed by COMMAND (its compile, loading our plugin), with the recorder
    around clang's replay, which sees which sites the inliner visits and answers "no" at an
    inline clang refuses: (`still_matching`'s counts, those refusals)."""
    inl = artifact.path / "files" / f"{name}.inl"
    decided = {d.site for d in read_inl(inl)}
    visited, _, refused = record(command, cwd, REPLAY_ADVISOR_PREFIX + str(inl.resolve()))
    met = decided & ({d.site for d in visited} | {r.decision.site for r in refused})
    return (len(met), len(decided)), refused
