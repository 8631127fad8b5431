"""The dashboard: the same components and rendering in the Live and Replay tabs.

`render` returns the values and `build_dashboard` the components, both as dicts keyed by the
names in DASH, so handlers and tabs address outputs by name, never by position.
"""
from __future__ import annotations

import gradio as gr

import viz
from eagle2.policies.registry import HARDWARE_AWARE

from .view import View, cut_series

DASH = ("metrics", "tokens", "tree", "compare", "race", "speedup", "whatif", "hist", "calib", "depth", "table",
        "cycle")


def render(view: View | None, cycle=None, colour_by="path value", show_dropped=False) -> dict:
    """Every dashboard output for a view, at a cycle (None = the latest), keyed as DASH."""
    cb = "prob" if str(colour_by).startswith("draft") or colour_by == "prob" else "value"
    if view is None or not view.steps:
        e = viz.empty_figure
        return dict(metrics="", tokens=viz.token_stream_html([]), tree=e("Press Step to draft the first tree.", 460),
                    compare=e("The comparison tree appears here.", 460), race=e("", 300), speedup=e("", 300),
                    whatif=e("", 300), hist=e("", 300), calib=e("", 300), depth=e("", 300), table=viz.cycle_table([]),
                    cycle=gr.Slider(minimum=0, maximum=1, value=0, interactive=False))
    st = view.step_at(None if cycle in (None, 0) else int(cycle))
    upto = len(view.steps) if st is None or cycle in (None, 0) else st.cycle + 1
    steps = view.steps[:upto]
    main = viz.charts.truncate(view.series[0], upto)
    T = main["tokens"][-1] if main["tokens"] else 0
    others = [cut_series(s, T) for s in view.series[1:]]
    allser = [main] + others
    m = viz.metrics(main, others)
    tree = viz.tree_figure(st, colour_by=cb, show_dropped=show_dropped) if st is not None else \
        viz.empty_figure("No draft tree (plain decoding or prefill only).", 460)
    pv = view.previews.get(st.cycle) if st is not None else None
    if pv is not None:
        cmp = viz.tree_figure(pv, colour_by=cb, show_dropped=show_dropped,
                              title=f"{pv.policy} on the same context: accepted {pv.accepted_len} "
                                    f"({st.policy}: {st.accepted_len})")
    else:
        cmp = viz.empty_figure("No side-by-side tree for this cycle.", 460)
    dr = view.drafted
    slider = gr.Slider(minimum=dr[0] if dr else 0, maximum=max(dr[-1] if dr else 1, (dr[0] if dr else 0) + 1),
                       value=st.cycle if st is not None else 0, step=1, interactive=len(dr) > 1)
    lossy = {view.series[0]["label"]: viz.lossy_summary(steps)}
    lossy.update({k: v for k, v in view.lossy.items() if k != view.series[0]["label"]})
    # the what-if: this run's cycles priced with this machine's costs and with a GPU model's
    here = viz.cost_table_from_trace(steps, view.meta, others)
    priced = viz.price_run(main, here) if here else None
    return dict(metrics=viz.metrics_html(m, lossy, suggest=HARDWARE_AWARE, why=priced),
                tokens=viz.token_stream_html(view.steps,
                                             highlight=st.cycle if (st and cycle not in (None, 0)) else None),
                tree=tree, compare=cmp, race=viz.race_chart(allser), speedup=viz.speedup_chart(main, others),
                whatif=viz.whatif_chart(allser, [here, viz.gpu_model_table()]),
                hist=viz.acceptance_histogram(allser), calib=viz.calibration_chart(steps),
                depth=viz.depth_chart(allser), table=viz.cycle_table(steps), cycle=slider)


def slider_kw(upd) -> dict:
    """A gr.Slider update's range and value, as constructor arguments."""
    return {k: getattr(upd, k) for k in ("minimum", "maximum", "value", "interactive")}


def build_dashboard(prefix: str, init: dict | None = None) -> dict:
    """Create the dashboard components in the current layout context, showing `init` (render()'s
    output) from the start; returns them keyed as DASH."""
    v = init or render(None)
    c = {}
    c["metrics"] = gr.HTML(v["metrics"], elem_id=f"{prefix}-metrics", elem_classes=["metricsbox"])
    c["tokens"] = gr.HTML(v["tokens"], elem_id=f"{prefix}-tokens")
    c["cycle"] = gr.Slider(step=1, label="Cycle shown" + (" (the next Step jumps back to the latest)"
                                                          if prefix == "live" else ""),
                           elem_id=f"{prefix}-cycle", **slider_kw(v["cycle"]))
    with gr.Row(equal_height=False):
        c["tree"] = gr.Plot(v["tree"], label="Draft tree (this cycle)", show_label=False, elem_id=f"{prefix}-tree",
                            scale=3)
        c["compare"] = gr.Plot(v["compare"], label="Comparison tree, same context", show_label=False,
                               elem_id=f"{prefix}-cmp", scale=2)
    with gr.Row(equal_height=True):
        c["race"] = gr.Plot(v["race"], label="Race", show_label=False, elem_id=f"{prefix}-race")
        c["speedup"] = gr.Plot(v["speedup"], label="Speedup", show_label=False, elem_id=f"{prefix}-speedup")
    c["whatif"] = gr.Plot(v["whatif"], label="What-if: this run priced on other hardware", show_label=False,
                          elem_id=f"{prefix}-whatif")
    with gr.Row(equal_height=True):
        c["hist"] = gr.Plot(v["hist"], label="Acceptance lengths", show_label=False, elem_id=f"{prefix}-hist")
        c["calib"] = gr.Plot(v["calib"], label="Calibration", show_label=False, elem_id=f"{prefix}-calib")
        c["depth"] = gr.Plot(v["depth"], label="Per-depth acceptance", show_label=False, elem_id=f"{prefix}-depth")
    with gr.Accordion("Per-cycle table", open=False):
        c["table"] = gr.Dataframe(v["table"], elem_id=f"{prefix}-table", interactive=False, wrap=False,
                                  max_height=420, max_chars=48)
    assert set(c) == set(DASH), "build_dashboard and DASH disagree"
    return c
