"""What judges a chain's candidates where the corpus's own cost would mislead, each one
`Judge` the chain calls alike (`changes`: each candidate's change against clang's own
decisions; with a `clock`, the cheapest few timed): for a link-time problem the link itself
(`linked_changes`), for a speed problem given a workload that workload's cost
(`speed.WorkloadReward`) and its clock. The corpus's own cost needs no judge.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from mlgo.corpus.format import Corpus, load_corpus
from mlgo.corpus.splits import load_splits
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems import Problem
from mlgo.train.candidates import none_larger

if TYPE_CHECKING:
    from mlgo.problems.policy import MLPPolicy
    from mlgo.programs.speed import WorkloadReward
    from mlgo.train.evaluate import Evaluation


@dataclass(frozen=True)
class Judge:
    """What judges a chain's candidate policies other than the corpus's own cost."""

    label: str  # what it is
    changes: Callable[[dict[str, MLPPolicy]], dict[str, float]]  # each one's; the default's 0
    # where a workload runs, its clock has the last word over the cheapest few (`surely_faster`)
    clock: Callable[[dict[str, MLPPolicy]], tuple[dict[str, dict], dict]] | None = None
    # the seconds that many new candidates take to judge, and that many finalists to time,
    # as measured so far: what a tune's budget plans by (None: judging is not counted in it)
    seconds: Callable[[int, int], float] | None = None


LINK_JUDGE = "lld's LTO of each program"


def candidate_judge(
    problem: Problem, corpus: Path, tc: Toolchain, reward: WorkloadReward | None
) -> Judge | None:
    """What judges a tune's candidates where the corpus's cost would mislead: for a
    link-time problem, the link itself of the recorded CORPUS's programs
    (`linked_changes`); for a speed problem given a workload, the workload's cost (REWARD).
    None: the corpus's cost."""
    from mlgo.programs.speed import JUDGE

    if problem.stage != "compile":
        return Judge(
            LINK_JUDGE, lambda ps: linked_changes(ps, load_corpus(corpus).require(problem), tc)
        )
    if reward is not None:
        return Judge(JUDGE, reward.changes, reward.clock, reward.seconds_for)
    return None


def linked_changes(policies: dict[str, MLPPolicy], corpus: Corpus, tc: Toolchain) -> dict:
    """Each of the link-time POLICIES judged as the link judges it: the change of the
    programs' `.text` when lld's own LTO makes them with the policy's plugin
    (`evaluate.linked_evaluation`). A `clang -Oz` compile of a link's module runs another
    pipeline, where a policy's change can even have the other sign (GNU units: -0.12% there,
    +0.41% in the real full-LTO link), and a ThinLTO module alone counts inline functions
    the program keeps once. A policy that makes any program larger is never kept
    (infinite); clang's own decisions are the baseline (0)."""
    linked = linked_evaluations(policies, corpus, tc)
    return {n: none_larger(ev.totals()["delta"], ev.modules_larger()) for n, ev in linked.items()}


def linked_evaluations(
    policies: dict[str, MLPPolicy], corpus: Corpus, tc: Toolchain
) -> dict[str, Evaluation]:
    """Each of the link-time POLICIES evaluated on CORPUS as lld's LTO links each program
    with its plugin (`evaluate.linked_evaluation`), the plain links made once."""
    from mlgo.corpus.lto import linked_texts
    from mlgo.ship.plugin import inliner_plugin
    from mlgo.train.evaluate import linked_evaluation

    plain = linked_texts(tc, corpus)
    return {
        name: linked_evaluation(policy.problem, inliner_plugin(policy, tc), corpus, tc, plain)
        for name, policy in policies.items()
    }


def judgement(ev: Evaluation) -> dict:
    """An evaluation's total change, its packages made larger (and those by more than
    0.1%), each package's change and each language's total (by corpus/splits.toml), in
    percent: what a shipped policy's record and card show of it."""
    language = {p.name: p.language for s in load_splits().values() for p in s}
    m = ev.metric
    by_language: dict[str, list[float]] = {}
    for pkg, r in ev.per_package().items():
        sums = by_language.setdefault(language.get(pkg, "?"), [0.0, 0.0])
        sums[0] += r[m]
        sums[1] += r[f"default_{m}"]
    return {
        "change_pct": 100 * ev.totals()["delta"],
        "packages_larger": ev.packages_larger(),
        "packages_over_0.1pct": [p for p, r in ev.per_package().items() if r["delta"] > 0.001],
        "packages": {p: 100 * r["delta"] for p, r in sorted(ev.per_package().items())},
        "by_language_pct": {x: 100 * (a / b - 1) for x, (a, b) in sorted(by_language.items())},
    }


def rank_correlation(on_corpus: dict[str, float], linked: dict[str, float]) -> dict:
    """How well the corpus's reward ranks the candidates as the link does: Spearman's rho
    over those the link judged with a size (None with fewer than three, or no spread)."""
    from scipy.stats import spearmanr

    both = [n for n in linked if n in on_corpus and math.isfinite(linked[n])]
    ranked = [on_corpus[n] for n in both], [linked[n] for n in both]
    if len(both) < 3 or any(len(set(r)) < 2 for r in ranked):  # scipy would warn: no rank
        return {"spearman": None, "candidates": len(both)}
    rho = spearmanr(*ranked).statistic
    return {"spearman": float(rho) if math.isfinite(rho) else None, "candidates": len(both)}
