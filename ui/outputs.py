"""The page's handlers' outputs, by name: which components each event updates (the handlers key
their dicts by `out[name]`, the tab's components; dashboard.NAMES: the names themselves), and the
two ways a handler leaves them alone (gr.skip(), and a warning where the visitor needs one)."""
from __future__ import annotations

import gradio as gr

from .dashboard import DASH, NAMES

# The Live tab's controls, in the order on_step / on_run take them after the session and prompt:
# Settings.from_ui's parameters, then the two display options.
CONTROLS = ("policy", "compare", "total_tokens", "depth", "top_k", "temperature", "top_p", "seed",
            "max_new_tokens", "side_by_side", "colour_by", "show_dropped")
N_SETTINGS = CONTROLS.index("side_by_side") + 1
# After them the page passes the dashboard's open panels (a gr.State, ui/dashboard.py's PANELS):
# an update builds and sends only what is on screen. A caller that leaves it out gets every output.
PANELS_STATE = "panels"

LIVE = ("session", "status", *DASH)      # Step, Reset
RUN = (*LIVE, "run_timer")               # Run and its ticks (each tick one queued Step)
PRESENT = ("follow_code", "follow_link", "status", "session", "follow_timer")   # Present, Stop presenting
FOLLOW = ("status", "session", "follow_timer", "prompt", *DASH)                 # Follow, a follower's new frame
TICK = ("follow_mark", "status")                                                 # the follow timer's tick
REPLAY = ("view", "info", *DASH)         # loading a trace
EXPLAIN = ("cycle", "phase", "figure", "text")


def skip(names, out=NAMES) -> dict:
    """Leave every output named in `names` as it is (keyed by `out[name]`)."""
    return {out[n]: gr.skip() for n in names}


def warn(msg: str) -> None:
    gr.Warning(msg)
