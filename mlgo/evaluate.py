"""Compiling a corpus with a policy and comparing each module with the default heuristic.

The baseline is the plain compile (the same cc1 command without the channel), which the
channel replays byte for byte; its per-module cost is cached in the corpus, so training
pays for it once.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from mlgo.channel import Policy
from mlgo.compile import CompileError, compile_module
from mlgo.corpus import Corpus, Module
from mlgo.fsutil import atomic_write_text
from mlgo.problems import get_problem
from mlgo.stats import corpus_stats
from mlgo.toolchain import Toolchain
from mlgo.workers import Failed, Workers


@dataclass(frozen=True)
class EvalTask:
    problem: str
    module: Module
    clang: str
    policy: Policy | None
    tag: int = 0  # lets a trainer tell apart results of different policies in one batch


def eval_one(task: EvalTask) -> dict[str, float]:
    run = compile_module(get_problem(task.problem), task.module, task.clang, task.policy)
    return {
        "decisions": run.num_decisions,
        "changed": int((run.advice != run.default).sum()),
        **run.metrics,
    }


def baseline_sizes(corpus: Corpus, tc: Toolchain, workers: Workers) -> dict[str, float]:
    """Plain -Oz .text bytes per module (cached in the corpus by `mlgo corpus stats`)."""
    stats, failures = corpus_stats(corpus, tc.describe(), tc.clang, workers)
    if failures:
        msg = next(iter(failures.values()))
        raise CompileError(f"baseline compile failed for {len(failures)} modules, e.g. {msg}")
    return {name: float(s["text_size"]) for name, s in stats.items()}


@dataclass
class Evaluation:
    problem: str
    toolchain: str
    corpus: str
    modules: dict[str, dict[str, float]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    def totals(self) -> dict[str, float]:
        policy = sum(m["text_size"] for m in self.modules.values())
        default = sum(m["default_text_size"] for m in self.modules.values())
        return {
            "modules": len(self.modules),
            "text_size": policy,
            "default_text_size": default,
            "delta": (policy - default) / default if default else 0.0,
        }

    def per_package(self) -> dict[str, dict[str, float]]:
        out: dict[str, dict[str, float]] = {}
        for name, m in self.modules.items():
            row = out.setdefault(
                name.split("/", 1)[0], {"modules": 0, "text_size": 0.0, "default_text_size": 0.0}
            )
            row["modules"] += 1
            row["text_size"] += m["text_size"]
            row["default_text_size"] += m["default_text_size"]
        for row in out.values():
            row["delta"] = row["text_size"] / row["default_text_size"] - 1
        return out

    def save(self, directory: Path) -> None:
        atomic_write_text(
            directory / "eval.json",
            json.dumps(
                {
                    "problem": self.problem,
                    "toolchain": self.toolchain,
                    "corpus": self.corpus,
                    "totals": self.totals(),
                    "packages": self.per_package(),
                    "modules": self.modules,
                    "failed": self.failed,
                },
                indent=1,
            ),
        )

    @classmethod
    def load(cls, directory: Path) -> Evaluation:
        path = directory / "eval.json" if directory.is_dir() else directory
        try:
            d = json.loads(path.read_text())
            return cls(d["problem"], d["toolchain"], d["corpus"], d["modules"], d["failed"])
        except (OSError, ValueError, KeyError) as e:
            raise ValueError(f"{path}: not an evaluation ({e})") from e


def evaluate(
    policy: Policy, corpus: Corpus, tc: Toolchain, workers: Workers, problem: str = "inlining-size"
) -> Evaluation:
    base = baseline_sizes(corpus, tc, workers)
    result = Evaluation(problem, tc.describe(), str(corpus.root))
    tasks = [EvalTask(problem, m, tc.clang, policy) for m in corpus.modules]
    for task, r in workers.imap(eval_one, tasks):
        if isinstance(r, Failed):
            result.failed[task.module.name] = r.message
        else:
            result.modules[task.module.name] = {**r, "default_text_size": base[task.module.name]}
    return result
