"""What-if: the cycles of a run priced with another device's price table (docs/algorithms.md §2, §9).

A price table (`PriceTable`) prices one target forward of N tokens, t(N) (the engine's
`VerifyTimes`, read between and beyond its N by its one rule), and one draft-head call, and says
what it is (`label`) and whether it was measured or is a model (`source`). A run is priced without
the prefill, which both sides pay alike:

    plain decoding of the same tokens  = tokens x t(1)
    the speculative run                = sum over cycles of  t(N_c) + draft_calls_c x t_draft
    speedup                            = plain / speculative

N_c = tokens verified in cycle c, root included. Only ratios matter, so a modelled table may be
unitless. A flat table (t(N) = t(1), free drafting) gives the speedup in target forwards (~tau);
the steeper t(N) grows with N, the more a big tree costs. Runs are series dicts
(eagle2.cycle.series.series) or lists of StepTraces.
"""
from __future__ import annotations

from dataclasses import dataclass
from statistics import median
from typing import Literal

import plotly.graph_objects as go

from eagle2.model.verify_times import RECORD_KEY, VerifyTimes

from eagle2.cycle.series import Series, series

from .charts import colour, priced, speedup_series
from .common import base_layout, figure, one_x
from .tree_graph import empty_figure

GPU_FLAT_UP_TO = 64       # the modelled GPU verifies up to this many tokens for the price of one
GPU_DRAFT_CALL = 0.1      # one draft-head call, in units of t(1)
PLAIN_ROLE = "plain"      # the baseline every speedup is measured against (priced, never drawn)


@dataclass(frozen=True)
class PriceTable:
    """What one device charges: t(N) and a draft-head call (see the module docstring)."""
    label: str
    source: Literal["measured", "model"]
    times: VerifyTimes        # t(N), seconds or unitless
    draft_call_s: float


# ------------------------------------------------------------------------------------ tables
def gpu_model_table(flat_up_to: int = GPU_FLAT_UP_TO, draft_call: float = GPU_DRAFT_CALL) -> PriceTable:
    """A MODEL of a GPU, not a measurement: verifying up to `flat_up_to` tokens costs what one does
    (the forward is bound by reading the weights), then t(N) grows linearly; t(1) = 1 (unitless)
    and a draft call costs `draft_call` x t(1)."""
    return PriceTable(label=f"GPU model (not measured): t(N) = t(1) up to N = {flat_up_to}, then linear",
                      source="model", times=VerifyTimes({1: 1.0, flat_up_to: 1.0, 2 * flat_up_to: 2.0}),
                      draft_call_s=float(draft_call))


def as_series(run) -> Series:
    return run if isinstance(run, dict) else series("", run)


def price_table_from_trace(steps, meta: dict | None, others=()) -> PriceTable | None:
    """This machine's price table for a run: t(N) as measured by the engine (meta[RECORD_KEY], which
    traces recorded before v2 lack),
    else estimated from the run itself (median verify_s per N over the cycles of `steps` and of the
    series in `others`, a recorded plain series' seconds per cycle standing for t(1)); the draft call
    is the median of draft_s / draft_calls over the cycles. None when the run cannot tell t(1) and
    one more N."""
    runs = [as_series(steps)] + [o for o in others if isinstance(o, dict)]
    per_call = [ds / dc for r in runs if priced(r)
                for ds, dc in zip(r["draft_s"][1:], r["draft_calls"][1:]) if dc > 0 and ds > 0]
    draft_call_s = float(median(per_call)) if per_call else 0.0
    measured = VerifyTimes.read((meta or {}).get(RECORD_KEY))
    if measured is not None:
        return PriceTable(label="this machine (measured t(N))", source="measured", times=measured,
                          draft_call_s=draft_call_s)
    samples: dict[int, list[float]] = {}
    for r in runs:
        if priced(r):
            pairs = zip(r["verified"][1:], r["verify_s"][1:])
        elif r["role"] == PLAIN_ROLE and r["wall_s"]:   # recorded before the pricing keys
            w = r["wall_s"]
            pairs = ((1, b - a) for a, b in zip(w, w[1:]))
        else:
            continue
        for n, t in pairs:
            if n >= 1 and t > 0:
                samples.setdefault(int(n), []).append(float(t))
    if 1 not in samples or len(samples) < 2:
        return None
    return PriceTable(label="this machine (estimated from this run)", source="measured",
                      times=VerifyTimes({n: float(median(v)) for n, v in samples.items()}), draft_call_s=draft_call_s)


