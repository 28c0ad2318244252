"""Which way do a policy's departures from clang's inlining decisions lose? Its departure
gate, opened one way at a time: departing only where clang inlines (the policy refuses), or
only where clang does not (the policy inlines), at each threshold.

  .venv/bin/python -m tools.gate_directions --policy runs/bcmax-groups \
      --corpus data/corpus-validation --thresholds 0.5,0.8,0.9

Each row is one evaluation of the whole corpus: its total .text change against -Oz and the
packages it makes larger. Run it on validation: a direction that grows no package there
would be a gate worth building into the policy.
"""

from __future__ import annotations

import argparse
from contextlib import closing
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np
from rich.console import Console
from rich.table import Table

from mlgo.corpus.format import load_corpus
from mlgo.llvm.toolchain import find_toolchain
from mlgo.problems.policy import MLPPolicy
from mlgo.problems.policy_files import load_policy
from mlgo.runtime.workers import make_workers
from mlgo.train import policy_dir
from mlgo.train.evaluate import evaluate

DIRECTIONS = {1: "refuse only (clang inlines)", 0: "inline only (clang does not)"}


@dataclass
class OneWayPolicy(MLPPolicy):
    """The policy's gate, departing only where clang's own answer is DEPART_FROM."""

    depart_from: int = 1

    def gate(self, logits: np.ndarray, default: np.ndarray) -> np.ndarray:
        gated = super().gate(logits, default)
        return np.where(default == self.depart_from, gated, default)


def one_way(policy: MLPPolicy, threshold: float, depart_from: int) -> OneWayPolicy:
    """POLICY gated at THRESHOLD, departing only where clang's own answer is DEPART_FROM."""
    own = {f.name: getattr(policy, f.name) for f in fields(MLPPolicy)}
    return OneWayPolicy(**{**own, "departure_threshold": threshold}, depart_from=depart_from)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--policy", type=Path, required=True)
    ap.add_argument("--corpus", type=Path, required=True)
    ap.add_argument("--thresholds", default="0.5,0.8,0.9")
    args = ap.parse_args()
    policy = load_policy(policy_dir(args.policy))
    corpus = load_corpus(args.corpus).require(policy.problem)
    tc = find_toolchain()
    table = Table("departs", "threshold", "change", "packages larger")
    with closing(make_workers("local")) as pool:
        for depart_from, name in DIRECTIONS.items():
            for t in (float(x) for x in args.thresholds.split(",")):
                ev = evaluate(one_way(policy, t, depart_from), corpus, tc, pool, policy.problem)
                change = f"{100 * ev.totals()['delta']:+.3f}%"
                larger = ", ".join(ev.packages_larger()) or "none"
                table.add_row(name, f"{t:g}", change, larger)
    Console().print(table)


if __name__ == "__main__":
    main()
