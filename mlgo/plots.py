"""Figures for mlgo's HTML reports: drawn without a display and inlined as base64 PNGs, so a
report is one self-contained file that can be mailed or attached to a CI run."""

from __future__ import annotations

import base64
import io

# shared by every report page: plain tables, numbers right-aligned
STYLE = """<style>body{font-family:sans-serif;margin:2em}table{border-collapse:collapse}
td,th{border:1px solid #ccc;padding:4px 10px;text-align:right}
td:first-child{text-align:left}</style>"""


def pyplot():
    """matplotlib.pyplot on the Agg backend (no display needed)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def png(fig) -> str:
    """FIG as a base64 PNG; the figure is closed, so a long run does not pile them up."""
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    pyplot().close(fig)
    return base64.b64encode(buf.getvalue()).decode()


def img(b64_png: str) -> str:
    return f'<img src="data:image/png;base64,{b64_png}">'