# ------------------------------------------------------------------------------------ pricing
def run_cycles(run) -> list[dict] | None:
    """The decode cycles of a run (prefill excluded): tokens emitted, N verified, draft calls.
    None for a series recorded without the per-cycle tree sizes."""
    s = as_series(run)
    if not priced(s):
        return None
    toks = [0] + list(s["tokens"])
    return [{"cycle": i, "tokens": toks[i + 1] - toks[i], "n": max(1, int(s["verified"][i])),
             "draft_calls": int(s["draft_calls"][i])} for i in range(1, len(s["tokens"]))]


def price_run(run, table: PriceTable) -> dict | None:
    """A run priced with a price table (see the module docstring). Totals are in the table's unit;
    the *_per_cycle figures are in units of t(1). None if the run holds no per-cycle tree sizes."""
    cycles = run_cycles(run)
    if cycles is None:
        return None
    t1, td = table.times.t(1), table.draft_call_s
    per, plain, verify, draft = [], 0.0, 0.0, 0.0
    for c in cycles:
        v, d = table.times.t(c["n"]), c["draft_calls"] * td
        plain, verify, draft = plain + c["tokens"] * t1, verify + v, draft + d
        per.append(dict(c, verify=v, draft=d, cost=v + d, speedup=c["tokens"] * t1 / (v + d),
                        running=plain / (verify + draft)))
    k, spec = len(cycles), verify + draft
    tokens = sum(c["tokens"] for c in cycles)
    return {"label": table.label, "source": table.source, "cycles": k, "tokens": tokens,
            "plain": plain, "speculative": spec, "verify": verify, "draft": draft,
            "speedup": plain / spec if k and spec > 0 else None,
            "mean_n": sum(c["n"] for c in cycles) / k if k else 0.0,
            "tokens_per_cycle": tokens / k if k else 0.0,
            "verify_per_cycle": verify / (k * t1) if k else 0.0,
            "draft_per_cycle": draft / (k * t1) if k else 0.0,
            "cost_per_cycle": spec / (k * t1) if k else 0.0,
            "per_cycle": per}


# ------------------------------------------------------------------------------------ figure
def _wrap(text: str, width: int = 48) -> list[str]:
    """Split a caption into lines of at most ~width characters (narrow phones) at its colons,
    commas and semicolons."""
    lines, cur = [], ""
    for part in text.replace(": ", ":\n").replace("; ", ";\n").replace(", ", ",\n").split("\n"):
        if cur and len(cur) + 1 + len(part) > width:
            lines.append(cur)
            cur = part
        else:
            cur = f"{cur} {part}" if cur else part
    return lines + ([cur] if cur else [])


def _category(table: PriceTable) -> str:
    """A table as a short axis category (the caption describes it in full)."""
    if table.source == "model":
        return "priced:<br>" + table.label.partition(" (")[0] + "<br>(not measured)"
    return "priced:<br>this machine"


def _describe(table: PriceTable) -> str:
    """What a table is, for the figure's caption (a model says so in its label)."""
    if table.source == "model":
        return f"{table.label}; a draft call = {table.draft_call_s / table.times.t(1):.1f}·t(1)"
    how = "t(N) estimated from this run" if "estimated" in table.label else "measured t(N)"
    return (f"This machine ({how}): t(1) = {1e3 * table.times.t(1):.0f} ms, a draft call = "
            f"{1e3 * table.draft_call_s:.0f} ms (run median)")


WALL_CATEGORY = "wall clock<br>here"


