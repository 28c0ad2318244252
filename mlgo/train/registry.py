"""The training algorithms `mlgo train --algo` knows, each declared by its module as TRAINER.

ES, PPO and BC-Max are searches stepped by the one loop (mlgo.train.loop.Trainer); BC fits
the default's own traces and has no search loop. A new algorithm is one module and one line
in `MODULES`: its options are its config's (mlgo.train.options), and `mlgo train`'s flags
are drawn from every registered trainer's (`options`).
"""

from __future__ import annotations

from dataclasses import replace
from importlib import import_module
from typing import TYPE_CHECKING, Any, ClassVar, Protocol

from mlgo.corpus.format import Corpus
from mlgo.errors import UsageError
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import Problem
from mlgo.problems.policy import MLPPolicy
from mlgo.runtime.workers import Workers
from mlgo.train import Outcome, RunDir
from mlgo.train.options import Option, declared

if TYPE_CHECKING:
    from mlgo.train.loop import Reward

# The modules that declare a trainer as their TRAINER, one line each.
MODULES = (
    "mlgo.train.bc",
    "mlgo.train.es",
    "mlgo.train.ppo",
    "mlgo.train.bcmax",
)


class Algorithm(Protocol):
    """What `run` asks of a registered trainer (a class, made from its Config)."""

    name: ClassVar[str]
    Config: ClassVar[type]  # a frozen dataclass declaring its options (mlgo.train.options)
    uses_start: ClassVar[bool]  # trains from a start policy (--init)

    def __init__(self, config: Any) -> None: ...

    @classmethod
    def refuses(cls, problem: Problem) -> str | None: ...

    def train(
        self,
        corpus: Corpus,
        problem: Problem,
        start: MLPPolicy | None,
        run_dir: RunDir,
        tc: Toolchain,
        workers: Workers,
        reward: Reward | None = None,  # what a search scores by, if not the corpus's metric
    ) -> Outcome: ...


def trainers() -> dict[str, type[Algorithm]]:
    """Every registered trainer by name, in the order of `MODULES`."""
    registered = (import_module(m).TRAINER for m in MODULES)
    return {t.name: t for t in registered}


def get_trainer(name: str) -> type[Algorithm]:
    known = trainers()
    if name not in known:
        *others, last = known
        raise UsageError(f"unknown --algo {name!r}: use {', '.join(others)} or {last}")
    return known[name]


def options() -> dict[str, Option]:
    """Every registered trainer's options by name, each once, its help saying which trainers
    take it (per help, where theirs differ). Trainers that share a name share its type,
    default and checks: one flag cannot have two defaults."""
    merged: dict[str, Option] = {}
    takers: dict[str, dict[str, list[str]]] = {}  # option -> its help -> the trainers saying it
    for name, trainer in trainers().items():
        for o in declared(trainer.Config).values():
            first = merged.setdefault(o.name, o)
            if replace(first, help="") != replace(o, help=""):
                raise TypeError(f"{name} declares the option {o.name} unlike another trainer")
            takers.setdefault(o.name, {}).setdefault(o.help, []).append(name)
    return {
        n: replace(o, help="; ".join(f"{', '.join(who)}: {h}" for h, who in takers[n].items()))
        for n, o in merged.items()
    }
