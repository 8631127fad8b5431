"""Small helpers shared by the figures: visible whitespace, probabilities, colours, layout defaults.

Everything in viz/ works on trace objects by attribute (StepTrace / DraftTree from eagle2.cycle.trace,
or anything shaped like them) and never imports torch or model code, so the same functions serve
the app, notebooks and benchmark reports.
"""
from __future__ import annotations

import html
import math
import unicodedata

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
# Axis titles at the body size (Plotly's default, 1.2x, cut "seconds (each decoder's own work)" at
# a phone's width).
_AXIS = dict(gridcolor="#eef2f7", zerolinecolor="#e5e7eb", linecolor="#d1d5db", automargin=True,
             title=dict(font=dict(size=14)))
TEMPLATE = go.layout.Template(layout=dict(
    plot_bgcolor="white", paper_bgcolor="white", colorway=list(ROLE_COLOURS.values()) + EXTRA_COLOURS,
    xaxis=_AXIS, yaxis=_AXIS))


def one_x(colour: str = "#374151", width: float = 1.5, below: bool = True) -> dict:
    """The dashed line at 1x across a speedup chart (`below`: under its bars and lines)."""
    line = dict(type="line", xref="x domain", x0=0, x1=1, yref="y", y0=1.0, y1=1.0,
                line=dict(color=colour, dash="dash", width=width))
    return dict(line, layer="below") if below else line


def figure(data: list[dict], **layout) -> go.Figure:
    """A figure made once from its traces (dicts, `type` naming each) and its whole layout: every
    add_trace or update_layout on a Figure validates it again (about 5 ms apiece here; a tree drawn
    that way took 60 ms of a Step, made at once 7 ms)."""
    return go.Figure(data=data, layout=dict(template=TEMPLATE, **layout))


# Advance widths (em) of printable ASCII in Arial / Liberation Sans, the metrics of the page's font
# stack where Inter and Segoe UI are missing; text_px() pads them for the wider fonts.
_EM = dict(zip(" !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMNOPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~",
               [.278, .278, .355, .556, .556, .889, .667, .191, .333, .333, .389, .584, .278, .333, .278, .278]
               + [.556] * 10 + [.278, .278, .584, .584, .584, .556, 1.015]
               + [.667, .667, .722, .722, .667, .611, .778, .722, .278, .5, .667, .556, .833, .722, .778, .667,
                  .778, .722, .667, .611, .722, .667, .944, .667, .667, .611]
               + [.278, .278, .278, .469, .556, .333]
               + [.556, .556, .5, .556, .556, .278, .556, .556, .222, .222, .5, .222, .833, .556, .556, .556,
                  .556, .333, .5, .278, .556, .5, .722, .5, .5, .5]
               + [.334, .26, .334, .584]))
_EM.update({"␣": .635, "↵": .84, "⇥": .84, "␍": .84, "∅": .75, "…": 1.0})
TEXT_PAD = 1.1    # Inter and Segoe UI run up to ~10% wider than Arial


def text_px(text: str, size: float, bold: bool = False) -> float:
    """Estimated pixel width of one line of plain text at `size` px (an upper bound for the page's
    fonts: Arial metrics, padded; wide East Asian characters count 1 em)."""
    em = 0.0
    for ch in text:
        w = _EM.get(ch)
        if w is None:
            w = 1.0 if unicodedata.east_asian_width(ch) in ("W", "F") else 0.7
        em += w
    return em * size * TEXT_PAD * (1.08 if bold else 1.0)


TITLE_CHARS = 36     # a 16 px title line that fits a 320 px wide figure
DETAIL_CHARS = 48    # the same for the 12 px detail lines under it
DETAIL_STYLE = "font-size:12px;color:#4b5563"


def wrap_title(title: str, first: int = TITLE_CHARS, rest: int = DETAIL_CHARS) -> list[str]:
    """A title as lines that fit a narrow figure: a short first line, broken at the last " · " or
    ": " that keeps it within `first` characters, then the details, broken at " · " into lines of
    at most `rest` characters (a part longer than that gets a line of its own). A title that fits,
    or that already has line breaks, is one line."""
    if len(title) <= first or "<br" in title:
        return [title]
    cuts = [(m, sep) for sep in (" · ", ": ") for m in _find_all(title, sep) if 0 < m <= first]
    if not cuts:
        return [title]
    m, sep = max(cuts)
    lines = [title[:m]]
    for part in title[m + len(sep):].split(" · "):
        if len(lines) > 1 and len(lines[-1]) + 3 + len(part) <= rest:
            lines[-1] += " · " + part
        else:
            lines.append(part)
    return lines


def _find_all(text: str, sep: str) -> list[int]:
    out, i = [], text.find(sep)
    while i >= 0:
        out.append(i)
        i = text.find(sep, i + 1)
    return out


def title_html(lines: list[str]) -> str:
    """Plotly title text: the first line at the title's size, the rest smaller and grey."""
    return "<br>".join([lines[0]] + [f"<span style='{DETAIL_STYLE}'>{ln}</span>" for ln in lines[1:]])


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
    return [s for s in steps if s.tree is not None]
