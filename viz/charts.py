"""Run-level charts: the race, speedups, acceptance lengths, calibration, per-depth acceptance.

A *series* (`Series`) is one decoder's progress, a dict so it can be stored in a trace's meta and
replayed without the decoder; its keys are the trace's (eagle2/cycle/series.py): "label", "role",
"policy", "tokens", "wall_s", "forwards", "accepted" always, plus what pricing a run needs
(viz/whatif.py, PRICING). Series recorded before the pricing keys existed lack them; everything
but the what-if works without. The engine builds them from a decoder's steps (`series`).
"""
from __future__ import annotations

import bisect

import numpy as np
import pandas as pd
import plotly.graph_objects as go

from eagle2.cycle.series import PER_CYCLE, PRICING, Series

from .common import figure, one_x, ACCEPT_COLOUR, EXTRA_COLOURS, ROLE_COLOURS, base_layout, decode_steps, p_of
from .tree_graph import empty_figure


def priced(s: Series) -> bool:
    """Whether the series carries the per-cycle figures pricing needs (PRICING)."""
    return all(k in s for k in PRICING)


def truncate(s: Series, n_cycles: int) -> Series:
    """The series as it stood after its first n_cycles cycles."""
    out = Series(**s)
    for k in PER_CYCLE:
        if k in s:
            out[k] = s[k][:n_cycles]
    out["accepted"] = s["accepted"][: max(0, n_cycles - 1)]  # cycle 0 (prefill) drafts nothing
    return out


def colour(s: Series, i: int = 0) -> str:
    return ROLE_COLOURS.get(s["role"], EXTRA_COLOURS[i % len(EXTRA_COLOURS)])


def _at(s: Series, key: str, T: float) -> float | None:
    """s[key] (cumulative) when this decoder reached T tokens (linear between cycles), None if it
    has not got there yet."""
    toks, ys = [0] + list(s["tokens"]), [0.0] + [float(v) for v in s[key]]
    if not s["tokens"] or T > toks[-1]:
        return None
    j = bisect.bisect_left(toks, T)
    if toks[j] == T or j == 0:
        return ys[j]
    f = (T - toks[j - 1]) / (toks[j] - toks[j - 1])
    return ys[j - 1] + f * (ys[j] - ys[j - 1])


def wall_at(s: Series, T: float) -> float | None:
    """Compute time this decoder needed to reach T tokens (linear between cycles), None if it
    has not got there yet."""
    return _at(s, "wall_s", T)


def forwards_at(s: Series, T: float) -> float | None:
    """Target forward passes this decoder needed to reach T tokens (linear between cycles)."""
    return _at(s, "forwards", T)


def forward_speedup(main: Series, other: Series) -> float | None:
    """How many times fewer target forwards `main` needed than `other` for the same tokens (the
    largest of main's token counts both reached, as for the wall-clock speedup): what the tree
    buys whatever the hardware; against plain decoding it is main's tau."""
    for T in reversed(main["tokens"]):
        a, b = forwards_at(main, T), forwards_at(other, T)
        if T > 0 and a and b:
            return b / a
    return None


def speedup_series(main: Series, other: Series) -> tuple[list, list]:
    """Speedup of `main` over `other` at each of main's token counts: time other needed for T
    tokens / time main needed for T tokens (same as the ratio of tokens per second)."""
    xs, ys = [], []
    for T in main["tokens"]:
        a, b = wall_at(main, T), wall_at(other, T)
        if a and b and T > 0:
            xs.append(T)
            ys.append(b / a)
    return xs, ys


def summary(s: Series) -> dict:
    toks = s["tokens"][-1] if s["tokens"] else 0
    wall = s["wall_s"][-1] if s["wall_s"] else 0.0
    fw = s["forwards"][-1] if s["forwards"] else 0
    acc = s["accepted"]
    return {"decoder": s["label"], "policy": s["policy"], "tokens": toks, "wall_s": wall,
            "tokens_per_s": toks / wall if wall > 0 else 0.0, "target_forwards": fw,
            "tau": toks / fw if fw else 0.0,
            "mean_accepted": float(np.mean(acc)) if acc else 0.0, "cycles": len(acc)}


def metrics(main: Series, others: list[Series]) -> dict:
    """Headline numbers: each decoder's summary and main's speedups over each other decoder at
    the largest token count both reached: "speedups" in wall-clock time on this machine,
    "forward_speedups" in target forward passes."""
    out = {"decoders": [summary(main)] + [summary(o) for o in others], "speedups": {}, "forward_speedups": {}}
    for o in others:
        xs, ys = speedup_series(main, o)
        out["speedups"][o["label"]] = ys[-1] if ys else None
        out["forward_speedups"][o["label"]] = forward_speedup(main, o)
    return out


