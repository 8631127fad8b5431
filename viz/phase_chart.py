"""Where the time goes: each decoder's cost per generated token, split into the phases of its
cycles (eagle2/phases.py), and the page's own work beside them. Bar lengths compare like the
wall-clock speedup does: a bar half as long is a decoder twice as fast."""
from __future__ import annotations

import plotly.graph_objects as go

from eagle2.cycle.series import Series
from eagle2.phases import PHASE_TEXT, PHASES

from .common import base_layout, figure
from .tree_graph import empty_figure

# one colour per phase: the two forwards solid and dark, the work around them light
PHASE_COLOURS = {"draft_head": "#7c3aed", "draft_tree": "#c4b5fd", "verify_inputs": "#fcd34d",
                 "target_forward": "#1e3a8a", "accept": "#fb923c", "cache_commit": "#f472b6",
                 "policy": "#a3e635"}
PHASE_LABELS = {"draft_head": "draft head", "draft_tree": "drafting around it", "verify_inputs": "verify inputs",
                "target_forward": "target forward", "accept": "accept", "cache_commit": "commit K/V",
                "policy": "policy"}
assert set(PHASE_COLOURS) == set(PHASES) == set(PHASE_LABELS), "a phase without a colour or label"


def per_token_ms(s: Series) -> dict[str, float] | None:
    """The decoder's ms per generated token in each phase, over every recorded cycle (the prefill
    included, as in the wall-clock speedup), or None where its cycles were not split."""
    rows = s.get("phases") or []
    tokens = s["tokens"][-1] if s["tokens"] else 0
    if not rows or tokens <= 0 or any(r is None for r in rows):
        return None
    return {p: 1000 * sum(r[i] for r in rows) / tokens for i, p in enumerate(PHASES)}


def measured_why(main: Series, others: list[Series]) -> dict | None:
    """The main decoder's cycles as they ran, in units of plain decoding's own steps (both split
    into phases; the prefill left out): what the "why the two differ" line says when it can say
    what happened rather than price it (viz.whatif.price_run's keys, and measured=True). None
    without a plain decoder or split cycles."""
    plain = next((o for o in others if o.get("role") == "plain"), None)
    if plain is None:
        return None
    rows, prow = (main.get("phases") or [])[1:], (plain.get("phases") or [])[1:]
    acc = main.get("accepted") or []
    if not rows or not prow or any(r is None for r in rows + prow) or len(acc) < len(rows):
        return None
    i_vi, i_tf, i_dh, i_dt = (PHASES.index(p) for p in ("verify_inputs", "target_forward", "draft_head", "draft_tree"))
    k = len(rows)
    fwd = sum(r[i_vi] + r[i_tf] for r in prow) / len(prow)      # plain: one token's forward
    step = sum(sum(r) for r in prow) / len(prow)                # plain: one token's whole step
    if fwd <= 0 or step <= 0:
        return None
    verify = sum(r[i_vi] + r[i_tf] for r in rows) / k
    draft = sum(r[i_dh] + r[i_dt] for r in rows) / k
    cost = sum(sum(r) for r in rows) / k
    tokens = sum(a + 1 for a in acc[:k]) / k
    verified = (main.get("verified") or [])[1:k + 1]
    return {"cycles": k, "measured": True, "mean_n": sum(verified) / len(verified) if verified else 0.0,
            "verify_per_cycle": verify / fwd, "draft_per_cycle": draft / fwd, "cost_per_cycle": cost / step,
            "tokens_per_cycle": tokens, "speedup": tokens * step / cost if cost > 0 else None}


def phase_chart(all_series: list[Series], page_s: float | None = None, height: int = 360) -> go.Figure:
    """A stacked bar per decoder (ms per token in each phase) and, with `page_s` (the page's own
    seconds so far: the comparison's preview, the race's bookkeeping, drawing), the page's work per
    token of the first decoder's, said in the title."""
    bars = [(s["label"], per_token_ms(s)) for s in all_series]
    bars = [(label, ms) for label, ms in bars if ms is not None]
    if not bars:
        return empty_figure("The split into phases appears once a decoder has run (traces recorded "
                            "before it was timed have none).", height)
    labels = [label for label, _ in bars][::-1]          # the first decoder on top
    text = dict(PHASE_TEXT)
    traces = [dict(type="bar", y=labels, x=[ms[p] for _, ms in bars][::-1], name=PHASE_LABELS[p], orientation="h",
                   marker=dict(color=PHASE_COLOURS[p]),
                   hovertemplate=f"%{{y}}: {PHASE_LABELS[p]} %{{x:.2f}} ms a token<br>{text[p]}<extra></extra>")
              for p in PHASES]
    main = all_series[0]
    tokens = main["tokens"][-1] if main["tokens"] else 0
    title = "Where the time goes: ms per token"
    if page_s is not None and tokens > 0:   # beside the bars, not among them: no decoder pays it
        title += f"<br><sup>+ the page's own work: {1000 * page_s / tokens:.0f} ms a token (preview, drawing)</sup>"
    return figure(traces, **base_layout(title, height=height, barmode="stack",
                                        margin=dict(l=110, r=16, t=64, b=24),
                                        legend=dict(orientation="h", yanchor="top", y=-0.12, x=0, font=dict(size=12),
                                                    traceorder="normal")),
                  xaxis=dict(rangemode="tozero", ticksuffix=" ms"))
