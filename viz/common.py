"""Small helpers shared by the figures: visible whitespace, probabilities, colours, layout defaults.

Everything in viz/ works on trace objects by attribute (StepTrace / DraftTree from eagle2.cycle.trace,
or anything shaped like them) and never imports torch or model code, so the same functions serve
the app, notebooks and benchmark reports.
"""
from __future__ import annotations

import html
import math

import plotly.graph_objects as go

# Decoder colours: the selected policy, the comparison policy, plain decoding.
ROLE_COLOURS = {"main": "#2563eb", "compare": "#d97706", "plain": "#6b7280"}
EXTRA_COLOURS = ["#059669", "#7c3aed", "#db2777", "#0891b2"]
ACCEPT_COLOUR = "#e11d48"     # the accepted path and the bonus token
DROPPED_COLOUR = "#9ca3af"
# Draft confidence, light (unlikely) to dark blue (likely); readable on a projector.
CONFIDENCE_SCALE = [[0.0, "#e0e7ff"], [0.25, "#a5b4fc"], [0.5, "#6366f1"], [0.75, "#3730a3"], [1.0, "#1e1b4b"]]
# Soft backgrounds for the token stream, one per cycle (cycled).
CYCLE_BACKGROUNDS = ["#dbeafe", "#fde68a", "#bbf7d0", "#fbcfe8", "#ddd6fe", "#fed7aa", "#a5f3fc", "#e5e7eb"]

FONT = dict(family="Inter, 'Segoe UI', Helvetica, Arial, sans-serif", size=14, color="#111827")


def show_ws(text: str, limit: int | None = None) -> str:
    """Token text with whitespace made visible (space -> ␣, newline -> ↵, tab -> ⇥)."""
    s = (text or "").replace(" ", "␣").replace("\n", "↵").replace("\t", "⇥").replace("\r", "␍")
    if s == "":
        s = "∅"
    if limit is not None and len(s) > limit:
        s = s[: limit - 1] + "…"
    return s


def esc(text: str) -> str:
    """HTML-escape for Plotly text/hover and the token stream."""
    return html.escape(text, quote=False)


def p_of(logv: float | None) -> float:
    """Probability from a log value (0 for -inf / None)."""
    if logv is None:
        return 0.0
    try:
        return math.exp(logv) if logv > -700 else 0.0
    except (OverflowError, TypeError):
        return 0.0


def fmt_p(p: float | None) -> str:
    if p is None:
        return "–"
    if p >= 0.001:
        return f"{p:.3f}"
    return f"{p:.1e}"


# A small white template: Plotly's stock templates are deep-copied into every figure (~50 ms each).
TEMPLATE = go.layout.Template(layout=dict(
    plot_bgcolor="white", paper_bgcolor="white", colorway=list(ROLE_COLOURS.values()) + EXTRA_COLOURS,
    xaxis=dict(gridcolor="#eef2f7", zerolinecolor="#e5e7eb", linecolor="#d1d5db", automargin=True),
    yaxis=dict(gridcolor="#eef2f7", zerolinecolor="#e5e7eb", linecolor="#d1d5db", automargin=True)))


def new_figure() -> go.Figure:
    return go.Figure(layout=dict(template=TEMPLATE))


def base_layout(title: str | None = None, height: int = 360, **kw) -> dict:
    """Plotly layout shared by every chart: white background, large readable type."""
    lay = dict(
        height=height, font=FONT,
        margin=dict(l=56, r=20, t=48 if title else 16, b=48),
        title=dict(text=title, x=0.01, xanchor="left", font=dict(size=16)) if title else None,
        legend=dict(orientation="h", yanchor="bottom", y=1.0, xanchor="right", x=1.0, font=dict(size=12)),
        hoverlabel=dict(font=dict(size=13, family="ui-monospace, Menlo, Consolas, monospace")),
    )
    lay.update(kw)
    return lay


def decode_steps(steps) -> list:
    """Steps that drafted and verified a tree (prefill and plain steps excluded)."""
    return [s for s in steps if getattr(s, "tree", None) is not None]