def lossy_summary(steps) -> dict | None:
    """For policies with relaxed (lossy) acceptance (LANTERN): how many accepted tokens needed the
    relaxation and the largest per-position distribution shift, over the steps; None if exact."""
    deps = [d for s in decode_steps(steps) if s.tree.record is not None
            for d in [s.tree.record.departure()] if d is not None]
    if not deps:
        return None
    return {"rule": deps[0]["rule"], "cycles": len(deps),
            "relaxed_tokens": int(sum(d["relaxed_tokens"] for d in deps)),
            "max_shift": max(float(d["max_shift"]) for d in deps)}


def why_line(why: dict | None = None, where: str = "this machine") -> str:
    """One line on why the speedup in forwards is not the wall-clock one. `why`: the main
    decoder's cycles as measured against plain's (viz.phase_chart.measured_why), or its run priced
    with this machine's price table (viz.whatif.price_run), adds its numbers. `where`: the machine
    the run was timed on (a recorded race names its device)."""
    line = (f"<b>Why the two differ:</b> on {where} a cycle's verification of N tokens costs "
            "t(N)/t(1) times one token's forward, plus drafting")
    if why and why["cycles"] and why["speedup"] is not None and why.get("measured"):
        line += (f": here, as measured, N ≈ {why['mean_n']:.0f} took {why['verify_per_cycle']:.1f}× plain's "
                 f"forward, drafting {why['draft_per_cycle']:.1f}×, so a cycle took {why['cost_per_cycle']:.1f} "
                 f"plain steps' time for its {why['tokens_per_cycle']:.1f} tokens ({why['speedup']:.2f}×). "
                 "The race runs its decoders in turn, so each pays for the caches the others left it: on a "
                 "CPU these figures read up to a tenth under one decoder running alone (the bench)")
    elif why and why["cycles"] and why["speedup"] is not None:
        line += (f": here N ≈ {why['mean_n']:.0f} costs {why['verify_per_cycle']:.1f}×, drafting "
                 f"{why['draft_per_cycle']:.1f}×, so a cycle costs {why['cost_per_cycle']:.1f} forwards' time "
                 f"for its {why['tokens_per_cycle']:.1f} tokens ({why['speedup']:.2f}× at these prices)")
    return line + "."


def metrics_html(m: dict, lossy: dict | None = None, suggest: str | None = None, why: dict | None = None,
                 where: str = "this machine") -> str:
    """Metric cards: speedups first (big; wall-clock on this machine and in target forwards), the
    line on why they differ, then one line per decoder; `lossy` = {decoder label: lossy_summary}
    adds a warning card for decoders whose output is not exactly the target's; `suggest` names a
    policy that sizes its tree from measured costs, offered when the main decoder runs slower
    than plain; `why` (see why_line) puts this run's numbers in the line; `where` names the
    machine the wall clock ran on (a recorded race's device)."""
    main = m["decoders"][0]
    cards = []
    for label, lo in (lossy or {}).items():
        if lo:
            cards.append(f'<div class="mcard lossy" title="relaxed acceptance: the output distribution is not '
                         f'exactly the target model\'s"><div class="mval">LOSSY</div><div class="mlab"><b>{label}</b> '
                         f'({lo["rule"]})<br><small>{lo["relaxed_tokens"]} relaxed tokens · max shift '
                         f'{lo["max_shift"]:.3f}</small></div></div>')
    fwd = m["forward_speedups"]
    for label, sp in m["speedups"].items():
        val = "–" if sp is None else f"{sp:.2f}×"
        fs = fwd.get(label)
        fval = "–" if fs is None else f"{fs:.2f}×"
        pair = 'style="display:flex;align-items:center;gap:8px"'
        cards.append(f'<div class="mcard speed" style="flex-basis:300px;flex-wrap:wrap;row-gap:2px;column-gap:18px">'
                     f'<div class="mlab" style="flex-basis:100%"><b>{main["decoder"]}</b> vs {label}: speedup</div>'
                     f'<div {pair} title="tokens per second of {main["decoder"]} / tokens per second of {label}, '
                     f'at the same number of tokens, each timed on its own work"><div class="mval">{val}</div>'
                     f'<div class="mlab"><small>wall clock,<br>{where}</small></div></div>'
                     f'<div {pair} title="target forward passes {label} needed / forward passes {main["decoder"]} '
                     f'needed, for the same tokens: what the tree buys on any hardware (against plain decoding: '
                     f'tau)"><div class="mval" style="color:#374151">{fval}</div>'
                     f'<div class="mlab"><small>in target<br>forward passes</small></div></div></div>')
    vs_plain = m["speedups"].get("plain")
    if (suggest and vs_plain is not None and vs_plain < 1.0 and main["tokens"] >= 16
            and not main["decoder"].startswith(suggest)):
        cards.append('<div class="mcard hint" title="why speculative decoding can be slower">'
                     '<div class="mlab"><b>Slower than plain here?</b><br><small>On this device, verifying the '
                     f'whole tree costs more than the extra accepted tokens return. Policy <b>{suggest}</b> '
                     'sizes the tree from measured costs.</small></div></div>')
    if m["speedups"] and main["cycles"]:
        cards.append(f'<div class="mcard why" style="flex-basis:100%;padding:4px 12px">'
                     f'<div class="mlab">{why_line(why, where)}</div></div>')
    for d in m["decoders"]:
        cards.append(
            f'<div class="mcard" title="tau: generated tokens per target forward pass (plain decoding: 1)">'
            f'<div class="mval">{d["tau"]:.2f}</div><div class="mlab"><b>{d["decoder"]}</b> · τ tokens/forward<br>'
            f'<small>{d["tokens"]} tok · {d["target_forwards"]} fwd · {d["tokens_per_s"]:.1f} tok/s</small></div></div>')
    return '<div class="metrics">' + "".join(cards) + "</div>"


