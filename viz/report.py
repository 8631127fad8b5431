"""Benchmark report: Plotly charts and one HTML page from a bench folder's summary.json and
per_prompt.csv, rendered on demand (`python -m viz.report DIR`); the page loads plotly.js from its
CDN, so reports stay small and the repository keeps only the numbers."""
from __future__ import annotations

import argparse
import html
import json
import re
import sys
from pathlib import Path

import pandas as pd
import plotly.graph_objects as go

SWEEP = re.compile(r"(\S+)\[N=(\d+),d=(\d+),k=(\d+)\]")  # the bench's sweep rows: policy[N=..,d=..,k=..]


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
            pts.append({"policy": m[1], "N": int(m[2]), "depth": int(m[3]), "k": int(m[4]), "speedup": s["speedup"],
                        "tau": s["tau"]})
    if not pts:
        return []
    df = pd.DataFrame(pts)
    figs = []
    for (pol, k), g in df.groupby(["policy", "k"]):
        piv = g.pivot(index="depth", columns="N", values="speedup")
        tau = g.pivot(index="depth", columns="N", values="tau")
        text = [[f"{piv.iloc[i, j]:.2f}x<br>tau {tau.iloc[i, j]:.2f}" for j in range(piv.shape[1])]
                for i in range(piv.shape[0])]
        fig = go.Figure(go.Heatmap(z=piv.values, x=[str(c) for c in piv.columns], y=[str(i) for i in piv.index],
                                   text=text, texttemplate="%{text}", colorscale="Viridis",
                                   colorbar_title="speedup"))
        fig.update_layout(title=f"{pol} speedup over plain, top_k = {k}", xaxis_title="total tokens N",
                          yaxis_title="depth", template="plotly_white")
        figs.append(fig)
    return figs


def summary_table(summary: dict) -> pd.DataFrame:
    df = pd.DataFrame(summary["policies"]).T
    cols = [c for c in ("tau", "tokens_per_s", "speedup", "new_tokens", "target_forwards", "identical_to_plain")
            if c in df.columns]
    return df[cols]


def report_html(summary: dict, rows: list[dict], embed_plotly: bool = False) -> str:
    """embed_plotly: include plotly.js itself (4.8 MB, works offline) instead of loading it from its CDN."""
    figs = [speedup_by_category(summary), tau_distribution(rows)] + sweep_heatmaps(summary)
    js = True if embed_plotly else "cdn"
    parts = [f.to_html(full_html=False, include_plotlyjs=js if i == 0 else False) for i, f in enumerate(figs)]
    meta = {k: summary.get(k) for k in ("device", "model", "head", "dtype", "prompts", "n_prompts",
                                        "max_new_tokens", "sampling", "date", "command")}
    return ("<!doctype html><html><head><meta charset='utf-8'><title>eagle2 bench</title></head>"
            "<body style='font-family:sans-serif;max-width:1100px;margin:auto'>"
            "<h1>eagle2 benchmark</h1><pre>" + html.escape(str(meta)) + "</pre>"
            + summary_table(summary).to_html(float_format=lambda v: f"{v:.3f}") + "".join(parts)
            + "</body></html>")


def render(folder, embed_plotly: bool = False) -> Path:
    """Write FOLDER/report.html from the benchmark's summary.json and per_prompt.csv."""
    folder = Path(folder)
    summary = json.loads((folder / "summary.json").read_text())
    rows = pd.read_csv(folder / "per_prompt.csv").to_dict("records")
    out = folder / "report.html"
    out.write_text(report_html(summary, rows, embed_plotly), encoding="utf-8")
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m viz.report", description=__doc__)
    ap.add_argument("folders", nargs="+", help="benchmark folders (summary.json + per_prompt.csv)")
    ap.add_argument("--embed-plotly", action="store_true", help="include plotly.js (works offline, +4.8 MB)")
    a = ap.parse_args(argv)
    for f in a.folders:
        try:
            print(f"wrote {render(f, a.embed_plotly)}")
        except (OSError, ValueError, KeyError) as e:
            print(f"error: {f}: cannot render a report ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
