"""An evaluation's figures by language, and what `MLGO_GUARD=size` would make of it.

  .venv/bin/python -m tools.eval_by_language runs/eval-val runs/eval-val-gated [--metric text_size]

Each argument is what `mlgo eval --out DIR` wrote. Per evaluation: the change against the
default in total, for the C and for the C++ modules, the packages made larger, and the same
totals with each module whose object the policy did not make smaller at the default's size,
which is what the size guard keeps, read from the same per-module sizes (no compile). A
module's language is the one its compile command in the evaluated corpus says
(`Module.language`, as `mlgo calibrate` reads it); where that corpus is no longer there,
its package's in corpus/splits.toml, and a note says so. The figures are in the
evaluation's reward metric, or in another both sides measured (`--metric`: inlining's
`text_size`, the objects' whole .text, beside its `text_once`).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

from mlgo.corpus.format import CorpusError, load_corpus
from mlgo.corpus.splits import load_splits
from mlgo.llvm.languages import LABELS
from mlgo.train.evaluate import Evaluation


def module_languages(ev: Evaluation) -> dict[str, str]:
    """Each module of EV by its language's label (C, C++; ? for neither): what its compile
    command in the evaluated corpus says, else, with that corpus gone, its package's in
    corpus/splits.toml (a package may hold modules of both)."""
    try:
        modules = load_corpus(ev.corpus).modules
    except CorpusError as e:
        print(f"note: {e}: languages by package, from corpus/splits.toml", file=sys.stderr)
        package = {p.name: p.language for split in load_splits().values() for p in split}
        return {name: package.get(name.split("/", 1)[0], "?") for name in ev.modules}
    return {m.name: LABELS.get(m.language or "", "?") for m in modules}


def change(pairs: list[tuple[float, float]]) -> str:
    """The percent change of the summed (policy, default) PAIRS."""
    policy, default = sum(p for p, _ in pairs), sum(d for _, d in pairs)
    return f"{100 * (policy / default - 1):+.3f}%" if default else "-"


def figures(ev: Evaluation, language: dict[str, str], metric: str | None = None) -> dict[str, str]:
    """EV's changes in METRIC (default: its reward metric) in total, for C and for C++
    (LANGUAGE: each module's), each also as the size guard would leave them
    (`Evaluation.guarded`), and the packages made larger."""
    m = metric or ev.metric
    out: dict[str, str] = {}
    for suffix, served in (("", ev), (" (guard)", ev.guarded())):
        rows = {name: (r[m], r[f"default_{m}"]) for name, r in served.modules.items()}
        out["total" + suffix] = change(list(rows.values()))
        for want in ("C", "C++"):
            out[want + suffix] = change([v for n, v in rows.items() if language.get(n) == want])
    larger = ev.per_package(m)
    out["larger"] = ", ".join(
        f"{p} {100 * larger[p]['delta']:+.2f}% ({larger[p][m] - larger[p][f'default_{m}']:+,.0f})"
        for p in ev.packages_larger(m)
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("evals", nargs="+", type=Path, help="directories `mlgo eval --out` wrote")
    ap.add_argument("--metric", help="another metric both sides measured (default: the reward)")
    args = ap.parse_args()
    table = Table("evaluation", "total", "C", "C++", "guard: total", "C", "C++", "larger")
    try:  # every evaluation read before any row is printed
        evals = [(path, Evaluation.load(path)) for path in args.evals]
        for path, ev in evals:
            if args.metric and args.metric not in ev.metrics:
                raise ValueError(f"{path}: measures no {args.metric} on both sides")
    except ValueError as e:
        sys.exit(f"error: {e}")
    for path, ev in evals:
        f = figures(ev, module_languages(ev), args.metric)
        table.add_row(
            str(path), f["total"], f["C"], f["C++"],
            f["total (guard)"], f["C (guard)"], f["C++ (guard)"], f["larger"] or "none",
        )  # fmt: skip
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