def race_chart(all_series: list[Series], height: int = 330) -> go.Figure:
    if not any(s["tokens"] for s in all_series):
        return empty_figure("The race starts with the first step.", height)
    traces = [dict(type="scatter", x=[0.0] + s["wall_s"], y=[0] + s["tokens"], mode="lines+markers", name=s["label"],
                   line=dict(color=colour(s, i), width=3, shape="hv"), marker=dict(size=5),
                   hovertemplate=f"{s['label']}<br>%{{y}} tokens after %{{x:.2f}} s<extra></extra>")
              for i, s in enumerate(all_series)]
    return figure(traces, **base_layout("Race: tokens vs compute time", height=height),
                  xaxis=dict(title=dict(text="seconds (each decoder's own work)"), rangemode="tozero"),
                  yaxis=dict(title=dict(text="tokens generated"), rangemode="tozero"))


def speedup_chart(main: Series, others: list[Series], height: int = 330) -> go.Figure:
    traces, any_data = [], False
    for i, o in enumerate(others):
        xs, ys = speedup_series(main, o)
        any_data |= bool(xs)
        traces.append(dict(type="scatter", x=xs, y=ys, mode="lines+markers", name=f"vs {o['label']}",
                           line=dict(color=colour(o, i), width=3), marker=dict(size=5),
                           hovertemplate=f"vs {o['label']}: %{{y:.2f}}× at %{{x}} tokens<extra></extra>"))
    if not any_data:
        return empty_figure("Speedups appear once two decoders have run.", height)
    top = max(main["tokens"]) if main["tokens"] else 1
    return figure(traces, **base_layout(f"Running speedup of {main['label']}", height=height),
                  shapes=[one_x("#9ca3af", 1, below=False)],
                  xaxis=dict(title=dict(text="tokens generated"), dtick=max(1, round(top / 8)) if top < 80 else None),
                  yaxis=dict(title=dict(text="speedup (×)"), rangemode="tozero"))


def acceptance_histogram(all_series: list[Series], height: int = 330) -> go.Figure:
    drafted = [s for s in all_series if s["accepted"]]
    if not drafted:
        return empty_figure("No drafted cycles yet.", height)
    top = max(max(s["accepted"]) for s in drafted)
    traces = []
    for i, s in enumerate(drafted):
        counts = np.bincount(s["accepted"], minlength=top + 1)
        traces.append(dict(type="bar", x=list(range(top + 1)), y=counts / counts.sum(), name=s["label"],
                           marker=dict(color=colour(s, i)), customdata=counts,
                           hovertemplate=f"{s['label']}: %{{customdata}} cycles accepted %{{x}}<extra></extra>"))
    return figure(traces, **base_layout("Accepted draft tokens per cycle", height=height), barmode="group",
                  xaxis=dict(title=dict(text="accepted (bonus excluded)"), dtick=1),
                  yaxis=dict(title=dict(text="share of cycles"), rangemode="tozero", tickformat=".0%"))


