"""An evaluation's figures by language, and what `MLGO_GUARD=size` would make of it.

  .venv/bin/python tools/eval_by_language.py runs/eval-val runs/eval-val-gated

Each argument is what `mlgo eval --out DIR` wrote. Per evaluation: the change against the
default in total, for the C and for the C++ packages (their language from
corpus/splits.toml), the packages made larger, and the same totals with each module at the
smaller of the policy's and the default's size, which is what the size guard keeps, read
from the same per-module sizes (no compile).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from mlgo.corpus.splits import load_splits  # noqa: E402
from mlgo.train.evaluate import Evaluation  # noqa: E402


def change(pairs: list[tuple[float, float]]) -> str:
    """The percent change of the summed (policy, default) PAIRS."""
    policy, default = sum(p for p, _ in pairs), sum(d for _, d in pairs)
    return f"{100 * (policy / default - 1):+.3f}%" if default else "-"


def figures(ev: Evaluation, language: dict[str, str]) -> dict[str, str]:
    m = ev.metric
    rows = {name: (r[m], r[f"default_{m}"]) for name, r in ev.modules.items()}
    lang = {name: language.get(name.split("/", 1)[0], "?") for name in rows}
    out: dict[str, str] = {}
    for guard in (False, True):
        pick = {n: (min(p, d) if guard else p, d) for n, (p, d) in rows.items()}
        suffix = " (guard)" if guard else ""
        out["total" + suffix] = change(list(pick.values()))
        for want in ("C", "C++"):
            out[want + suffix] = change([v for n, v in pick.items() if lang[n] == want])
    larger = ev.per_package()
    out["larger"] = ", ".join(
        f"{p} {100 * larger[p]['delta']:+.2f}% ({larger[p][m] - larger[p][f'default_{m}']:+,.0f})"
        for p in ev.packages_larger()
    )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument("evals", nargs="+", type=Path, help="directories `mlgo eval --out` wrote")
    args = ap.parse_args()
    language = {p.name: p.language for split in load_splits().values() for p in split}
    table = Table("evaluation", "total", "C", "C++", "guard: total", "C", "C++", "larger")
    try:  # every evaluation read before any row is printed
        evals = [(path, Evaluation.load(path)) for path in args.evals]
    except ValueError as e:
        sys.exit(f"error: {e}")
    for path, ev in evals:
        f = figures(ev, language)
        table.add_row(
            str(path), f["total"], f["C"], f["C++"],
            f["total (guard)"], f["C (guard)"], f["C++ (guard)"], f["larger"] or "none",
        )  # fmt: skip
    Console(width=200).print(table)


if __name__ == "__main__":
    main()
