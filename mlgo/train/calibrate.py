"""Calibrating a policy's departure gate on validation packages (`mlgo calibrate`).

A policy that departs from clang's decision only where it is confident cannot lose much
where it is wrong: with a threshold of 1 it is exactly the default. The sweep evaluates a
few thresholds on packages the policy did not train on, one evaluation each, and keeps the
one that shrinks them most without any package getting larger.

Where the policy departs in both C and C++, each threshold is also judged for the policy
answering one language alone (the other's modules at the default's size: no compile more);
where it departs in one, that language alone is the policy itself and the other clang's own.
A policy whose C++ packages grow at every threshold can still ship for C, and is served for
C only.

Calibrated for the size guard, each threshold is judged as MLGO_GUARD=size serves it (every
object the policy did not make smaller is the default's), and the policy asks to be guarded.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from pathlib import Path

from mlgo.corpus.format import Corpus
from mlgo.errors import UsageError
from mlgo.llvm.toolchain import Toolchain
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import load_policy, save_policy
from mlgo.records import Decisions
from mlgo.runtime.files import atomic_directory, atomic_write_text
from mlgo.runtime.workers import Workers
from mlgo.train.evaluate import Evaluation, evaluate

GRID = (0.5, 0.6, 0.7, 0.8, 0.9, 0.95, 0.99)
NEVER = 1.0  # the policy never departs: the default's own decisions


def agreeing_gate(policy: MLPPolicy, data: Decisions) -> MLPPolicy:
    """POLICY gated at the lowest threshold of GRID at which it departs from none of the
    compiler's answers in DATA (traced on the code it will build), else at the highest: a
    clone that starts a search from the compiler's own decisions, not from its errors."""
    logits = policy.logits(data.x)
    for t in GRID:
        gated = replace(policy, departure_threshold=t)
        if (gated.gate(logits, data.default) == data.default).all():
            break
    return gated


@dataclass
class Calibration:
    threshold: float
    languages: tuple[str, ...] | None  # those the policy answers (None: all)
    sweep: list[dict]  # per threshold: its total change, the packages it made larger, and
    # the same for the policy answering each language alone ("by_language")

    @property
    def safe(self) -> bool:
        """Did some threshold of the sweep leave every package no larger?"""
        return self.threshold != NEVER


def calibrate(
    policy: MLPPolicy,
    corpus: Corpus,
    tc: Toolchain,
    workers: Workers,
    grid: tuple[float, ...] = GRID,
    guard: str | None = None,
) -> Calibration:
    """One evaluation of POLICY on CORPUS per threshold of GRID, judged as served with
    GUARD (`Evaluation.guarded`; None: none), and the one `choose`s."""
    if not policy.can_gate:
        raise UsageError(f"a {policy.problem.name} policy has no default to gate on")
    language = {m.name: m.language for m in corpus.modules}
    sweep = []
    for t in sorted(grid):
        everywhere = replace(policy, departure_threshold=t, languages=None)
        ev = evaluate(everywhere, corpus, tc, workers, policy.problem)
        ev = ev.guarded() if guard else ev
        row = {"threshold": t, **_judged(ev), "failed": sorted(ev.failed)}
        if len(departed := departing_languages(ev, language)) > 1:
            row["by_language"] = {
                x: _judged(ev.with_default({n for n, y in language.items() if y != x}))
                for x in departed
            }
        sweep.append(row)
    threshold, languages = choose(sweep)
    return Calibration(threshold, languages, sweep)


def departing_languages(ev: Evaluation, language: dict[str, str | None]) -> list[str]:
    """The languages of the modules where EV's policy departed from the default (by
    LANGUAGE, each module's), sorted: where there is one, that language alone is the whole
    policy, and another alone is the default, so neither is a candidate of its own."""
    departed = {language.get(n) for n, r in ev.modules.items() if r.get("changed")}
    return sorted(x for x in departed if x is not None)


def _judged(ev: Evaluation) -> dict:
    return {"change": ev.totals()["delta"], "packages_larger": ev.packages_larger()}


def options(sweep: list[dict]) -> list[tuple[float, tuple[str, ...] | None, dict]]:
    """Each threshold of SWEEP at which no module failed, for the policy answering every
    language (None) and each language alone: (threshold, languages, its judgement)."""
    return [
        (r["threshold"], languages, judged)
        for r in sweep
        if not r["failed"]
        for judged, languages in [
            (r, None),
            *((j, (x,)) for x, j in r.get("by_language", {}).items()),
        ]
    ]


def choose(sweep: list[dict]) -> tuple[float, tuple[str, ...] | None]:
    """Of the `options` with no package larger, the one with the lowest total change (the
    higher of equals: it departs less for the same result; then every language); (NEVER,
    None) if there is none."""
    safe = [o for o in options(sweep) if not o[2]["packages_larger"]]
    best = min(safe, key=lambda o: (o[2]["change"], -o[0], o[1] is not None), default=None)
    return (best[0], best[1]) if best else (NEVER, None)


def kept(calibration: dict) -> dict:
    """A calibration.json's judgement of the threshold it kept, for the languages it
    answers (one of its `options`); where none was safe, the gate that never departs,
    which is clang's own object everywhere."""
    threshold, languages = calibration["threshold"], calibration["languages"]
    answers = tuple(languages) if languages else None
    never = {"change": 0.0, "packages_larger": []}
    judged = next(
        (j for t, x, j in options(calibration["sweep"]) if (t, x) == (threshold, answers)), never
    )
    return {
        "threshold": threshold,
        "languages": languages,
        "change_pct": 100 * judged["change"],
        "packages_larger": judged["packages_larger"],
    }


def calibrate_policy(
    source: Path,
    corpus: Corpus,
    tc: Toolchain,
    workers: Workers,
    out: Path,
    guard: str | None = None,
) -> Calibration:
    """Calibrates the policy in SOURCE on CORPUS into OUT: the policy with the chosen
    threshold (asking for GUARD, as it was judged) and calibration.json recording the
    sweep, written whole or not at all. OUT may be a policy directory (replaced, with any
    export of it: that one has no gate), never SOURCE or a directory of other files; both
    are refused before anything is compiled."""
    if out.resolve() == source.resolve():
        raise UsageError(f"--out {out} is the policy itself; write the calibrated one beside it")
    if (
        out.exists()
        and (not out.is_dir() or any(out.iterdir()))
        and not (out / "policy.json").exists()
    ):
        raise UsageError(f"--out {out} exists and is not a policy directory")
    policy = load_policy(source)
    calibration = calibrate(policy, corpus, tc, workers, guard=guard)
    with atomic_directory(out) as staging:
        calibrated = replace(
            policy,
            departure_threshold=calibration.threshold,
            languages=calibration.languages,
            guard=guard,
        )
        save_policy(calibrated, staging)
        record = {
            "source": str(source),
            "corpus": str(corpus.root),
            "threshold": calibration.threshold,
            "languages": calibration.languages,
            "safe": calibration.safe,
            "guard": guard,
            "sweep": calibration.sweep,
        }
        atomic_write_text(staging / "calibration.json", json.dumps(record, indent=1))
    return calibration
