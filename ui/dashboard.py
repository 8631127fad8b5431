"""The dashboard: the same components and rendering in the Live and Replay tabs.

`build_dashboard` returns the components keyed by the names in DASH, and `render` the values
keyed by those components (Gradio updates the components a handler's dict is keyed by), or by
the names themselves (NAMES: tests, and the values a new page starts with).

Only what is on screen is drawn: the tree, the metrics, the token stream and the cycle slider on
every update; the other outputs belong to panels (the comparison tree, and the sections below it)
that the reader opens and closes. `render(..., panels=...)` builds and sends the outputs of the
open panels only (the others get gr.skip(): neither built on the server nor redrawn by the
browser), and opening a panel draws it at once (ui/tabs/sections.py).
"""
from __future__ import annotations

from functools import cached_property

import gradio as gr

import viz
from eagle2.cycle.trace import DEVICE_NAME
from eagle2.policies.registry import HARDWARE_AWARE

from .view import View, cut_series

DASH = ("metrics", "tokens", "tree", "compare", "race", "speedup", "phases", "whatif", "chain", "hist", "calib", "depth",
        "table", "cycle")
ALWAYS = ("metrics", "tokens", "tree", "cycle")        # drawn on every update
# The panels the reader may close, and their outputs; SECTIONS: the collapsible sections under the
# trees, in page order, with their titles; OPEN: the panels open on a new page.
PANELS = {"compare": ("compare",), "race": ("race", "speedup", "phases"), "whatif": ("whatif",), "chain": ("chain",),
          "acceptance": ("hist", "calib", "depth"), "table": ("table",)}
SECTIONS = (("race", "Race and running speedup"), ("whatif", "What-if on other hardware"),
            ("chain", "What-if on acceptance: why depth pays less"),
            ("acceptance", "Acceptance and calibration"), ("table", "Per-cycle table"))
OPEN = frozenset({"compare", "race"})
WIDE = ("phases",)     # charts drawn across the section's width, under its row of charts
assert set(ALWAYS) | {n for outs in PANELS.values() for n in outs} == set(DASH), "DASH, ALWAYS and PANELS disagree"
CHART_LABELS = {"race": "Race", "speedup": "Speedup", "phases": "Where the time goes", "whatif": "What-if: this run priced on other hardware",
                "chain": "What-if on acceptance: a chain's speedup by draft length",
                "hist": "Acceptance lengths", "calib": "Calibration", "depth": "Per-depth acceptance"}
# The acceptance what-if's slider (in the "chain" section) and the state that keeps its value for the
# tab's other redraws (a Step draws that chart too while its section is open). A gr.State, not the
# slider, is what Step and Run take: it stays out of their HTTP API.
ACCEPT, ACCEPT_SLIDER = "accept", "accept_slider"
TREE_PX = 460        # the height of a tree panel's placeholder
CHART_PX = 300       # the height of a chart's placeholder


class _Names(dict):
    """Outputs keyed by their own names: NAMES[name] is name."""

    def __missing__(self, name: str) -> str:
        return name


NAMES = _Names()


def shown(panels=None) -> set:
    """The outputs an update draws when `panels` are open (None: every panel)."""
    if panels is None:
        return set(DASH)
    return set(ALWAYS) | {n for p in panels if p in PANELS for n in PANELS[p]}


def colour_key(colour_by) -> str:
    """The tree figures' colour_by ('prob' or 'value') from the page's choice."""
    return "prob" if str(colour_by).startswith("draft") or colour_by == "prob" else "value"


