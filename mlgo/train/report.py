"""`mlgo report`: an evaluation as a table, a histogram of per-module deltas, a per-package
bar chart (one self-contained HTML file) and a JSON summary for machines, all in the
problem's reward metric (.text bytes for inlining, spill+reload cost for regalloc)."""

from __future__ import annotations

import html
import json

import numpy as np

from mlgo.plots import STYLE, img, png, pyplot
from mlgo.train.evaluate import Evaluation


def module_deltas(ev: Evaluation) -> np.ndarray:
    """Per module with a nonzero default, the relative change of the reward metric."""
    m = ev.metric
    rows = ev.modules.values()
    return np.array([r[m] / r[f"default_{m}"] - 1 for r in rows if r[f"default_{m}"]])


def figures(ev: Evaluation) -> dict[str, str]:
    """Base64 PNGs: the per-module delta histogram and the per-package bars."""
    plt = pyplot()
    deltas = 100 * module_deltas(ev)
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.hist(deltas, bins=40, color="#4477aa")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel(f"{ev.metric} change vs default per module (%)")
    ax.set_ylabel("modules")
    hist = png(fig)

    packages = ev.per_package()
    names = sorted(packages)
    values = [100 * packages[n]["delta"] for n in names]
    fig, ax = plt.subplots(figsize=(6, 0.35 * len(names) + 1))
    ax.barh(names, values, color=["#228833" if v <= 0 else "#cc3311" for v in values])
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel(f"{ev.metric} change vs default per package (%)")
    bars = png(fig)
    return {"histogram": hist, "packages": bars}


def summary(ev: Evaluation) -> dict:
    deltas = module_deltas(ev)
    return {
        "totals": ev.totals(),
        "packages": ev.per_package(),
        "failed": ev.failed,
        "module_delta_median": float(np.median(deltas)) if len(deltas) else 0.0,
        "modules_smaller": int((deltas < 0).sum()),
        "modules_larger": int((deltas > 0).sum()),
    }


def render_html(ev: Evaluation, title: str) -> str:
    s = summary(ev)
    pics = figures(ev)
    m = ev.metric
    rows = "".join(
        f"<tr><td>{html.escape(n)}</td><td>{int(p['modules'])}</td>"
        f"<td>{p[f'default_{m}']:,.0f}</td><td>{p[m]:,.0f}</td>"
        f"<td>{100 * p['delta']:+.2f}%</td></tr>"
        for n, p in sorted(s["packages"].items())
    )
    t = s["totals"]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
{STYLE}
</head><body><h1>{html.escape(title)}</h1>
<p>{html.escape(ev.problem.name)} with {html.escape(ev.toolchain)} on {html.escape(ev.corpus)}:
{t["modules"]} modules, {m} {t[f"default_{m}"]:,.0f} &rarr; {t[m]:,.0f}
(<b>{100 * t["delta"]:+.2f}%</b>); {s["modules_smaller"]} modules lower,
{s["modules_larger"]} higher, {len(ev.failed)} failed.</p>
<table><tr><th>package</th><th>modules</th><th>default {m}</th><th>policy {m}</th>
<th>change</th></tr>{rows}<tr><th>total</th><th>{t["modules"]}</th>
<th>{t[f"default_{m}"]:,.0f}</th><th>{t[m]:,.0f}</th>
<th>{100 * t["delta"]:+.2f}%</th></tr></table>
<h2>Per package</h2>{img(pics["packages"])}
<h2>Per module</h2>{img(pics["histogram"])}
</body></html>"""


def summary_json(ev: Evaluation) -> str:
    return json.dumps(summary(ev), indent=1)
