"""Compiling a corpus with a policy and comparing each module with the default heuristic.

The baseline is the plain compile (the same cc1 command without the channel), which the
channel replays byte for byte. Where the problem's reward metric is one `mlgo corpus stats`
caches in the user's cache (inlining's .text), it is read from there, so training pays for
it once; other problems compile it per run.
"""

from __future__ import annotations

import json
import tempfile
from dataclasses import dataclass, field, replace
from pathlib import Path

from mlgo.corpus.compile import CompileError, compile_module, compile_plain
from mlgo.corpus.format import Corpus, Module
from mlgo.corpus.stats import SIZES, corpus_stats, shared_out
from mlgo.errors import UsageError
from mlgo.llvm.channel import Policy
from mlgo.llvm.sizes import GUARD_METRIC
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import Problem, get_problem
from mlgo.runtime.files import atomic_write_text
from mlgo.runtime.inputs import read_json
from mlgo.runtime.workers import Failed, Workers


@dataclass(frozen=True)
class EvalTask:
    problem: Problem
    module: Module
    clang: str
    policy: Policy | None
    tag: int = 0  # lets a trainer tell apart results of different policies in one batch


def eval_one(task: EvalTask) -> dict[str, float]:
    run = compile_module(task.problem, task.module, task.clang, task.policy)
    return {
        "decisions": run.num_decisions,
        "changed": int((run.advice != run.default).sum()),
        "seconds": run.seconds,
        **run.metrics,
    }


@dataclass(frozen=True)
class PlainTask:
    problem: Problem
    module: Module
    clang: str


def plain_one(task: PlainTask) -> dict[str, float]:
    with tempfile.TemporaryDirectory(prefix="mlgo-b-") as d:
        return compile_plain(task.problem, task.module, task.clang, Path(d) / "o")


@dataclass(frozen=True)
class Baseline:
    """What the problem measures of each module with the compiler's own heuristic
    (`costs`); the modules it cannot measure (clang itself crashes on some), each with its
    error; and the corpus to compile policies on, its modules carrying what the default's
    objects tell about their package (`Module.copies`), as their costs were measured."""

    costs: dict[str, dict[str, float]]
    unmeasured: dict[str, str]
    corpus: Corpus


def baseline(corpus: Corpus, tc: Toolchain, workers: Workers, problem: Problem) -> Baseline:
    """The default on CORPUS. A module it cannot measure has nothing to compare against: it
    is left out, and said so. None measured is an error."""
    if problem.reward_in_stats:
        stats, failures = corpus_stats(corpus, tc.describe(), tc.clang, workers)
        out = {name: {k: float(s[k]) for k in SIZES} for name, s in stats.items()}
        corpus = shared_out(corpus, stats)
    else:
        out, failures = {}, {}
        tasks = [PlainTask(problem, m, tc.clang) for m in corpus.modules]
        for task, r in workers.imap(plain_one, tasks):
            if isinstance(r, Failed):
                failures[task.module.name] = r.message
            else:
                out[task.module.name] = r
    if not out:
        msg = next(iter(failures.values()), "no modules")
        raise CompileError(f"baseline compile failed for all {len(failures)} modules, e.g. {msg}")
    return Baseline(out, failures, corpus)


