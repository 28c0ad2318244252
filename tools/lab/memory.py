"""The resident memory of a process tree, sampled from /proc, and its peak in each stage of
a tune (`stages.json`'s `ended` times): issue 74's "peak memory" of a large project's tune,
measured from outside the tune, so that nothing in it runs a thread for the figure."""

from __future__ import annotations

import os
from collections.abc import Iterable
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

PAGE = os.sysconf("SC_PAGE_SIZE")


@dataclass(frozen=True)
class Sample:
    at: float  # seconds since the epoch
    total: int  # bytes resident in the whole tree
    largest: int  # bytes resident in its largest process


def _parents() -> dict[int, int]:
    """Every live process's parent, from /proc/PID/stat (the field after the command's ")")."""
    out: dict[int, int] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_text()
        except OSError:
            continue  # gone since the listing
        out[int(entry.name)] = int(stat[stat.rindex(")") + 2 :].split()[1])
    return out


def tree(root: int, parents: dict[int, int]) -> set[int]:
    """ROOT and all its descendants in PARENTS."""
    children: dict[int, list[int]] = {}
    for pid, parent in parents.items():
        children.setdefault(parent, []).append(pid)
    found, todo = set(), [root]
    while todo:
        pid = todo.pop()
        if pid not in found:
            found.add(pid)
            todo += children.get(pid, [])
    return found


def resident(pid: int) -> int:
    """PID's resident bytes (0 once it is gone)."""
    try:
        return int(Path(f"/proc/{pid}/statm").read_text().split()[1]) * PAGE
    except (OSError, IndexError, ValueError):
        return 0


def sample(root: int, at: float) -> Sample:
    sizes = [resident(p) for p in tree(root, _parents())]
    return Sample(at, sum(sizes), max(sizes, default=0))


def peaks_by_stage(samples: Iterable[Sample], ended: dict[str, str]) -> dict[str, Sample]:
    """Each stage's sample of most resident memory: a sample belongs to the first stage (in
    ENDED's order, `stages.json`'s ISO local times) that ended after it, or to "after"."""
    ends = [(name, datetime.fromisoformat(t).timestamp()) for name, t in ended.items()]
    peaks: dict[str, Sample] = {}
    for s in samples:
        stage = next((name for name, end in ends if s.at <= end), "after")
        if stage not in peaks or s.total > peaks[stage].total:
            peaks[stage] = s
    return peaks
