"""The page's event handlers: plain functions (the tests call them directly).

A handler with several outputs returns a dict keyed by the output names below; ui/wiring.py
maps the names to a tab's components. User errors become a warning and leave every output
as it was (gr.skip()); a refused Step or Run also says why on the Live status line.
"""
from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path

import gradio as gr

import viz
from eagle2.cycle.trace import Trace
from eagle2.errors import UserError

from .dashboard import DASH, PANELS, render, render_panel, toggle
from .model import MODEL
from .session import Session, Settings
from .traces import load_view, read_upload, shipped_traces
from .view import VIZ_KEY, View

# The Live tab's controls, in the order on_step / on_run take them after the session and prompt:
# Settings.from_ui's parameters, then the two display options.
CONTROLS = ("policy", "compare", "total_tokens", "depth", "top_k", "temperature", "top_p", "seed",
            "max_new_tokens", "side_by_side", "colour_by", "show_dropped")
N_SETTINGS = CONTROLS.index("side_by_side") + 1
# After them the page passes the dashboard's open panels (a gr.State, ui/dashboard.py's PANELS):
# an update builds and sends only what is on screen. A caller that leaves it out gets every output.
PANELS_STATE = "panels"

# Output names
LIVE = ("session", "status", *DASH)      # Step, Run, Reset
REPLAY = ("view", "info", *DASH)         # loading a trace
EXPLAIN = ("cycle", "phase", "figure", "text")

# Where "Explain a cycle" takes its cycles from
LIVE_SOURCE, REPLAY_SOURCE = "Live session", "Replay trace"


def skip(names) -> dict:
    """Leave every output as it is."""
    return {n: gr.skip() for n in names}


def _warn(msg: str) -> None:
    gr.Warning(msg)


# --------------------------------------------------------------------------------------------
# Live
# --------------------------------------------------------------------------------------------
def live_status(sess: Session | None) -> str:
    if sess is None or not sess.started:
        return "Type a prompt (or pick an example) and press **Step**."
    m = sess.main
    done = f" · **finished** ({m.finished})" if m.finished else ""
    return (f"**Live** · cycle {m.cycle - 1} · {len(m.generated)} tokens · "
            f"{sess.labels()[0]} vs {sess.labels()[1]} vs plain{done}")


def refused_status(sess: Session | None, msg: str) -> str:
    """The status line after a Step or Run that did not run: why and what to do (`msg`), under
    where the session stands if it has started (the dashboard still shows that)."""
    note = f"**{msg}**"
    return f"{live_status(sess)}  \n{note}" if sess is not None and sess.started else note


def refused(sess: Session | None, e: UserError) -> dict:
    """A Step or Run refused: the warning, and the status line saying it; the session, its trace
    and the dashboard stay as they were. Outputs: LIVE."""
    _warn(str(e))
    return {**skip(LIVE), "status": refused_status(sess, str(e))}


def do_steps(sess: Session | None, prompt: str, settings: Settings, n: int = 1) -> tuple[Session, list[str]]:
    """Start (if the prompt is new) and advance the session by up to n lockstep ticks."""
    sess = sess or Session()
    notes = []
    if not sess.lock.acquire(blocking=False):
        raise UserError("This session is busy with another step; wait for it (or press Stop).")
    try:
        if not sess.started or (prompt or "").strip() != (sess.prompt or "").strip():
            if not (prompt or "").strip():
                raise UserError("The prompt is empty: type something in the prompt box (or pick an example), "
                                "then press Step.")
            bundle = MODEL.get()
            sess.start(bundle, prompt, settings)
        else:
            if sess.finished:
                raise UserError(f"This generation has finished ({sess.finished}). Press Reset or edit the prompt.")
            notes = sess.apply(settings)
        for _ in range(n):
            if sess.finished:
                break
            sess.tick()
    finally:
        sess.lock.release()
    return sess, notes


