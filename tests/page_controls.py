"""The Live tab's control values as the page's handlers and its HTTP API take them (test_app,
test_serving)."""
from __future__ import annotations

from ui import outputs

SMALL = dict(policy="eagle2", compare="static", total_tokens=10, depth=3, top_k=4, temperature=0.0,
             top_p=1.0, seed=0, max_new_tokens=8, side_by_side=True)
DISPLAY = dict(colour_by="path value", show_dropped=False)
# What the API returns for Step, by name: the Live outputs but the session (a gr.State stays on the server).
STEP_API = [n for n in outputs.LIVE if n != "session"]


def ui(**over):
    """The Live tab's control values, in the order the handlers take them."""
    d = dict(SMALL, **DISPLAY, **over)
    return [d[k] for k in outputs.CONTROLS]