def whatif_chart(all_series: list[Series], tables: list[PriceTable | None], height: int = 380) -> go.Figure:
    """Each speculative decoder's run priced with each price table, as a speedup over plain decoding
    of the same tokens (plain = 1x under every table): one group of bars per table, one bar per
    decoder; first, for comparison, the wall-clock speedup the run actually got here (needs the
    plain series). Series recorded without per-cycle tree sizes are left out, and the caption
    says so."""
    tables = [t for t in tables if t]
    plain = next((s for s in all_series if s["role"] == PLAIN_ROLE), None)
    runs = [s for s in all_series if s["role"] != PLAIN_ROLE]
    priced = [(s, i, [price_run(s, t) for t in tables]) for i, s in enumerate(runs)]
    skipped = [s["label"] for s, _, p in priced if not p or p[0] is None]
    priced = [(s, i, p) for s, i, p in priced if p and p[0] is not None and p[0]["cycles"]]
    if not priced or not tables:
        return empty_figure("The what-if prices the run once a tree has been verified.", height)
    walls = {s["label"]: (speedup_series(s, plain)[1] or [None])[-1] if plain else None for s, _, _ in priced}
    with_wall = any(w is not None for w in walls.values())
    cats = ([WALL_CATEGORY] if with_wall else []) + [_category(t) for t in tables]
    traces, top = [], 1.0
    for s, i, ps in priced:
        ys = ([walls[s["label"]]] if with_wall else []) + [p["speedup"] for p in ps]
        kinds = (["wall"] if with_wall else []) + [t.source for t in tables]
        info = ([["measured: its tokens per second / plain's, at the same tokens", ""]] if with_wall else []) + \
            [[f"priced as {p['label']}",
              f"{p['cycles']} cycles · per cycle: verifying N ≈ {p['mean_n']:.0f} costs "
              f"{p['verify_per_cycle']:.2f}·t(1), drafting {p['draft_per_cycle']:.2f}·t(1), "
              f"for {p['tokens_per_cycle']:.2f} tokens"] for p in ps]
        traces.append(dict(
            type="bar", x=cats, y=ys, name=s["label"],
            marker=dict(color=colour(s, i), opacity=[0.45 if k == "wall" else 1.0 for k in kinds],
                        pattern=dict(shape=["/" if k == "model" else "" for k in kinds])),
            text=["" if y is None else f"{y:.2f}×" for y in ys], textposition="outside", textfont=dict(size=14),
            constraintext="none", cliponaxis=False, customdata=info,
            hovertemplate=(f"<b>{s['label']}</b>: %{{y:.2f}}× plain<br>%{{customdata[0]}}<br>%{{customdata[1]}}"
                           "<extra></extra>")))
        top = max([top] + [y for y in ys if y is not None])
    notes = ["Speedup over plain decoding (dashed line: 1×)."]
    notes += [line for t in tables for line in _wrap(_describe(t))]
    if skipped:
        notes += _wrap(f"{', '.join(skipped)}: not priced (trace lacks tree sizes)")
    lay = base_layout("What-if: this run priced on other hardware", height=height + 16 * len(notes))
    lay["title"].update(y=1, yref="container", yanchor="top", pad=dict(t=12))
    lay["margin"] = dict(l=44, r=12, t=62 + 16 * len(notes), b=80)
    lay["legend"] = dict(orientation="h", yanchor="top", y=-0.12 - 60 / height, xanchor="left", x=0,
                         font=dict(size=13))
    note = dict(text="<br>".join(notes), xref="paper", yref="paper", x=0, y=1, xanchor="left", yanchor="bottom",
                xshift=-32, yshift=10, align="left", showarrow=False, font=dict(size=12, color="#374151"))
    return figure(traces, **lay, barmode="group", bargap=0.25, bargroupgap=0.06, showlegend=True,
                  annotations=[note], shapes=[one_x()], xaxis=dict(tickfont=dict(size=13), tickangle=0),
                  yaxis=dict(range=[0, 1.2 * top], ticksuffix="×"))