class At:
    """A view at one cycle (None or 0: the latest), as the dashboard draws it: each output is a
    method, and what several outputs share (the series cut at that cycle, the price table) is
    computed once, when first needed."""

    def __init__(self, view: View, cycle=None, colour_by="path value", show_dropped=False, accept=None):
        self.view, self.latest = view, cycle in (None, 0)
        self.st = view.step_at(None if self.latest else int(cycle))
        self.cb, self.show_dropped = colour_key(colour_by), show_dropped
        self.accept = viz.acceptance_whatif.DEFAULT_A if accept is None else float(accept)

    @cached_property
    def steps(self) -> list:
        upto = len(self.view.steps) if self.st is None or self.latest else self.st.cycle + 1
        return self.view.steps[:upto]

    @cached_property
    def main(self) -> dict:
        return viz.charts.truncate(self.view.series[0], len(self.steps))

    @cached_property
    def others(self) -> list:
        T = self.main["tokens"][-1] if self.main["tokens"] else 0
        return [cut_series(s, T) for s in self.view.series[1:]]

    @property
    def all_series(self) -> list:
        return [self.main] + self.others

    @cached_property
    def here(self) -> viz.whatif.PriceTable | None:
        """This run's cycles priced with this machine's costs (the what-if and the metrics' line)."""
        return viz.price_table_from_trace(self.steps, self.view.meta, self.others)

    def metrics(self) -> str:
        v = self.view
        lossy = {v.series[0]["label"]: viz.lossy_summary(self.steps)}
        lossy.update({k: x for k, x in v.lossy.items() if k != v.series[0]["label"]})
        # what the cycles took, measured against plain's (each cycle split into phases), else the
        # run priced with this machine's t(N) (a trace recorded before the split)
        why = viz.measured_why(self.main, self.others)
        if why is None:
            why = viz.price_run(self.main, self.here) if self.here else None
        # a race recorded elsewhere (Record on the GPU) was timed on its device, not on this machine
        where = v.meta.get(DEVICE_NAME) or "this machine"
        return viz.metrics_html(viz.metrics(self.main, self.others), lossy, suggest=HARDWARE_AWARE, why=why,
                                where=where)

    def tokens(self) -> str:
        hl = self.st.cycle if (self.st is not None and not self.latest) else None
        return viz.token_stream_html(self.view.steps, highlight=hl)

    def tree(self):
        if self.st is None:
            return viz.empty_figure("No draft tree (plain decoding or prefill only).", TREE_PX)
        return viz.tree_figure(self.st, colour_by=self.cb, show_dropped=self.show_dropped)

    def compare(self):
        st = self.st
        pv = self.view.previews.get(st.cycle) if st is not None else None
        if pv is None:
            return viz.empty_figure("No side-by-side tree for this cycle.", TREE_PX)
        return viz.tree_figure(pv, colour_by=self.cb, show_dropped=self.show_dropped,
                               title=f"{pv.policy} on the same context: accepted {pv.accepted_len} "
                                     f"({st.policy}: {st.accepted_len})")

    def race(self):
        return viz.race_chart(self.all_series)

    def speedup(self):
        return viz.speedup_chart(self.main, self.others)

    def phases(self):
        return viz.phase_chart(self.all_series, self.view.page_s if self.latest else None)

    def whatif(self):
        return viz.whatif_chart(self.all_series, [self.here, viz.gpu_model_table()])

    def chain(self):
        return viz.acceptance_whatif_chart(self.steps, self.here, self.accept, self.main["label"])

    def hist(self):
        return viz.acceptance_histogram(self.all_series)

    def calib(self):
        return viz.calibration_chart(self.steps)

    def depth(self):
        return viz.depth_chart(self.all_series)

    def table(self):
        return viz.cycle_table(self.steps)

    def cycle(self):
        dr, st = self.view.drafted, self.st
        lo = dr[0] if dr else 0
        return gr.Slider(minimum=lo, maximum=max(dr[-1] if dr else 1, lo + 1), value=st.cycle if st is not None else 0,
                         step=1, interactive=len(dr) > 1)


class Blank:
    """The dashboard before anything has run: each output a method, as in At."""

    def metrics(self) -> str:
        return ""

    def tokens(self) -> str:
        return viz.token_stream_html([])

    def tree(self):
        return viz.empty_figure("Press Step to draft the first tree.", TREE_PX)

    def compare(self):
        return viz.empty_figure("The comparison tree appears here.", TREE_PX)

    def table(self):
        return viz.cycle_table([])

    def cycle(self):
        return gr.Slider(minimum=0, maximum=1, value=0, interactive=False)

    def chart(self):
        return viz.empty_figure("", CHART_PX)

    race = speedup = phases = whatif = chain = hist = calib = depth = chart


def render(view: View | None, cycle=None, colour_by="path value", show_dropped=False, panels=None,
           out=NAMES, accept=None) -> dict:
    """The dashboard's outputs for a view, at a cycle (None = the latest), keyed by `out[name]` for
    each name in DASH (a tab's components by name; NAMES: the names): those of the open `panels`
    (None: all) built, the others gr.skip(). `accept`: the acceptance what-if's a (None: its default)."""
    at = At(view, cycle, colour_by, show_dropped, accept) if view is not None and view.steps else Blank()
    want = shown(panels)
    return {out[n]: getattr(at, n)() if n in want else gr.skip() for n in DASH}


