"""Training curves of draft-head runs, side by side, from their train_log.json files
(`python -m eagle2_train train` writes one per run): the training loss per step, the held-out loss per
epoch, and held-out top-1 agreement at depths 1-3 per epoch; one HTML page, and (--markdown) the
per-epoch table.

    python -m viz.train_report e3=RUN-e3 e12=RUN-e12 --out curves.html [--markdown]

Plotly is loaded from its CDN (--embed-plotly includes it), so pages stay small and the repository
keeps only the logs.
"""
from __future__ import annotations

import argparse
import html
import json
import sys
from pathlib import Path

import plotly.graph_objects as go

DEPTHS = (("heldout_top1", "depth 1"), ("heldout_top1_step2", "depth 2"), ("heldout_top1_step3", "depth 3"))
DASHES = ("solid", "dash", "dot")
COLOURS = ("#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf")  # one per run, in every chart


def colour(i: int) -> str:
    return COLOURS[i % len(COLOURS)]


def read_log(path: Path) -> dict:
    """A run's log: a train_log.json or the run folder holding one."""
    path = Path(path)
    return json.loads((path / "train_log.json" if path.is_dir() else path).read_text())


def smoothed(values: list[float], weight: float = 0.98) -> list[float]:
    """Exponential moving average, bias-corrected (a step loss is one batch: noisy)."""
    out, avg = [], 0.0
    for i, v in enumerate(values, 1):
        avg = weight * avg + (1 - weight) * v
        out.append(avg / (1 - weight ** i))
    return out


def step_loss_chart(logs: dict[str, dict]) -> go.Figure:
    fig = go.Figure()
    for i, (label, log) in enumerate(logs.items()):
        losses = log.get("step_losses", [])
        per = max(int(log.get("steps_per_epoch", 0)), 1)
        x = [(j + 1) / per for j in range(len(losses))]  # in epochs, so runs of other sizes line up
        fig.add_scatter(x=x, y=smoothed(losses), mode="lines", name=label, line=dict(color=colour(i)))
    fig.update_layout(title="Training loss per step (smoothed; the sum over unrolled passes)", xaxis_title="epoch",
                      yaxis_title="loss", template="plotly_white")
    return fig


def heldout_loss_chart(logs: dict[str, dict]) -> go.Figure:
    fig = go.Figure()
    for i, (label, log) in enumerate(logs.items()):
        ep = log["epochs"]
        fig.add_scatter(x=[e["epoch"] for e in ep], y=[e["heldout_loss"] for e in ep], mode="lines+markers",
                        name=label, line=dict(color=colour(i)))
        best = min(ep, key=lambda e: e["heldout_loss"], default=None)
        if best is not None:
            fig.add_scatter(x=[best["epoch"]], y=[best["heldout_loss"]], mode="markers", showlegend=False,
                            marker=dict(symbol="star", size=14, color=colour(i)),
                            hovertext=f"{label}: best epoch {best['epoch']}")
    fig.update_layout(title="Held-out loss per epoch (star: the epoch kept in head/)", xaxis_title="epoch",
                      yaxis_title="loss (step 1)", template="plotly_white")
    return fig


def agreement_chart(logs: dict[str, dict]) -> go.Figure:
    fig = go.Figure()
    for i, (label, log) in enumerate(logs.items()):
        ep = log["epochs"]
        for (key, depth), dash in zip(DEPTHS, DASHES):  # colour: the run; dash: the depth
            if any(key in e for e in ep):
                fig.add_scatter(x=[e["epoch"] for e in ep if key in e], y=[e[key] for e in ep if key in e],
                                mode="lines+markers", name=f"{label} {depth}", line=dict(dash=dash, color=colour(i)))
    fig.update_layout(title="Held-out top-1 agreement with the target, by draft depth", xaxis_title="epoch",
                      yaxis_title="top-1", yaxis_rangemode="tozero", template="plotly_white")
    return fig


def epoch_table(label: str, log: dict) -> str:
    """The per-epoch figures as a markdown table."""
    rows = [f"| {label} epoch | train loss | held-out loss | top-1 | depth 2 | depth 3 | wall (min) |",
            "| --- | --- | --- | --- | --- | --- | --- |"]
    for e in log["epochs"]:
        f = lambda k: f"{e[k]:.3f}" if k in e else "-"  # noqa: E731
        best = " (kept)" if e["epoch"] == min(log["epochs"], key=lambda r: r["heldout_loss"])["epoch"] else ""
        rows.append(f"| {e['epoch']}{best} | {f('train_loss')} | {f('heldout_loss')} | {f('heldout_top1')} | "
                    f"{f('heldout_top1_step2')} | {f('heldout_top1_step3')} | {e.get('wall_s', 0) / 60:.0f} |")
    return "\n".join(rows)


def report_html(logs: dict[str, dict], embed_plotly: bool = False) -> str:
    figs = [step_loss_chart(logs), heldout_loss_chart(logs), agreement_chart(logs)]
    js = True if embed_plotly else "cdn"
    parts = [f.to_html(full_html=False, include_plotlyjs=js if i == 0 else False) for i, f in enumerate(figs)]
    tables = "".join(f"<pre>{html.escape(epoch_table(k, v))}</pre>" for k, v in logs.items())
    return ("<!doctype html><html><head><meta charset='utf-8'><title>eagle2 training curves</title></head>"
            "<body style='font-family:sans-serif;max-width:1100px;margin:auto'><h1>Draft-head training</h1>"
            + "".join(parts) + tables + "</body></html>")


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m viz.train_report", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", help="LABEL=PATH: a run folder or its train_log.json")
    ap.add_argument("--out", default="train_curves.html")
    ap.add_argument("--markdown", action="store_true", help="also print each run's per-epoch table")
    ap.add_argument("--embed-plotly", action="store_true", help="include plotly.js (works offline, +4.8 MB)")
    a = ap.parse_args(argv)
    logs = {}
    for spec in a.runs:
        label, _, path = spec.rpartition("=")
        try:
            logs[label or Path(path).name] = read_log(Path(path))
        except (OSError, ValueError) as e:
            print(f"error: {spec}: no readable train_log.json ({type(e).__name__}: {e})", file=sys.stderr)
            return 2
        if not logs[label or Path(path).name].get("epochs"):
            print(f"error: {spec}: the run has no finished epoch yet", file=sys.stderr)
            return 2
    Path(a.out).write_text(report_html(logs, a.embed_plotly), encoding="utf-8")
    print(f"wrote {a.out}")
    if a.markdown:
        print("\n\n".join(epoch_table(k, v) for k, v in logs.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