def calibration_data(steps, bins: int = 10) -> pd.DataFrame:
    """Over every verified node of every drafted step: draft confidence bins vs the observed
    acceptance rate. kind='path value': value bin vs P(accepted); kind='draft prob': the node's
    own draft probability vs P(accepted | its parent was accepted)."""
    rows = []
    for s in decode_steps(steps):
        t = s.tree
        acc = t.accepted or [False] * len(t.tokens)
        for i in range(1, len(t.tokens)):
            if not t.kept[i]:
                continue
            rows.append(("path value", p_of(t.values[i]), bool(acc[i])))
            if acc[t.parents[i]]:
                rows.append(("draft prob", p_of(t.logp[i]), bool(acc[i])))
    df = pd.DataFrame(rows, columns=["kind", "confidence", "accepted"])
    if df.empty:
        return pd.DataFrame(columns=["kind", "bin", "lo", "hi", "centre", "count", "accepted", "rate",
                                     "mean_confidence"])
    edges = np.linspace(0, 1, bins + 1)
    df["bin"] = np.clip(np.digitize(df["confidence"], edges) - 1, 0, bins - 1)
    g = df.groupby(["kind", "bin"]).agg(count=("accepted", "size"), accepted=("accepted", "sum"),
                                        mean_confidence=("confidence", "mean")).reset_index()
    g["lo"], g["hi"] = edges[g["bin"]], edges[g["bin"] + 1]
    g["centre"] = (g["lo"] + g["hi"]) / 2
    g["rate"] = g["accepted"] / g["count"]
    return g[["kind", "bin", "lo", "hi", "centre", "count", "accepted", "rate", "mean_confidence"]]


def calibration_chart(steps, height: int = 330) -> go.Figure:
    df = calibration_data(steps)
    if df.empty:
        return empty_figure("Calibration fills in as cycles are verified.", height)
    traces = [dict(type="scatter", x=[0, 1], y=[0, 1], mode="lines", name="perfectly calibrated",
                   line=dict(color="#9ca3af", dash="dash", width=1), hoverinfo="skip")]
    styles = {"path value": (ROLE_COLOURS["main"], "circle"), "draft prob": (ACCEPT_COLOUR, "diamond")}
    for kind, (c, sym) in styles.items():
        d = df[df["kind"] == kind]
        if d.empty:
            continue
        size = 7 + 12 * np.sqrt(d["count"] / d["count"].max())
        traces.append(dict(
            type="scatter", x=d["mean_confidence"], y=d["rate"], mode="lines+markers", name=kind,
            line=dict(color=c, width=2), marker=dict(size=size, symbol=sym, color=c),
            customdata=np.stack([d["lo"], d["hi"], d["count"], d["accepted"]], axis=1),
            hovertemplate=(f"{kind} in [%{{customdata[0]:.1f}}, %{{customdata[1]:.1f}})<br>"
                           "%{customdata[3]} of %{customdata[2]} accepted = %{y:.0%}<extra></extra>")))
    lay = base_layout("Calibration: confidence vs acceptance", height=height)
    lay["legend"] = dict(lay["legend"], orientation="v", x=0.02, y=0.98, xanchor="left", yanchor="top",
                         bgcolor="rgba(255,255,255,0.8)")
    return figure(traces, **lay, xaxis=dict(title=dict(text="draft confidence (bin mean)"), range=[-0.02, 1.02]),
                  yaxis=dict(title=dict(text="observed acceptance rate"), range=[-0.02, 1.05], tickformat=".0%"))


def depth_acceptance(s: Series) -> list[float]:
    """rate[k-1] = share of drafted cycles whose accepted path reached depth k."""
    acc = np.asarray(s["accepted"])
    if acc.size == 0:
        return []
    top = max(1, int(acc.max()))
    return [float((acc >= k).mean()) for k in range(1, top + 1)]


def depth_chart(all_series: list[Series], height: int = 330) -> go.Figure:
    drafted = [s for s in all_series if s["accepted"]]
    if not drafted:
        return empty_figure("No drafted cycles yet.", height)
    traces = []
    for i, s in enumerate(drafted):
        r = depth_acceptance(s)
        traces.append(dict(type="bar", x=list(range(1, len(r) + 1)), y=r, name=s["label"],
                           marker=dict(color=colour(s, i)),
                           hovertemplate=f"{s['label']}: %{{y:.0%}} of cycles reached depth %{{x}}<extra></extra>"))
    return figure(traces, **base_layout("Acceptance by depth", height=height), barmode="group",
                  xaxis=dict(title=dict(text="depth"), dtick=1),
                  yaxis=dict(title=dict(text="cycles accepted to this depth"), range=[0, 1.05], tickformat=".0%"))
