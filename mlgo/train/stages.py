"""The stages of a run, each done once into one directory: a tune's (snapshot ... report,
`programs/tune.py`) and a shipped policy's recipe's (its trainings and calibration, in the
lab: tools/lab/reproduce.py). A
rerun skips the finished ones and a stopped one resumes (a trainer from its checkpoint), so
that hours of training are never repeated because the last step failed.

A `Stage` is declared, as a trainer is: its name, what it does with the run, the arguments
its result depends on, the one whose larger value alone runs it (and what follows) again (a
budget), whether a refresh runs it again, and where it writes. `run_stages` runs those not
finished, in order, each timed, and names the stage on an error. `StageRecord` is the one
record of a run: which stages finished and when, and each one's seconds and CPU seconds
(the run's own and its reaped children's: what its builds and compiles cost), summed over
the runs that worked on it (a stop by SIGTERM or Ctrl-C counts them; SIGKILL's are lost),
with the run's result if it has one, rewritten whole after each stage. `check_arguments` refuses
a rerun whose arguments differ in one a finished stage depended on, naming it, rather than
mixing results.
"""

from __future__ import annotations

import json
import resource
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Generic, TypeVar

from mlgo.runtime.commands import BuildError
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.inputs import read_json
from mlgo.runtime.messages import naming

R = TypeVar("R")  # what a run's stages work on: a tune's run, or nothing


@dataclass(frozen=True)
class Stage(Generic[R]):
    """One stage: NAME, what it does with the run (RUN), the arguments its result depends
    on (DEPENDS), the one argument whose larger value alone runs it and the stages after
    it again (GROWS, saying GROWING with {old} and {new}), whether --refresh runs it again
    (REFRESHED), and where it writes (WHERE, named on an error that names no file)."""

    name: str
    run: Callable[[R], object]
    depends: tuple[str, ...] = ()
    grows: str | None = None
    growing: str = ""
    refreshed: bool = False
    where: Callable[[R], Path] | None = None


class StageRecord:
    """The stages NAMES of one run, as the JSON record at PATH keeps them (see the module
    doc), ending with RESULT (what the run found, if anything)."""

    def __init__(self, path: Path, names: Sequence[str], result: dict | None = None):
        self.path, self.names = path, tuple(names)
        self.finished: list[str] = []
        self.ended: dict[str, str] = {}  # when each finished stage finished
        self.seconds: dict[str, float] = {}  # every stage worked on
        self.cpu: dict[str, float] = {}  # and its CPU seconds (none in a record before them)
        self.result = result or {}

    @classmethod
    def load(
        cls, path: Path, names: Sequence[str], result: dict | None = None, skip: Sequence[str] = ()
    ) -> StageRecord:
        """The record at PATH (none finished if there is none yet), but the stages to SKIP
        (to be run again) taken as unfinished; a ValueError if it is not such a record."""
        record = cls(path, names, result)
        if path.exists():
            data = read_json(path)  # a UsageError, a ValueError too, if it is not JSON
            try:
                seconds, finished = dict(data["seconds"]), list(data["finished"])
                ended, cpu = dict(data.get("ended", {})), dict(data.get("cpu_seconds", {}))
            except (KeyError, TypeError, ValueError) as e:
                raise ValueError(repr(e)) from None
            if not set(finished) <= set(names) or not all(
                isinstance(v, int | float) for v in [*seconds.values(), *cpu.values()]
            ):
                raise ValueError("a stage or its seconds unknown")
            record.seconds, record.cpu = seconds, cpu
            record.finished = [s for s in finished if s not in skip]
            record.ended = {s: str(t) for s, t in ended.items() if s in record.finished}
        return record

    def done(self, stage: str) -> bool:
        return stage in self.finished

    def reopen(self, stage: str) -> None:
        """STAGE and those after it are to be run again, if STAGE had finished."""
        if stage in self.finished:
            self.finished = self.finished[: self.finished.index(stage)]
            self.save()

    @contextmanager
    def timing(self, stage: str) -> Iterator[None]:
        """STAGE, timed: finished if its body returns; its seconds counted and the record
        saved however it ends (an error, SystemExit from SIGTERM's handler, Ctrl-C)."""
        start, cpu = time.monotonic(), cpu_seconds()
        try:
            yield
            self.finished.append(stage)
            self.ended[stage] = time.strftime("%Y-%m-%dT%H:%M:%S")
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.monotonic() - start
            self.cpu[stage] = self.cpu.get(stage, 0.0) + cpu_seconds() - cpu
            self.save()

    def summary(self) -> dict:
        """Each stage's seconds, their total in minutes (of the seconds as written, so that
        a record read back and written again says the same), its CPU seconds, the stages
        finished and when, and the result."""
        seconds = {s: round(self.seconds[s], 1) for s in self.names if s in self.seconds}
        return {
            "seconds": seconds,
            "total_minutes": round(sum(seconds.values()) / 60, 1),
            "cpu_seconds": {s: round(self.cpu[s], 1) for s in self.names if s in self.cpu},
            "finished": [s for s in self.names if s in self.finished],
            "ended": {s: self.ended[s] for s in self.names if s in self.ended},
            **self.result,
        }

    def save(self) -> None:
        """The record rewritten whole."""
        atomic_write_text(self.path, json.dumps(self.summary(), indent=1))


def cpu_seconds() -> float:
    """User and system seconds of this process (all its threads) and its reaped children
    (their own reaped children included: a build's every compile) so far."""
    own, children = (
        resource.getrusage(w) for w in (resource.RUSAGE_SELF, resource.RUSAGE_CHILDREN)
    )
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def run_stages(stages: Sequence[Stage[R]], record: StageRecord, run: R, what: str) -> None:
    """Each of STAGES that RECORD has not finished, in order, on RUN, timed; an OSError
    that names no file (a full disk) names WHAT's stage and where it writes."""
    for stage in stages:
        if record.done(stage.name):
            continue
        where = stage.where(run) if stage.where else record.path.parent
        with record.timing(stage.name), naming(f"{what}'s {stage.name} stage, in {where}"):
            stage.run(run)


def check_arguments(
    path: Path,
    args: dict,
    stages: Sequence[Stage],
    record: StageRecord,
    say: Callable[[str], None] = print,
) -> None:
    """ARGS against those of the run before, in PATH: refused (naming the argument) where
    one that a stage RECORD finished depended on differs, except the GROWS argument of a
    stage alone, larger, which reopens that stage (it resumes) and what follows it."""
    if not path.is_file():
        return
    before = read_json(path, BuildError)
    if not isinstance(before, dict):
        raise BuildError(f"{path}: not a run's arguments (not a JSON object)")
    depended = {a for s in stages for a in s.depends}
    differ = {k for k in depended if before.get(k) != args.get(k)}
    for stage in stages:
        grown = stage.grows
        if grown and differ == {grown} and _larger(args.get(grown), before.get(grown)):
            say(stage.growing.format(old=before[grown], new=args[grown]))
            record.reopen(stage.name)
    for arg in (a for s in stages if record.done(s.name) for a in s.depends):
        if before.get(arg) != args.get(arg):
            raise BuildError(
                f"{path.parent}: tuned before with {arg} {before.get(arg)!r}, not "
                f"{args.get(arg)!r}; rerun with it, or choose another --out"
            )


def _larger(new: object, old: object) -> bool:
    numbers = isinstance(new, int | float) and isinstance(old, int | float)
    return numbers and new > old  # type: ignore[operator]