@dataclass
class Evaluation:
    """Per module, the problem's metric with the policy (`M`) and the default (`default_M`)."""

    problem: Problem
    toolchain: str
    corpus: str
    modules: dict[str, dict[str, float]] = field(default_factory=dict)
    failed: dict[str, str] = field(default_factory=dict)

    @property
    def metric(self) -> str:
        return self.problem.reward_metric

    @property
    def metrics(self) -> list[str]:
        """What each row measures on both sides: the reward metric first, then the others
        (inlining's: the objects' whole .text, `text_size`, beside `text_once`)."""
        rows = list(self.modules.values())
        both = {k for k in (rows[0] if rows else {}) if all(f"default_{k}" in r for r in rows)}
        return [self.metric, *sorted(both - {self.metric})]

    def totals(self, metric: str | None = None) -> dict[str, float]:
        """The rows summed in METRIC (default: the reward metric), and its relative change."""
        m = metric or self.metric
        policy = sum(r[m] for r in self.modules.values())
        default = sum(r[f"default_{m}"] for r in self.modules.values())
        return {
            "modules": len(self.modules),
            m: policy,
            f"default_{m}": default,
            "delta": (policy - default) / default if default else 0.0,
        }

    def per_package(self, metric: str | None = None) -> dict[str, dict[str, float]]:
        """`totals` per package."""
        m = metric or self.metric
        out: dict[str, dict[str, float]] = {}
        for name, r in self.modules.items():
            row = out.setdefault(name.split("/", 1)[0], {"modules": 0, m: 0.0, f"default_{m}": 0.0})
            row["modules"] += 1
            row[m] += r[m]
            row[f"default_{m}"] += r[f"default_{m}"]
        for row in out.values():
            row["delta"] = row[m] / row[f"default_{m}"] - 1 if row[f"default_{m}"] else 0.0
        return out

    def with_default(self, names: set[str]) -> Evaluation:
        """This evaluation as if the policy left the modules NAMES to the default (as one
        that answers only some languages does): their metrics are the default's."""
        measured = self.metrics
        modules = {
            name: {**r, **{m: r[f"default_{m}"] for m in measured}, "changed": 0}
            if name in names
            else r
            for name, r in self.modules.items()
        }
        return replace(self, modules=modules)

    def guarded(self) -> Evaluation:
        """This evaluation as MLGO_GUARD=size serves the policy: each module (or linked
        program) whose `.text` the policy did not make smaller is the default's, as
        `mlgo.serve.guard` keeps the default's output on a tie."""
        size = GUARD_METRIC if GUARD_METRIC in self.metrics else self.metric
        kept = {n for n, r in self.modules.items() if r[size] >= r[f"default_{size}"]}
        return self.with_default(kept)

    def modules_larger(self) -> list[str]:
        """The modules (programs, judged at the link) the policy made larger, sorted."""
        m = self.metric
        return sorted(n for n, r in self.modules.items() if r[m] > r[f"default_{m}"])

    def packages_larger(self, metric: str | None = None) -> list[str]:
        """The packages whose METRIC (default: the reward metric) the policy raised above
        the default's, sorted."""
        m = metric or self.metric
        return sorted(p for p, r in self.per_package(m).items() if r[m] > r[f"default_{m}"])

    def save(self, directory: Path) -> None:
        atomic_write_text(
            directory / "eval.json",
            json.dumps(
                {
                    "problem": self.problem.name,
                    "toolchain": self.toolchain,
                    "corpus": self.corpus,
                    "totals": self.totals(),
                    "packages": self.per_package(),
                    **{f"totals_{m}": self.totals(m) for m in self.metrics[1:]},
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
            d = read_json(path)
            problem = get_problem(d["problem"])
            ev = cls(problem, d["toolchain"], d["corpus"], d["modules"], d["failed"])
            keys = {ev.metric, f"default_{ev.metric}"}
            stale = [name for name, row in ev.modules.items() if not keys <= set(row)]
            if stale:  # written before the problem's metric changed
                raise UsageError(f"module {stale[0]} has no {ev.metric}")
            return ev
        except (OSError, ValueError, KeyError) as e:
            raise UsageError(f"{path}: not an evaluation ({e})") from e


def evaluate(
    policy: Policy, corpus: Corpus, tc: Toolchain, workers: Workers, problem: Problem
) -> Evaluation:
    """POLICY against the default on every module of CORPUS. A policy that answers only
    some languages leaves the other modules to the default, as the service does: they are
    not compiled again."""
    default = baseline(corpus, tc, workers, problem)
    base = default.costs
    result = Evaluation(problem, tc.describe(), str(corpus.root))
    result.failed.update({name: f"default: {msg}" for name, msg in default.unmeasured.items()})
    languages = getattr(policy, "languages", None)  # a policy may answer only some
    tasks = []
    for m in default.corpus.modules:
        if m.name not in base:
            continue
        if languages is None or m.language in languages:
            tasks.append(EvalTask(problem, m, tc.clang, policy))
        else:  # compiled as the default: its own measures on both sides
            row = {"decisions": 0, "changed": 0, **base[m.name]}
            result.modules[m.name] = {**row, **_as_default(base[m.name])}
    for task, r in workers.imap(eval_one, tasks):
        if isinstance(r, Failed):
            result.failed[task.module.name] = r.message
        else:
            result.modules[task.module.name] = {**r, **_as_default(base[task.module.name])}
    return result


def linked_evaluation(
    problem: Problem,
    plugin: Path,
    corpus: Corpus,
    tc: Toolchain,
    plain: dict[str, int] | None = None,
) -> Evaluation:
    """A PROBLEM policy's PLUGIN (`ship.plugin.inliner_plugin`) against the default on each
    program or shared library of CORPUS (of a link stage) as lld's LTO makes it
    (`lto.linked_texts`; PLAIN: the default's sizes, if measured already): one row per
    program. A compile of a link's module runs clang's per-file pipeline, not the link's;
    this is the size the link keeps."""
    from mlgo.corpus.lto import linked_texts

    plain = plain or linked_texts(tc, corpus)
    sizes = linked_texts(tc, corpus, plugin)
    m = problem.reward_metric
    result = Evaluation(problem, tc.describe(), str(corpus.root))
    result.modules = {name: {m: sizes[name], f"default_{m}": plain[name]} for name in plain}
    return result


def _as_default(measured: dict[str, float]) -> dict[str, float]:
    """The default's measures of a module, under the names an evaluation row gives them."""
    return {f"default_{k}": v for k, v in measured.items()}
