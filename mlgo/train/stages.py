"""The stages of a chain (record, trace, train, calibrate, ...) run into one directory, each
done once: a rerun skips the finished ones and a stopped one resumes (a trainer from its
checkpoint), so that hours of training are never repeated because the last step failed.

`Stages` keeps which stages finished and how long each took, rewritten atomically after
each, in one of two records:

- a tune's (`Stages.logged`): OUT/stages.log, a finished stage per line with the time it
  finished, beside OUT/tune.json, the arguments; a rerun whose arguments differ in one a
  finished stage depended on is refused, naming it, rather than mixing results;
- a recipe's (`Stages.timed`): a JSON record of each stage's seconds, summed over the runs
  that worked on it (a stop by SIGTERM or Ctrl-C counts them; SIGKILL's are lost), and the
  stages finished.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

from mlgo.corpus.format import Corpus, load_corpus
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import Problem
from mlgo.runtime.commands import BuildError
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.inputs import read_json
from mlgo.runtime.workers import Workers
from mlgo.train import policy_dir


class Stages:
    """The stages NAMES of one run, in order, recorded in RECORD (see the module doc)."""

    def __init__(self, record: Path, names: Sequence[str], result: dict | None = None):
        self.record, self.names = record, tuple(names)
        self.finished: list[str] = []
        self.seconds: dict[str, float] = {}  # every stage worked on
        self.result = result  # a timed record's last entries (None: a log)
        self._ended: dict[str, str] = {}  # a log's: when each finished stage finished
        self._arguments: tuple[Path, dict] = (record.parent / "tune.json", {})  # a log's

    @classmethod
    def timed(cls, record: Path, names: Sequence[str], result: dict) -> Stages:
        """The stages NAMES as the JSON RECORD holds them (none finished if there is none
        yet), which ends with RESULT (what the run found, rewritten by its last stage); a
        ValueError if RECORD is not such a record (JSONDecodeError too)."""
        stages = cls(record, names, result)
        if not record.exists():
            return stages
        try:
            data = read_json(record)
            seconds, finished = dict(data["seconds"]), list(data["finished"])
        except (KeyError, TypeError) as e:
            raise ValueError(repr(e)) from None
        if not set(finished) <= set(names) or not all(
            isinstance(v, int | float) for v in seconds.values()
        ):
            raise ValueError("a stage or its seconds unknown")
        stages.seconds, stages.finished = seconds, finished
        return stages

    @classmethod
    def logged(
        cls,
        out: Path,
        depends: dict[str, tuple[str, ...]],
        args: dict,
        say: Callable[[str], None] = print,
        rerun: Sequence[str] = (),
    ) -> Stages:
        """OUT/stages.log and OUT/tune.json (ARGS, written anew): the stages of DEPENDS,
        each with the arguments its result depends on besides its predecessors' ones, but
        those to RERUN, which are run again whatever they depended on. Refuses an OUT that
        holds other files, and ARGS that differ in one a finished stage depended on, except
        a larger budget alone (`minutes`), which reopens training (it resumes from its
        checkpoint) and what follows it. With RERUN, tune.json is kept as it was until
        `keep_arguments`: a rerun that fails leaves it so."""
        stages = cls(out / "stages.log", depends)
        stages._arguments = (out / "tune.json", args)
        arguments = out / "tune.json"
        if out.exists() and any(out.iterdir()) and not arguments.is_file():
            raise BuildError(f"{out}: exists and is not a tune directory; choose another --out")
        for line in stages._lines():
            stage, _, ended = line.partition("\t")
            if stage not in rerun:
                stages.finished.append(stage)
                stages._ended[stage] = ended
        if arguments.is_file():
            before = read_json(arguments, BuildError)
            if not isinstance(before, dict):
                raise BuildError(f"{arguments}: not a tune's arguments (not a JSON object)")
            depended = {a for used in depends.values() for a in used}
            differ = {k for k in depended if before.get(k) != args.get(k)}
            if differ == {"minutes"} and args["minutes"] > before["minutes"]:
                say(f"training on from {before['minutes']:g} to {args['minutes']:g} minutes")
                stages.reopen("train")
            used = [a for s in stages.finished for a in depends.get(s, ())]
            for arg in used:
                if before.get(arg) != args.get(arg):
                    raise BuildError(
                        f"{out}: tuned before with {arg} {before.get(arg)!r}, not "
                        f"{args.get(arg)!r}; rerun with it, or choose another --out"
                    )
        if not rerun:
            stages.keep_arguments()
        return stages

    def keep_arguments(self) -> None:
        """A tune's arguments written to its tune.json: the ones its results now follow."""
        path, args = self._arguments
        atomic_write_text(path, json.dumps(args, indent=1))

    def _lines(self) -> list[str]:
        return self.record.read_text().splitlines() if self.record.is_file() else []

    def done(self, stage: str) -> bool:
        return stage in self.finished

    def reopen(self, stage: str) -> None:
        """STAGE and those after it are to be run again, if STAGE had finished."""
        if stage in self.finished:
            self.finished = self.finished[: self.finished.index(stage)]
            self.save()

    def finish(self, stage: str) -> None:
        self.finished.append(stage)
        self._ended[stage] = time.strftime("%Y-%m-%dT%H:%M:%S")
        self.save()

    @contextmanager
    def run(self, stage: str) -> Iterator[None]:
        """STAGE, timed: finished if its body returns; its seconds counted and the record
        saved however it ends (an error, SystemExit from SIGTERM's handler, Ctrl-C)."""
        start = time.monotonic()
        try:
            yield
            self.finished.append(stage)
        finally:
            self.seconds[stage] = self.seconds.get(stage, 0.0) + time.monotonic() - start
            self.save()

    def summary(self) -> dict:
        """A timed record: each stage's seconds, their total in minutes (of the seconds as
        written, so that a record read back and written again says the same), the stages
        finished, and the result."""
        seconds = {s: round(self.seconds[s], 1) for s in self.names if s in self.seconds}
        return {
            "seconds": seconds,
            "total_minutes": round(sum(seconds.values()) / 60, 1),
            "finished": [s for s in self.names if s in self.finished],
            **(self.result or {}),
        }

    def save(self) -> None:
        """The record rewritten whole."""
        if self.result is not None:
            text = json.dumps(self.summary(), indent=1)
        else:
            text = "".join(f"{s}\t{self._ended[s]}\n" for s in self.finished)
        atomic_write_text(self.record, text)


