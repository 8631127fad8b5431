"""The dashboard's collapsible sections (ui/dashboard.py's SECTIONS), in either tab: opening one
draws its charts for what the tab shows now; closing one stops its updates until it opens again.
The acceptance what-if's slider redraws that chart alone (no decoding)."""
from __future__ import annotations

from .. import handlers as h
from ..dashboard import ACCEPT, ACCEPT_SLIDER


def wire_sections(sections: dict, view_inputs: list, tab: h.Tab) -> None:
    """Bind each section's expand and collapse, and the acceptance slider. `view_inputs`: the tab's
    view (its session or its trace), the cycle slider, the colour and dropped-node controls and the
    open panels, in that order; `tab`: the tab's handlers (made with its outputs, the open panels'
    state, the acceptance slider and its state among them)."""
    panels, accept = view_inputs[-1], tab.out[ACCEPT]
    for name, section in sections.items():
        section.expand(tab.panel_open(name), [*view_inputs, accept], tab.outputs(h.panel_outputs(name)),
                       show_progress="hidden", api_visibility="private")
        section.collapse(tab.panel_close(name), [panels], tab.outputs((h.PANELS_STATE,)), show_progress="hidden",
                         queue=False, api_visibility="private")
    slider = tab.out[ACCEPT_SLIDER]
    slider.input(tab.on_accept, [*view_inputs[:-1], slider], tab.outputs((ACCEPT, "chain")),
                 trigger_mode="always_last", show_progress="hidden", api_visibility="private")
