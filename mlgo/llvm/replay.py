"""clang's inline replay (`-mllvm -cgscc-inline-replay=FILE`): the line format its
ReplayInlineAdvisor parses, the flags that apply a file, and how our plugin's recorder is
asked to write one (mlgo/ship/native/inline_plugin.cc gets these strings from
mlgo.ship.plugin, so C and Python share them).

A line is `PREFIX'CALLEE' inlined into 'CALLER' at callsite KEY;` or the same with
`' will not be inlined into '`; KEY is LLVM's formatCallSiteLocation of the call site
(LineColumnDiscriminator: `Function:LINE-OFFSET:COL[.DISC]`, joined with ` @ ` up the
inlined-at chain). clang looks a decision up by CALLEE and KEY and refuses a whole file over
one line it cannot parse (a compile error), so a file is checked before clang sees it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

KEY_FORMAT = "LineColumnDiscriminator"  # LLVM's default; the recorder writes it
SCOPE = "Module"  # every function of the module, not only those the file names
LINE_PREFIX = "mlgo: '"
INLINED_INTO, NOT_INLINED_INTO = "' inlined into '", "' will not be inlined into '"
AT_CALLSITE = "' at callsite "
# The plugin's recorder: on when DECISIONS_OUT_ENV names a file; whose advice it records.
DECISIONS_OUT_ENV = "MLGO_DECISIONS_OUT"
DECISIONS_ADVISOR_ENV = "MLGO_DECISIONS_ADVISOR"  # unset: the policy's
CLANG_ADVISOR = "clang"
REPLAY_ADVISOR_PREFIX = "replay:"  # then the file's path: clang's replay of it
# then the path of a file of '0' and '1', one a decision in the order asked: a searched
# trajectory's answers, which the recorder so keys by call site
ANSWERS_ADVISOR_PREFIX = "answers:"
# A search's compile inside clang (mlgo.train.plugin_compile): the path of its spec, and
# the files the plugin writes beside it: every observation, as the channel sends it, and
# the answers given ('0' and '1' bytes).
TRAJECTORY_ENV = "MLGO_TRAJECTORY"
TRAJECTORY_LOG, TRAJECTORY_ANSWERS = "observations", "answers"
# After a recorder's inline line at a callee clang itself would never inline there (not
# viable, or refused by its attributes), then clang's reason: the recorder answered "no".
NOT_VIABLE = " not viable: "

_NAME = r"[^'\n]+"
LINE = re.compile(
    rf"{re.escape(LINE_PREFIX)}(?P<callee>{_NAME})"
    rf"(?P<verdict>{re.escape(INLINED_INTO)}|{re.escape(NOT_INLINED_INTO)})"
    rf"(?P<caller>{_NAME}){re.escape(AT_CALLSITE)}(?P<key>[^;\n]+);"
)


@dataclass(frozen=True, order=True)
class Decision:
    """One call site's answer: sorted by caller, then key, so a file diffs well."""

    caller: str
    key: str
    callee: str
    inline: bool

    @property
    def site(self) -> tuple[str, str]:
        """What clang looks a decision up by."""
        return self.callee, self.key

    def line(self) -> str:
        verdict = INLINED_INTO if self.inline else NOT_INLINED_INTO
        return f"{LINE_PREFIX}{self.callee}{verdict}{self.caller}{AT_CALLSITE}{self.key};"


def parse_line(text: str) -> Decision | None:
    """The decision on one line, or None if clang would not read it as ours."""
    m = LINE.fullmatch(text)
    if not m:
        return None
    inline = m["verdict"] == INLINED_INTO
    return Decision(m["caller"], m["key"], m["callee"], inline)


def parse_recorded(text: str) -> tuple[Decision, str | None] | None:
    """A line of our recorder's: its decision, and clang's reason where the line is marked
    NOT_VIABLE (an inline clang would refuse, which the recorder answered "no"); None if
    it is not one."""
    m = LINE.match(text)
    rest = text[m.end() :] if m else ""
    if not m or (rest and not rest.startswith(NOT_VIABLE)):
        return None
    decision = parse_line(m[0])
    assert decision is not None
    return decision, rest[len(NOT_VIABLE) :] if rest else None


def replay_flags(path: str) -> list[str]:
    """clang's options that apply the decisions in PATH, clang's own heuristic elsewhere."""
    return [
        "-mllvm", f"-cgscc-inline-replay={path}",
        "-mllvm", f"-cgscc-inline-replay-scope={SCOPE}",
        "-mllvm", "-cgscc-inline-replay-fallback=Original",
        "-mllvm", f"-cgscc-inline-replay-format={KEY_FORMAT}",
    ]  # fmt: skip