def _live(sess: Session, colour_by="path value", show_dropped=False, panels=None) -> dict:
    return {"session": sess, "status": live_status(sess), **render(sess.view(), None, colour_by, show_dropped, panels)}


def on_step(sess, prompt, *controls) -> dict:
    """Step: one lockstep cycle (starting the prompt if it is new). Outputs: LIVE."""
    try:
        settings = Settings.from_ui(*controls[:N_SETTINGS])
        sess, notes = do_steps(sess, prompt, settings)
    except UserError as e:
        return refused(sess, e)
    for n in notes:
        gr.Info(n)
    return _live(sess, *controls[N_SETTINGS:])


def on_run(sess, prompt, *controls):
    """Run: keeps stepping, yielding every update (LIVE), until the end (or Stop)."""
    try:
        settings = Settings.from_ui(*controls[:N_SETTINGS])
        sess, notes = do_steps(sess, prompt, settings, n=1)
    except UserError as e:
        yield refused(sess, e)
        return
    for n in notes:
        gr.Info(n)
    sess.stop_requested = False
    yield _live(sess, *controls[N_SETTINGS:])
    limit = settings.max_new_tokens + 2
    while not sess.finished and limit > 0:
        if sess.stop_requested:
            gr.Info("Stopped. Step or Run continues from here.")
            return
        limit -= 1
        try:
            sess, _ = do_steps(sess, prompt, settings, n=1)
        except UserError as e:
            _warn(str(e))
            return
        yield _live(sess, *controls[N_SETTINGS:])


def on_stop(sess) -> None:
    """Stop: Run finishes the cycle in progress, shows it and stops (a forward pass cannot be cut)."""
    if sess is not None:
        sess.stop_requested = True


def on_reset(sess, panels=None) -> dict:
    """Reset: a fresh session and an empty dashboard. Outputs: LIVE."""
    if sess is not None and sess.lock.locked():
        _warn("A step is running; press Stop first.")
        return skip(LIVE)
    return {"session": Session(), "status": live_status(None), **render(None, panels=panels)}


def live_view(sess, before: View | None = None) -> View | None:
    """What the Live dashboard shows: the session's decoders once started; `before` (the recorded
    trace a new page shows) while the page has no session yet (a Reset leaves an empty one)."""
    if sess is None:
        return before
    return sess.view() if sess.started else None


def on_live_view(sess, cycle, colour_by, show_dropped, panels=None) -> dict:
    """Cycle slider / display options changed: redraw (no decoding). Outputs: DASH."""
    if sess is None or not sess.started:
        return skip(DASH)
    return render(sess.view(), cycle, colour_by, show_dropped, panels)


def on_side_by_side(view_of):
    """A handler for the side-by-side checkbox: (session, on, cycle, colour_by, show_dropped,
    panels) -> the comparison tree shown (and drawn for `view_of(session)`) or hidden at once (the
    decoders draft it from the next Step on, or stop), and the open panels. Outputs: panels, compare."""
    def side_by_side(sess, on, cycle, colour_by, show_dropped, panels) -> dict:
        if not on:
            return {PANELS_STATE: toggle(panels, "compare", False), "compare": gr.Plot(visible=False)}
        fig = render_panel("compare", view_of(sess), cycle, colour_by, show_dropped)["compare"]
        return {PANELS_STATE: toggle(panels, "compare", True), "compare": gr.Plot(fig, visible=True)}
    return side_by_side


# --------------------------------------------------------------------------------------------
# Panels opened and closed (both tabs)
# --------------------------------------------------------------------------------------------
def panel_outputs(name: str) -> tuple[str, ...]:
    """Output names of the handler for panel `name` opening."""
    return (PANELS_STATE, *PANELS[name])


