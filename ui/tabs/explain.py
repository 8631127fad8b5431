"""The "Explain a cycle" tab: one cycle of the live session or the replayed trace, phase by
phase (each expansion level, the rerank, the verification, the acceptance)."""
from __future__ import annotations

import gradio as gr

from .. import handlers as h
from ..outputs import EXPLAIN
from ..dashboard import slider_kw

def build_explain_tab(sess: gr.State, rview: gr.State, init: dict | None) -> dict:
    """The tab's contents (call inside `with gr.Tab(...)`), showing `init` (Explain().on_explain's
    output, keyed by name) from the start; returns its components by name."""
    c: dict = {}
    with gr.Row(equal_height=False):
        with gr.Column(scale=1, min_width=340):
            gr.Markdown("Replay one cycle phase by phase: each expansion level of the draft tree, "
                        "the rerank, the target's verification and the acceptance.")
            c["source"] = gr.Radio([h.LIVE_SOURCE, h.REPLAY_SOURCE], value=h.REPLAY_SOURCE, label="Source")
            c["cycle"] = gr.Slider(step=1, label="Cycle", elem_id="explain-cycle",
                                   **(slider_kw(init["cycle"]) if init else {}))
            c["phase"] = gr.Radio(init["phase"].choices if init else [], value=init["phase"].value if init else None,
                                  label="Phase", elem_id="explain-phase")
            with gr.Row():
                c["prev"] = gr.Button("◀ Previous phase")
                c["next"] = gr.Button("Next phase ▶", variant="primary")
            c["text"] = gr.Markdown(init["text"] if init else "", elem_id="explain-text")
        with gr.Column(scale=3):
            c["figure"] = gr.Plot(init["figure"] if init else None, label="Tree at this phase", show_label=False,
                                  elem_id="explain-tree")

    inputs = [c["source"], sess, rview, c["cycle"], c["phase"]]
    explain, outputs = h.Explain(c), [c[n] for n in EXPLAIN]
    c["source"].change(explain.on_explain_source, inputs, outputs)
    c["cycle"].input(explain.on_explain_cycle, inputs, outputs, trigger_mode="always_last")
    c["phase"].change(explain.on_explain, inputs, outputs)
    c["next"].click(explain.on_explain_next, inputs, outputs)
    c["prev"].click(explain.on_explain_prev, inputs, outputs)
    return c
