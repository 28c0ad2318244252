"""The guard's choice made once, so that what ships is decided: each unit of a recorded
build (a source's compile, a program's LTO link) where the policy departs from clang's
own is built again by plain clang, from its decisions (as the directory's wrappers replay
them), and weighed against its output by clang's own heuristic (made when it was
recorded): its decisions are kept where the replayed `.text` is smaller (for size; for
speed, a workload judged the policy, and every departing unit is kept). A unit that
departs nowhere, loses or ties carries no decisions file: clang's own decide there, and
only the files that gain pay for -g0's locations (a tie would pay them for nothing).
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from collections.abc import Mapping
from pathlib import Path

from mlgo.corpus.extract import Invocation
from mlgo.llvm.cmdline import without_outputs
from mlgo.llvm.replay import replay_flags
from mlgo.llvm.sizes import function_sizes, text_size
from mlgo.runtime.messages import error_line
from mlgo.runtime.trust import private_temp_dir
from mlgo.ship.decisions import (
    DecisionsError,
    Sizes,
    UnitDecisions,
    inl_text,
    link_replay_flags,
)
from mlgo.ship.decisions_record import Recorded

Kept = tuple[dict[str, UnitDecisions], dict[str, UnitDecisions], dict[str, dict]]


def replayed_sizes(
    call: Invocation, flags: list[str], replay: list[str], work: Path, clangs: Path
) -> Sizes:
    """CALL run again by plain clang to WORK/decisions, with FLAGS and REPLAY (the options
    that apply its decisions) added: its .text and that of CLANGS, its output by clang's
    own (`Recorded.clangs`)."""
    mine = work / "decisions"
    command = [*without_outputs(call.argv), *flags, *replay, "-o", str(mine)]
    proc = subprocess.run(command, cwd=call.cwd, capture_output=True, text=True)
    if proc.returncode != 0:
        raise DecisionsError(
            f"rebuilding {shlex.join(call.argv[:3])} ... in {call.cwd} "
            f"(exit {proc.returncode}): {error_line(proc.stderr)}"
        )
    return Sizes(text_size(mine), text_size(clangs), function_sizes(mine), function_sizes(clangs))


def unchanged(found: Recorded, before: Mapping[str, dict]) -> dict[str, dict]:
    """The verdicts BEFORE (`Artifact.verdicts`) of FOUND's sources whose digest is the
    same: the same source and policy make the same decisions, which need no new judge."""
    return {
        f"files/{name}": before[f"files/{name}"]
        for name, unit in found.files.items()
        if unit.digest and before.get(f"files/{name}", {}).get("sha256") == unit.digest
    }


def keep(
    found: Recorded,
    aim: str,
    as_before: Mapping[str, dict] | None = None,
    searched: Mapping[str, UnitDecisions] | None = None,
) -> Kept:
    """Of FOUND's units, those to ship (files, links), each with its sizes measured, and
    those left to clang's own, by `files/NAME` or `links/NAME`, with why (and the bytes
    where measured). AIM "size" keeps a unit only where its .text is smaller; a unit the
    search answered too (SEARCHED, by the same names: `answered_units`, `answered_links`)
    keeps whichever of the two builds smaller. A unit in AS_BEFORE (`unchanged`) keeps its
    verdict there, unjudged."""
    kept: dict[str, dict[str, UnitDecisions]] = {"files": {}, "links": {}}
    left: dict[str, dict] = {}
    calls = {"files": found.compiles, "links": found.link_calls}
    with tempfile.TemporaryDirectory(prefix="mlgo-keep-", dir=private_temp_dir()) as d:
        work = Path(d)

        def weighed(kind: str, name: str, unit: UnitDecisions) -> Sizes:
            inl = work / "unit.inl"
            inl.write_text(inl_text(unit.decisions))
            if kind == "files":
                flags, replay = found.flags, replay_flags(str(inl))
            else:
                flags, replay = [], link_replay_flags(str(inl))
            clangs = found.clangs[f"{kind}/{name}"]
            return replayed_sizes(calls[kind][name], flags, replay, work, clangs)

        for kind, units in (("files", found.files), ("links", found.links)):
            for name, policys in units.items():
                if (verdict := (as_before or {}).get(f"{kind}/{name}")) is not None:
                    if "why" in verdict:
                        left[f"{kind}/{name}"] = verdict
                    else:
                        policys.judged = verdict
                        kept[kind][name] = policys
                    continue
                source = {"sha256": policys.digest} if policys.digest else {}
                other = (searched or {}).get(f"{kind}/{name}")
                departing = [
                    u
                    for u in (policys, other)
                    if u is not None and sum((u.departures or {}).values())
                ]
                if not departing:
                    left[f"{kind}/{name}"] = {"why": "no departure from clang's own", **source}
                    continue
                for unit in departing:
                    unit.sizes = weighed(kind, name, unit)
                best = max(departing, key=lambda u: u.sizes.saved if u.sizes else 0)
                assert best.sizes is not None
                if aim == "size" and best.sizes.saved <= 0:
                    departed = sum((best.departures or {}).values())
                    more = (
                        f"{-best.sizes.saved} bytes more" if best.sizes.saved else "the same bytes"
                    )
                    left[f"{kind}/{name}"] = {
                        "why": f"its {departed} departures build {more}",
                        "departures": departed,
                        "text": best.sizes.totals(),
                        **source,
                    }
                    continue
                if best is not policys:  # what the search gained over the policy
                    best.policy_saved = policys.sizes.saved if policys.sizes else 0
                kept[kind][name] = best
    return kept["files"], kept["links"], left
