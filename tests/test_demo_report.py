"""`mlgo demo`'s report: a smaller program that runs measurably slower is flagged."""

import pytest
from rich.console import Console

from mlgo.programs.demo import report_table, slower_but_smaller


def report(size_pct: float, iqr: list[float]) -> dict:
    return {
        "package": "zlib",
        "size": {
            "baseline": 1000,
            "policy": round(1000 * (1 + size_pct / 100)),
            "change_pct": size_pct,
            "files": 3,
            "programs": {"minigzip": {"baseline": 500, "policy": 490, "change_pct": -2.0}},
        },
        "throughput": {"change_pct": sum(iqr) / 2, "iqr_pct": iqr},
        "tests": {"baseline": "passed", "policy": "passed"},
    }


@pytest.mark.parametrize(
    ("size_pct", "iqr", "flagged"),
    [
        (-2.0, [0.5, 1.5], True),  # smaller, and every middle round slower
        (-2.0, [-0.5, 1.5], False),  # slower within the noise
        (+1.0, [0.5, 1.5], False),  # larger: nothing was traded
        (-2.0, [-1.5, -0.5], False),  # smaller and faster
    ],
)
def test_a_smaller_but_measurably_slower_build_is_flagged(size_pct, iqr, flagged):
    r = report(size_pct, iqr)
    assert slower_but_smaller(r) is flagged
    console = Console(width=200, record=True)
    console.print(report_table(r))
    assert ("smaller but slower" in console.export_text()) is flagged


def test_no_workload_no_throughput_row():
    r = report(-2.0, [0.5, 1.5])
    del r["throughput"]
    console = Console(width=200, record=True)
    console.print(report_table(r))
    assert not slower_but_smaller(r) and "IQR" not in console.export_text()
