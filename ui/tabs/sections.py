"""The dashboard's collapsible sections (ui/dashboard.py's SECTIONS), in either tab: opening one
draws its charts for what the tab shows now; closing one stops its updates until it opens again."""
from __future__ import annotations

from typing import Callable

from .. import handlers as h
from ..wiring import on


def wire_sections(sections: dict, view_inputs: list, out: dict, view_of: Callable) -> None:
    """Bind each section's expand and collapse. `view_inputs`: the tab's view (its session or its
    trace), the cycle slider, the colour and dropped-node controls and the open panels, in that
    order; `out`: the tab's outputs by name (the open panels' state among them); `view_of(first
    input)`: the View the tab shows."""
    panels = view_inputs[-1]
    for name, section in sections.items():
        on(section.expand, h.on_panel_open(name, view_of), view_inputs, h.panel_outputs(name), out,
           show_progress="hidden", api_visibility="private")
        on(section.collapse, h.on_panel_close(name), [panels], (h.PANELS_STATE,), out, show_progress="hidden",
           queue=False, api_visibility="private")