@dataclass(frozen=True)
class Training:
    """A recipe's training stage: trainer ALGO on CORPUS, for MINUTES (0: its own number
    of steps), with OPTIONS (fields of `TrainOptions`), from the stage before it (the first
    from START, a policy, if given); EVALUATE: then evaluated on CORPUS (OUT/NAME/eval)."""

    algo: str
    corpus: Corpus
    minutes: float = 0.0
    options: dict = field(default_factory=dict)
    start: Path | None = None
    evaluate: bool = False
    steps: int = 0  # at most this many of the trainer's steps; 0: its own number


@dataclass(frozen=True)
class Calibrating:
    """A recipe's calibration of the stage before it on the corpus at CORPUS (read when
    its turn comes), judged as served with GUARD, into OUT (`calibrate_policy`)."""

    corpus: Path
    out: Path
    guard: str | None = None


def run_in_turn(
    stages: Stages,
    recipe: dict[str, Training | Calibrating],
    out: Path,
    problem: Problem,
    tc: Toolchain,
    workers: Workers,
) -> None:
    """Each stage of RECIPE that STAGES has not finished, timed, from the policy of the
    stage before it (the first from its start or nothing), a training into OUT/NAME. No
    training is evaluated on its corpus unless it asks (`mlgo train` would): the time goes
    to training."""
    from mlgo.train.calibrate import calibrate_policy
    from mlgo.train.run import TrainOptions, load_start, run

    before = None
    for name, stage in recipe.items():
        if not stages.done(name):
            with stages.run(name):
                if isinstance(stage, Calibrating):
                    assert before is not None, "a calibration follows a training"
                    corpus = load_corpus(stage.corpus).require(problem)
                    calibrate_policy(
                        policy_dir(before), corpus, tc, workers, stage.out, stage.guard
                    )
                else:
                    budget, init = 60 * stage.minutes, before or stage.start
                    opts = TrainOptions(
                        steps=stage.steps, init=init, max_seconds=budget, trainer=stage.options
                    )
                    start = load_start(init, problem) if init else None
                    run(stage.algo, stage.corpus, problem, out / name, tc, workers, opts,
                        evaluate_on_corpus=stage.evaluate, start=start)  # fmt: skip
        before = stage.out if isinstance(stage, Calibrating) else out / name