def on_panel_open(name: str, view_of):
    """A handler for panel `name` opening: (source, cycle, colour_by, show_dropped, panels) ->
    the open panels and the panel drawn (outputs: panel_outputs(name)). `view_of(source)`: the
    View the tab shows (live_view, or the Replay tab's view itself)."""
    def opened(source, cycle, colour_by, show_dropped, panels) -> dict:
        return {PANELS_STATE: toggle(panels, name, True),
                **render_panel(name, view_of(source), cycle, colour_by, show_dropped)}
    opened.__name__ = f"open_{name}"
    return opened


def on_panel_close(name: str):
    """A handler for panel `name` closing: panels -> the open panels (outputs: (PANELS_STATE,))."""
    def closed(panels) -> dict:
        return {PANELS_STATE: toggle(panels, name, False)}
    closed.__name__ = f"close_{name}"
    return closed


def pick_example(choice, examples: dict[str, str]):
    """An example picked: its prompt fills the prompt box."""
    return examples.get(choice, gr.skip()) if choice else gr.skip()


# --------------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------------
def on_replay_load(choice, upload, cycle, colour_by, show_dropped, panels=None) -> dict:
    """Load a shipped (`choice`) or uploaded trace. Outputs: REPLAY. An upload that is not a
    trace this page can draw gives one warning and changes nothing."""
    if upload:
        return on_upload(upload, colour_by, show_dropped, panels)
    try:
        traces = shipped_traces()
        if choice not in traces:
            raise UserError("Pick a recorded trace or upload one.")
        view = load_view(traces[choice])
    except UserError as e:
        _warn(str(e))
        return skip(REPLAY)
    return {"view": view, "info": trace_info(view), **render(view, None, colour_by, show_dropped, panels)}


def on_upload(upload, colour_by, show_dropped, panels=None) -> dict:
    """An uploaded trace (a path, or an object with .name), read and drawn. Outputs: REPLAY."""
    path = upload if isinstance(upload, str) else getattr(upload, "name", upload)
    try:
        view = read_upload(path)
        return {"view": view, "info": trace_info(view), **render(view, None, colour_by, show_dropped, panels)}
    except UserError as e:
        _warn(str(e))
    except Exception as e:   # read, but the figures choke on it: still one warning, nothing replaced
        logging.getLogger(__name__).warning("uploaded trace %s could not be drawn", path, exc_info=True)
        _warn(f"Could not read this trace: it could not be drawn ({type(e).__name__}: {e}).")
    return skip(REPLAY)


def on_replay_pick(choice, upload, cycle, colour_by, show_dropped, panels=None) -> dict:
    """A shipped trace picked (whatever was uploaded before). Outputs: REPLAY."""
    return on_replay_load(choice, None, cycle, colour_by, show_dropped, panels)


def on_replay_view(view, cycle, colour_by, show_dropped, panels=None) -> dict:
    """Cycle slider / display options changed. Outputs: DASH."""
    if view is None:
        return skip(DASH)
    return render(view, cycle, colour_by, show_dropped, panels)


def trace_info(view: View) -> str:
    m = view.meta or {}
    pol = m.get("policy") or {}
    pol_s = ", ".join(f"{k}={v}" for k, v in pol.items() if k != "name")
    sp = m.get("sampling") or {}
    prompt = (m.get("prompt_text") or "").strip()
    user = prompt.split("user\n")[-1].split("<|im_end|>")[0].strip() if "user\n" in prompt else prompt
    title = (m.get(VIZ_KEY) or {}).get("title")
    lines = [f"**{title or view.source}**" if title else f"**{view.source}**",
             f"Prompt: *{user[:300]}*",
             f"Model: {m.get('model', '?').split(' (')[0]} · head: {m.get('head', '?')} · "
             f"{m.get('device', '?')} {m.get('dtype', '')}",
             f"Policy: **{pol.get('name', '?')}** ({pol_s or 'default shape'}) · temperature "
             f"{sp.get('temperature', 0)} · top-p {sp.get('top_p', 1)} · seed {sp.get('seed')}",
             f"{len(view.steps)} cycles · {view.series[0]['tokens'][-1] if view.series[0]['tokens'] else 0} tokens"]
    return "  \n".join(lines)


