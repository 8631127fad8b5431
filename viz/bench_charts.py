"""Benchmark report: Plotly charts and one self-contained HTML page from a bench summary."""
from __future__ import annotations

import html
import re

import pandas as pd
import plotly.graph_objects as go

SWEEP = re.compile(r"eagle2\[N=(\d+),d=(\d+),k=(\d+)\]")


def speedup_by_category(summary: dict) -> go.Figure:
    fig = go.Figure()
    cats = list(summary["by_category"])
    for pol in summary["policies"]:
        if SWEEP.match(pol):
            continue
        fig.add_bar(name=pol, x=cats, y=[summary["by_category"][c][pol]["speedup"] for c in cats])
    fig.add_hline(y=1.0, line_dash="dot", annotation_text="plain")
    fig.update_layout(title="Speedup over plain decoding, by category", yaxis_title="speedup (x)",
                      barmode="group", template="plotly_white")
    return fig


def tau_distribution(rows: list[dict]) -> go.Figure:
    df = pd.DataFrame([r for r in rows if not SWEEP.match(r["policy"])])
    fig = go.Figure()
    for pol, g in df.groupby("policy", sort=False):
        fig.add_box(y=g["tau"], name=pol, boxpoints="all", jitter=0.4)
    fig.update_layout(title="tau (tokens per target forward), per prompt", yaxis_title="tau",
                      template="plotly_white")
    return fig


def sweep_heatmaps(summary: dict) -> list[go.Figure]:
    """One N x depth heatmap of speedup per top_k value in the sweep."""
    pts = []
    for pol, s in summary["policies"].items():
        m = SWEEP.match(pol)
        if m:
            pts.append({"N": int(m[1]), "depth": int(m[2]), "k": int(m[3]), "speedup": s["speedup"], "tau": s["tau"]})
    if not pts:
        return []
    df = pd.DataFrame(pts)
    figs = []
    for k, g in df.groupby("k"):
        piv = g.pivot(index="depth", columns="N", values="speedup")
        tau = g.pivot(index="depth", columns="N", values="tau")
        text = [[f"{piv.iloc[i, j]:.2f}x<br>tau {tau.iloc[i, j]:.2f}" for j in range(piv.shape[1])]
                for i in range(piv.shape[0])]
        fig = go.Figure(go.Heatmap(z=piv.values, x=[str(c) for c in piv.columns], y=[str(i) for i in piv.index],
                                   text=text, texttemplate="%{text}", colorscale="Viridis",
                                   colorbar_title="speedup"))
        fig.update_layout(title=f"EAGLE-2 speedup over plain, top_k = {k}", xaxis_title="total tokens N",
                          yaxis_title="depth", template="plotly_white")
        figs.append(fig)
    return figs


def summary_table(summary: dict) -> pd.DataFrame:
    df = pd.DataFrame(summary["policies"]).T
    cols = [c for c in ("tau", "tokens_per_s", "speedup", "new_tokens", "target_forwards", "identical_to_plain")
            if c in df.columns]
    return df[cols]


def report_html(summary: dict, rows: list[dict]) -> str:
    figs = [speedup_by_category(summary), tau_distribution(rows)] + sweep_heatmaps(summary)
    parts = [f.to_html(full_html=False, include_plotlyjs="cdn" if i else True) for i, f in enumerate(figs)]
    meta = {k: summary.get(k) for k in ("device", "model", "head", "dtype", "prompts", "n_prompts",
                                        "max_new_tokens", "sampling", "date", "command")}
    return ("<!doctype html><html><head><meta charset='utf-8'><title>eagle2 bench</title></head>"
            "<body style='font-family:sans-serif;max-width:1100px;margin:auto'>"
            "<h1>eagle2 benchmark</h1><pre>" + html.escape(str(meta)) + "</pre>"
            + summary_table(summary).to_html(float_format=lambda v: f"{v:.3f}") + "".join(parts)
            + "</body></html>")
