"""The Replay tab: browse a recorded (shipped or uploaded) trace cycle by cycle; no model needed."""
from __future__ import annotations

import gradio as gr

from .. import handlers as h
from ..outputs import PANELS_STATE, REPLAY
from ..dashboard import ACCEPT, DASH, OPEN, build_dashboard
from .live import COLOUR_CHOICES
from .sections import wire_sections


def build_replay_tab(rview: gr.State, traces: dict, init_dash: dict | None, init_info: str) -> tuple[dict, dict]:
    """The tab's contents (call inside `with gr.Tab(...)`); `traces`: display name -> path.
    Returns its controls and its outputs (REPLAY: the view, the trace's description and the
    dashboard), each keyed by name."""
    c: dict = {}
    c["panels"] = gr.State(OPEN)
    # at phone width the trees come first, as in the Live tab (style.css)
    with gr.Row(equal_height=False, elem_classes=["tree-first"]):
        with gr.Column(scale=1, min_width=340, elem_classes=["side"]):
            with gr.Column(elem_classes=["side-settings"]):
                gr.Markdown("Browse a recorded run cycle by cycle; no model needed. Traces are "
                            "written by *Export* in the Live tab or by `python app.py --record-traces`.")
                c["pick"] = gr.Dropdown(list(traces), value=next(iter(traces), None), label="Recorded traces",
                                        elem_id="trace-pick")
                c["upload"] = gr.File(label="…or upload a trace (.json)", file_types=[".json"], type="filepath",
                                      elem_id="trace-upload", height=110)
                info = gr.Markdown(init_info, elem_id="trace-info")
                c["colour_by"] = gr.Radio(COLOUR_CHOICES, value=COLOUR_CHOICES[0], label="Colour nodes by")
                c["show_dropped"] = gr.Checkbox(False, label="Show nodes dropped by the rerank (faded)")
                with gr.Accordion("Downloads", open=False):
                    c["export"] = gr.Button("Export this trace")
                    c["files"] = gr.File(file_count="multiple", label="Files", interactive=False)
        with gr.Column(scale=4, elem_classes=["main"]):
            dash, sections = build_dashboard("replay", init_dash, c["panels"].value)
    out = {"view": rview, "info": info, PANELS_STATE: c["panels"], **dash}

    replay = h.Replay(out)
    load_in = [c["pick"], c["upload"], dash["cycle"], c["colour_by"], c["show_dropped"], c["panels"], dash[ACCEPT]]
    c["pick"].change(replay.on_replay_pick, load_in, replay.outputs(REPLAY))
    c["upload"].upload(replay.on_replay_load, load_in, replay.outputs(REPLAY))
    redraw = [rview, dash["cycle"], c["colour_by"], c["show_dropped"], c["panels"]]
    for event in (dash["cycle"].input, c["colour_by"].change, c["show_dropped"].change):
        event(replay.on_replay_view, redraw + [dash[ACCEPT]], replay.outputs(DASH), trigger_mode="always_last",
              show_progress="hidden")
    wire_sections(sections, redraw, replay)
    c["export"].click(h.on_export_replay, [rview], [c["files"]])
    return c, out