# --------------------------------------------------------------------------------------------
# Downloads (one output: the files)
# --------------------------------------------------------------------------------------------
def on_export(source: str, sess, view):
    """Write the trace JSON, the per-cycle CSV and the current tree figure HTML; returns the paths."""
    try:
        if source == "live":
            if sess is None or not sess.started:
                raise UserError("Nothing to export yet: press Step first.")
            tr = sess.export()
            v = sess.view()
        else:
            if view is None:
                raise UserError("Load a trace first.")
            v = view
            tr = Trace(meta=v.meta, steps=v.steps)
    except UserError as e:
        _warn(str(e))
        return gr.skip()
    out = Path(tempfile.mkdtemp(prefix="eagle2-viz-"))
    stem = f"eagle2-trace-{time.strftime('%Y%m%d-%H%M%S')}"
    (out / f"{stem}.json").write_text(tr.to_json(), encoding="utf-8")
    viz.cycle_table(v.steps).to_csv(out / f"{stem}.csv", index=False)
    st = v.step_at(None)
    files = [str(out / f"{stem}.json"), str(out / f"{stem}.csv")]
    if st is not None:
        viz.tree_figure(st, show_dropped=True).write_html(out / f"{stem}-tree-cycle{st.cycle}.html",
                                                          include_plotlyjs="cdn")
        files.append(str(out / f"{stem}-tree-cycle{st.cycle}.html"))
    return files


def on_export_live(sess):
    return on_export("live", sess, None)


def on_export_replay(view):
    return on_export("replay", None, view)


# --------------------------------------------------------------------------------------------
# Explain a cycle
# --------------------------------------------------------------------------------------------
def explain_source(source, sess, view) -> View | None:
    if source == LIVE_SOURCE:
        return sess.view() if sess is not None and sess.started else None
    return view


def on_explain(source, sess, view, cycle, phase_label, move=0) -> dict:
    """One phase of one cycle (`move` steps to the previous/next phase). Outputs: EXPLAIN."""
    v = explain_source(source, sess, view)
    st = v.step_at(int(cycle) if cycle else None) if v is not None else None
    if st is None:
        msg = ("Press Step in the Live tab first." if source == LIVE_SOURCE
               else "Load a trace in the Replay tab first.")
        return {"cycle": gr.Slider(), "phase": gr.Radio(choices=[], value=None),
                "figure": viz.empty_figure(msg, 460), "text": msg}
    ph = viz.phases(st)
    labels = [lab for _, lab in ph]
    i = labels.index(phase_label) if phase_label in labels else (len(labels) - 1 if move < 0 else 0)
    if phase_label in labels:
        i = max(0, min(len(labels) - 1, i + move))
    key = ph[i][0]
    dr = v.drafted
    return {"cycle": gr.Slider(minimum=dr[0], maximum=max(dr[-1], dr[0] + 1), value=st.cycle, step=1,
                               interactive=len(dr) > 1),
            "phase": gr.Radio(choices=labels, value=labels[i]),
            "figure": viz.explain_figure(st, key), "text": viz.explain_text(st, key, greedy=v.greedy)}


def on_explain_source(source, sess, view, cycle, phase_label) -> dict:
    """Source changed: its latest cycle, first phase."""
    return on_explain(source, sess, view, None, None)


def on_explain_cycle(source, sess, view, cycle, phase_label) -> dict:
    """Cycle changed: its first phase."""
    return on_explain(source, sess, view, cycle, None)


def on_explain_next(source, sess, view, cycle, phase_label) -> dict:
    return on_explain(source, sess, view, cycle, phase_label, move=1)


def on_explain_prev(source, sess, view, cycle, phase_label) -> dict:
    return on_explain(source, sess, view, cycle, phase_label, move=-1)