def render_panel(name: str, view: View | None, cycle=None, colour_by="path value", show_dropped=False,
                 out=NAMES, accept=None) -> dict:
    """The outputs of one panel (just opened), keyed by `out[name]`."""
    at = At(view, cycle, colour_by, show_dropped, accept) if view is not None and view.steps else Blank()
    return {out[n]: getattr(at, n)() for n in PANELS[name]}


def toggle(panels, name: str, is_open: bool) -> frozenset:
    """The open panels after `name` opened or closed."""
    panels = frozenset(panels or ())
    return panels | {name} if is_open else panels - {name}


def slider_kw(upd) -> dict:
    """A gr.Slider update's range and value, as constructor arguments."""
    return {k: getattr(upd, k) for k in ("minimum", "maximum", "value", "interactive")}


def initial(value):
    """A component's starting value from render()'s output: None for an output left out (skipped)."""
    return None if isinstance(value, dict) and value.get("__type__") == "update" else value


def build_dashboard(prefix: str, init: dict | None = None, panels=OPEN) -> tuple[dict, dict]:
    """Create the dashboard components in the current layout context, showing `init` (render()'s
    output) from the start, with `panels` open (the comparison tree shown, the sections expanded).
    Returns the components keyed as DASH (and the acceptance slider and its state, as ACCEPT_SLIDER
    and ACCEPT), and the sections (gr.Accordion) keyed by panel name."""
    v = {n: initial(x) for n, x in (init or render(None)).items()}
    c, sections = {}, {}
    c["metrics"] = gr.HTML(v["metrics"], elem_id=f"{prefix}-metrics", elem_classes=["metricsbox", "dash-metrics"])
    c["tokens"] = gr.HTML(v["tokens"], elem_id=f"{prefix}-tokens", elem_classes=["dash-tokens"])
    c["cycle"] = gr.Slider(step=1, label="Cycle shown" + (" (the next Step jumps back to the latest)"
                                                          if prefix == "live" else ""),
                           elem_id=f"{prefix}-cycle", elem_classes=["dash-cycle"], **slider_kw(v["cycle"]))
    with gr.Row(equal_height=False, elem_classes=["dash-trees"]):
        c["tree"] = gr.Plot(v["tree"], label="Draft tree (this cycle)", show_label=False, elem_id=f"{prefix}-tree",
                            elem_classes=["dash-tree"], scale=3)
        c["compare"] = gr.Plot(v["compare"], label="Comparison tree, same context", show_label=False,
                               elem_id=f"{prefix}-cmp", elem_classes=["dash-cmp"], scale=2,
                               visible="compare" in panels)
    for name, title in SECTIONS:
        with gr.Accordion(title, open=name in panels, elem_id=f"{prefix}-{name}-section",
                          elem_classes=["dash-section"]) as sections[name]:
            if name == "table":
                c["table"] = gr.Dataframe(v["table"], elem_id=f"{prefix}-table", interactive=False, wrap=False,
                                          max_height=420, max_chars=48)
                continue
            if name == "chain":
                lo, hi = viz.acceptance_whatif.A_RANGE
                c[ACCEPT] = gr.State(viz.acceptance_whatif.DEFAULT_A)
                c[ACCEPT_SLIDER] = gr.Slider(lo, hi, value=viz.acceptance_whatif.DEFAULT_A, step=0.01,
                                             label="per-token acceptance a", elem_id=f"{prefix}-accept-a",
                                             info="the chance that each draft token is accepted, once the ones "
                                                  "before it were (a better draft head: a higher a)")
            with gr.Row(equal_height=True):
                for out in PANELS[name]:
                    if out not in WIDE:
                        c[out] = gr.Plot(v[out], label=CHART_LABELS[out], show_label=False, elem_id=f"{prefix}-{out}")
            for out in PANELS[name]:
                if out in WIDE:
                    c[out] = gr.Plot(v[out], label=CHART_LABELS[out], show_label=False, elem_id=f"{prefix}-{out}")
    assert set(c) == set(DASH) | {ACCEPT, ACCEPT_SLIDER}, "build_dashboard and DASH disagree"
    return c, sections
