"""`mlgo report`: an evaluation as a table, a histogram of per-module deltas, a per-package
bar chart (one self-contained HTML file) and a JSON summary for machines."""

from __future__ import annotations

import base64
import html
import io
import json

import numpy as np

from mlgo.train.evaluate import Evaluation


def _png(fig) -> str:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    return base64.b64encode(buf.getvalue()).decode()


def figures(ev: Evaluation) -> dict[str, str]:
    """Base64 PNGs: the per-module delta histogram and the per-package bars."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    deltas = [
        100 * (m["text_size"] / m["default_text_size"] - 1)
        for m in ev.modules.values()
        if m["default_text_size"]
    ]
    fig, ax = plt.subplots(figsize=(6, 3.2))
    ax.hist(deltas, bins=40, color="#4477aa")
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel(".text change vs default per module (%)")
    ax.set_ylabel("modules")
    hist = _png(fig)
    plt.close(fig)

    packages = ev.per_package()
    names = sorted(packages)
    values = [100 * packages[n]["delta"] for n in names]
    fig, ax = plt.subplots(figsize=(6, 0.35 * len(names) + 1))
    ax.barh(names, values, color=["#228833" if v <= 0 else "#cc3311" for v in values])
    ax.axvline(0, color="black", lw=0.8)
    ax.set_xlabel(".text change vs default per package (%)")
    bars = _png(fig)
    plt.close(fig)
    return {"histogram": hist, "packages": bars}


def summary(ev: Evaluation) -> dict:
    deltas = np.array(
        [
            m["text_size"] / m["default_text_size"] - 1
            for m in ev.modules.values()
            if m["default_text_size"]
        ]
    )
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
    rows = "".join(
        f"<tr><td>{html.escape(n)}</td><td>{int(p['modules'])}</td>"
        f"<td>{p['default_text_size']:,.0f}</td><td>{p['text_size']:,.0f}</td>"
        f"<td>{100 * p['delta']:+.2f}%</td></tr>"
        for n, p in sorted(s["packages"].items())
    )
    t = s["totals"]
    return f"""<!doctype html><html><head><meta charset="utf-8"><title>{html.escape(title)}</title>
<style>body{{font-family:sans-serif;margin:2em}}table{{border-collapse:collapse}}
td,th{{border:1px solid #ccc;padding:4px 10px;text-align:right}}
td:first-child{{text-align:left}}</style>
</head><body><h1>{html.escape(title)}</h1>
<p>{html.escape(ev.problem)} with {html.escape(ev.toolchain)} on {html.escape(ev.corpus)}:
{t["modules"]} modules, .text {t["default_text_size"]:,.0f} &rarr; {t["text_size"]:,.0f} bytes
(<b>{100 * t["delta"]:+.2f}%</b>); {s["modules_smaller"]} modules smaller,
{s["modules_larger"]} larger, {len(ev.failed)} failed.</p>
<table><tr><th>package</th><th>modules</th><th>default .text</th><th>policy .text</th>
<th>change</th></tr>{rows}<tr><th>total</th><th>{t["modules"]}</th>
<th>{t["default_text_size"]:,.0f}</th><th>{t["text_size"]:,.0f}</th>
<th>{100 * t["delta"]:+.2f}%</th></tr></table>
<h2>Per package</h2><img src="data:image/png;base64,{pics["packages"]}">
<h2>Per module</h2><img src="data:image/png;base64,{pics["histogram"]}">
</body></html>"""


def summary_json(ev: Evaluation) -> str:
    return json.dumps(summary(ev), indent=1)
