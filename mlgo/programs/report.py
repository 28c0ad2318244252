"""The report of a program built twice (plain clang, and mlgo-cc with a policy): its size
over every ELF file the build produced, its workload's throughput, its tests, and what
training did; as report.json for machines and a rich table for the terminal. `mlgo demo`
writes it; so does anything else that builds a user's program twice."""

from __future__ import annotations

import json
from pathlib import Path

from rich.table import Table

from mlgo.llvm.sizes import compare_trees, tree_totals
from mlgo.runtime.files import atomic_write_text


def size_report(pair, trees: dict[str, Path]) -> dict:
    """.text of every ELF file both builds produced (objects, libraries, programs), and of
    the recipe's linked programs alone."""
    plain, ml = pair
    rows = compare_trees(trees["mlgo"], trees["plain"])
    total = tree_totals(rows)
    programs = {
        p: {"baseline": b, "policy": ml.text[p], "change_pct": 100 * (ml.text[p] / b - 1)}
        for p, b in plain.text.items()
    }
    return {
        "baseline": total["baseline"],
        "policy": total["build"],
        "change_pct": total["delta_pct"],
        "counts": f"the .text of all {len(rows)} ELF files the build produced",
        "files": len(rows),
        "per_file": [{"path": r.path, "baseline": r.baseline, "policy": r.build} for r in rows],
        "programs": programs,
    }


def write_report(report: dict, out: Path) -> None:
    """OUT/report.json, written atomically."""
    atomic_write_text(out / "report.json", json.dumps(report, indent=1))


def slower_but_smaller(report: dict) -> bool:
    """A smaller program that runs measurably slower: its whole IQR above 0."""
    speed = report.get("throughput")
    return bool(speed) and report["size"]["change_pct"] < 0 and speed["iqr_pct"][0] > 0


def training_line(training: dict) -> str:
    """What training did, in one line, with the caveat that it is the training code."""
    changes = ", ".join(f"{k} {v:+.2f}%" for k, v in training["corpus_change_pct"].items())
    metric = training.get("metric", ".text against -Oz")
    return f"corpus {metric}: {changes}; kept {training['chosen']} ({training['note']})"


def report_table(report: dict) -> Table:
    """Size and throughput, baseline against policy, as the terminal shows them."""
    size = report["size"]
    title = f"{report['package']}: .text bytes, workload CPU time, tests"
    table = Table("", f"clang {report.get('level', '-Oz')}", "mlgo-cc", "change", title=title)
    for prog, r in size["programs"].items():
        table.add_row(
            f"{prog} .text", f"{r['baseline']:,}", f"{r['policy']:,}", f"{r['change_pct']:+.2f}%"
        )
    table.add_row(
        f"{size['files']} ELF files",
        f"{size['baseline']:,}",
        f"{size['policy']:,}",
        f"{size['change_pct']:+.2f}%",
        style="bold",
    )
    if speed := report.get("throughput"):
        q1, q3 = speed["iqr_pct"]
        flag = " [red]smaller but slower" if slower_but_smaller(report) else ""
        change = f"{speed['change_pct']:+.2f}% (IQR {q1:+.2f}..{q3:+.2f}%){flag}"
        table.add_row("CPU time", "", "", change)
        if "instructions_change_pct" in speed:
            table.add_row("instructions", "", "", f"{speed['instructions_change_pct']:+.2f}%")
    tests = report["tests"]
    table.add_row("tests", tests["baseline"], tests["policy"], "")
    return table
