"""The "Explain a cycle" tab: one cycle of the live session or the replayed trace, phase by
phase (each expansion level, the rerank, the verification, the acceptance)."""
from __future__ import annotations

import gradio as gr

from .. import handlers as h
from ..dashboard import slider_kw
from ..wiring import on

def build_explain_tab(sess: gr.State, rview: gr.State, init: dict | None) -> dict:
    """The tab's contents (call inside `with gr.Tab(...)`), showing `init` (on_explain's output)
    from the start; returns its components by name."""
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
    on(c["source"].change, h.on_explain_source, inputs, h.EXPLAIN, c)
    on(c["cycle"].input, h.on_explain_cycle, inputs, h.EXPLAIN, c, trigger_mode="always_last")
    on(c["phase"].change, h.on_explain, inputs, h.EXPLAIN, c)
    on(c["next"].click, h.on_explain_next, inputs, h.EXPLAIN, c)
    on(c["prev"].click, h.on_explain_prev, inputs, h.EXPLAIN, c)
    return c
