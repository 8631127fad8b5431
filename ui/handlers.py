"""The page's event handlers (the tests call them directly, without a page).

A handler with several outputs returns a dict keyed by its outputs' components, which Gradio
updates. Each tab's handlers are the methods of one object (Live, Replay, Explain) made with that
tab's outputs by name (`out`, the names in ui/outputs.py); made without, they key their dicts by the names
themselves (dashboard.NAMES: tests, the values a new page starts with). User errors become a
warning and leave every output as it was (gr.skip()); a refused Step or Run also says why on the
Live status line.
"""
from __future__ import annotations

import logging
import tempfile
import time
from pathlib import Path
from typing import Callable

import gradio as gr

import viz
from eagle2.cycle.trace import Trace, VIZ_KEY
from eagle2.errors import UserError

from .classroom import CLASSROOM
from .classroom_events import ClassroomEvents, break_away
from .dashboard import ACCEPT, DASH, NAMES, PANELS, render, render_panel, toggle
from .model import MODEL
from .outputs import LIVE, N_SETTINGS, PANELS_STATE, REPLAY, RUN, skip
from .outputs import warn as _warn
from .session import Session, Settings
from .status import live_status, race_status, refused_status
from .traces import load_view, read_upload, shipped_traces
from .view import View

# Where "Explain a cycle" takes its cycles from
LIVE_SOURCE, REPLAY_SOURCE = "Live session", "Replay trace"


# --------------------------------------------------------------------------------------------
# Live
# --------------------------------------------------------------------------------------------
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
            notes = sess.race.apply(settings)
        for _ in range(n):
            if sess.finished:
                break
            sess.tick()
    finally:
        sess.lock.release()
    return sess, notes


def on_stop(sess) -> None:
    """Stop: Run finishes the cycle in progress, shows it and stops (a forward pass cannot be cut)."""
    if sess is not None and sess.running:
        sess.running, sess.stop_requested = False, True


def live_view(sess, before: View | None = None) -> View | None:
    """What the Live dashboard shows: the session's decoders once started; a follower's, the
    presenter's latest cycle; `before` (the recorded trace a new page shows) while the page has no
    session yet (a Reset leaves an empty one)."""
    if sess is None:
        return before
    if sess.following is not None:
        try:
            return CLASSROOM.find(sess.following.code).frame.view
        except UserError:
            return None
    return sess.view() if sess.started else None


# --------------------------------------------------------------------------------------------
# The dashboard tabs (Live, Replay): their panels opened and closed; the Live tab's handlers
# --------------------------------------------------------------------------------------------
def panel_outputs(name: str) -> tuple[str, ...]:
    """Output names of the handler for panel `name` opening."""
    return (PANELS_STATE, *PANELS[name])


class Tab:
    """A dashboard tab's handlers. `out`: the tab's outputs by name (its components on the page;
    NAMES: the names themselves), which every returned dict is keyed by; `view_of(source)`: the
    View the tab shows, from its first input (a session, or a trace's View)."""

    def __init__(self, out=NAMES, view_of: Callable = lambda source: source):
        self.out, self.view_of = out, view_of

    def outputs(self, names) -> list:
        """The components named `names`, for an event's outputs."""
        return [self.out[n] for n in names]

    def panel_open(self, name: str) -> Callable:
        """A handler for panel `name` opening: (source, cycle, colour_by, show_dropped, panels[, accept]) ->
        the open panels and the panel drawn (outputs: panel_outputs(name))."""
        def opened(source, cycle, colour_by, show_dropped, panels, accept=None) -> dict:
            return {self.out[PANELS_STATE]: toggle(panels, name, True),
                    **render_panel(name, self.view_of(source), cycle, colour_by, show_dropped, self.out, accept)}
        opened.__name__ = f"open_{name}"
        return opened

    def panel_close(self, name: str) -> Callable:
        """A handler for panel `name` closing: panels -> the open panels (outputs: (PANELS_STATE,))."""
        def closed(panels) -> dict:
            return {self.out[PANELS_STATE]: toggle(panels, name, False)}
        closed.__name__ = f"close_{name}"
        return closed

    def on_accept(self, source, cycle, colour_by, show_dropped, accept) -> dict:
        """The acceptance slider moved: its chart redrawn at `accept` (no decoding), which the tab
        keeps for its later redraws. Outputs: ACCEPT, chain."""
        return {self.out[ACCEPT]: accept,
                **render_panel("chain", self.view_of(source), cycle, colour_by, show_dropped, self.out, accept)}


class Live(Tab, ClassroomEvents):
    """The Live tab's handlers (outputs: LIVE, RUN, PRESENT, FOLLOW and PANELS_STATE);
    `view_of(session)`: live_view (the page's: the recorded trace it opens with until the first Step)."""

    def __init__(self, out=NAMES, view_of: Callable = live_view):
        super().__init__(out, view_of)

    def refused(self, sess: Session | None, e: UserError, names=LIVE) -> dict:
        """A Step or Run refused: the warning, and the status line saying it; the session, its trace
        and the dashboard stay as they were. Outputs: `names` (LIVE, or RUN with Run stopped)."""
        _warn(str(e))
        return {**skip(names, self.out), self.out["status"]: refused_status(sess, str(e)),
                **({self.out["run_timer"]: gr.Timer(active=False)} if "run_timer" in names else {})}

    def live(self, sess: Session, colour_by="path value", show_dropped=False, panels=None, accept=None) -> dict:
        """The session drawn (and, if it presents, published to its followers). Outputs: LIVE."""
        o = self.out
        t0 = time.perf_counter()
        view = sess.view()
        drawn = render(view, None, colour_by, show_dropped, panels, o, accept)
        # published once the presenter's own drawing is done: the class's fetches of the new cycle
        # (its render for them, each follower's answer) then never run beside the presenter's
        if sess.presenting is not None:
            sess.presenting.publish(view, race_status(sess), sess.prompt)
        sess.page_s += time.perf_counter() - t0    # the page's own work, shown in the next drawing
        return {o["session"]: sess, o["status"]: live_status(sess), **drawn}

    def on_step(self, sess, prompt, *controls) -> dict:
        """Step: one lockstep cycle (starting the prompt if it is new). A follower breaks away: the
        prompt (the presenter's, or one it typed) goes on in its own session. Outputs: LIVE."""
        return self._step(sess, prompt, controls)[1]

    def _step(self, sess: Session | None, prompt, controls) -> tuple[Session | None, dict]:
        """A Step: the session stepped (None if the Step was refused: then nothing changed, a
        follower still follows) and the outputs. A follower breaks away before the Step, so that
        Follow pressed while it runs wins."""
        sess = sess or Session()
        following = sess.following
        try:
            settings = Settings.from_ui(*controls[:N_SETTINGS])
            sess, notes = do_steps(break_away(sess), prompt, settings)
        except UserError as e:
            if following is not None and sess.following is None:   # refused: it still follows, counted again
                sess.following = following
                CLASSROOM.mark(following)
            return None, self.refused(sess, e)
        for n in notes:
            gr.Info(n)
        return sess, self.live(sess, *controls[N_SETTINGS:])

    def on_run(self, sess, prompt, *controls) -> dict:
        """Run: one Step, then the run timer ticks (on_run_tick), each tick one more Step queued
        on its own, so the Runs and Steps of other visitors take turns with it. Outputs: RUN."""
        stepped, out = self._step(sess, prompt, controls)
        running = stepped is not None and not stepped.finished
        if running:
            stepped.running, stepped.stop_requested = True, False
        return {**out, self.out["run_timer"]: gr.Timer(active=running)}

    def on_run_tick(self, sess, prompt, *controls) -> dict:
        """The run timer: the next cycle of a Run, until the end or Stop (the cycle in progress
        finishes first). The race's own prompt goes on (an edited prompt box starts a new race only
        with Step). Outputs: RUN."""
        o = self.out
        if sess is None or not sess.running or sess.finished:
            if sess is not None and sess.stop_requested:
                sess.stop_requested = False
                gr.Info("Stopped. Step or Run continues from here.")
            return {**skip(LIVE, o), o["run_timer"]: gr.Timer(active=False)}
        if sess.lock.locked():   # a Step of this session is under way: the next tick goes on
            return skip(RUN, o)
        try:
            settings = Settings.from_ui(*controls[:N_SETTINGS])
            sess, _ = do_steps(sess, sess.prompt, settings)
        except UserError as e:
            sess.running = False
            return self.refused(sess, e, RUN)
        sess.running = sess.running and not sess.finished
        return {**self.live(sess, *controls[N_SETTINGS:]), o["run_timer"]: gr.Timer(active=sess.running)}

    def on_reset(self, sess, panels=None) -> dict:
        """Reset: a fresh session and an empty dashboard (a presentation goes on with it, its
        followers see the presenter start over). Outputs: LIVE."""
        o = self.out
        if sess is not None and sess.lock.locked():
            _warn("A step is running; press Stop first.")
            return skip(LIVE, o)
        fresh = Session()
        if sess is not None:
            break_away(sess)
            sess.running = False
            if sess.presentation is not None:
                fresh.presentation, sess.presentation = sess.presentation, None
                fresh.presentation.publish(None, "", None)
        return {o["session"]: fresh, o["status"]: live_status(fresh), **render(None, panels=panels, out=o)}

    def on_live_view(self, sess, cycle, colour_by, show_dropped, panels=None, accept=None) -> dict:
        """Cycle slider / display options changed: redraw (no decoding). Outputs: DASH."""
        view = live_view(sess) if sess is not None else None
        if view is None:
            return skip(DASH, self.out)
        return render(view, cycle, colour_by, show_dropped, panels, self.out, accept)

    def side_by_side(self, sess, on, cycle, colour_by, show_dropped, panels) -> dict:
        """The side-by-side checkbox: the comparison tree shown (drawn for `view_of(sess)`) or hidden
        at once (the decoders draft it from the next Step on, or stop), and the open panels.
        Outputs: PANELS_STATE, compare."""
        o = self.out
        if not on:
            return {o[PANELS_STATE]: toggle(panels, "compare", False), o["compare"]: gr.Plot(visible=False)}
        fig = render_panel("compare", self.view_of(sess), cycle, colour_by, show_dropped)["compare"]
        return {o[PANELS_STATE]: toggle(panels, "compare", True), o["compare"]: gr.Plot(fig, visible=True)}


def pick_example(choice, examples: dict[str, str]):
    """An example picked: its prompt fills the prompt box."""
    return examples.get(choice, gr.skip()) if choice else gr.skip()


# --------------------------------------------------------------------------------------------
# Replay
# --------------------------------------------------------------------------------------------
class Replay(Tab):
    """The Replay tab's handlers (outputs: REPLAY and PANELS_STATE); the tab shows its trace's View."""

    def loaded(self, view: View, colour_by, show_dropped, panels, accept=None) -> dict:
        """A trace drawn. Outputs: REPLAY."""
        o = self.out
        return {o["view"]: view, o["info"]: trace_info(view),
                **render(view, None, colour_by, show_dropped, panels, o, accept)}

    def on_replay_load(self, choice, upload, cycle, colour_by, show_dropped, panels=None, accept=None) -> dict:
        """Load a shipped (`choice`) or uploaded trace. Outputs: REPLAY. An upload that is not a
        trace this page can draw gives one warning and changes nothing."""
        if upload:
            return self.on_upload(upload, colour_by, show_dropped, panels, accept)
        try:
            traces = shipped_traces()
            if choice not in traces:
                raise UserError("Pick a recorded trace or upload one.")
            view = load_view(traces[choice])
        except UserError as e:
            _warn(str(e))
            return skip(REPLAY, self.out)
        return self.loaded(view, colour_by, show_dropped, panels, accept)

    def on_upload(self, upload, colour_by, show_dropped, panels=None, accept=None) -> dict:
        """An uploaded trace (a path, or an object with .name), read and drawn. Outputs: REPLAY."""
        path = upload if isinstance(upload, str) else getattr(upload, "name", upload)
        try:
            return self.loaded(read_upload(path), colour_by, show_dropped, panels, accept)
        except UserError as e:
            _warn(str(e))
        except Exception as e:   # read, but the figures choke on it: still one warning, nothing replaced
            logging.getLogger(__name__).warning("uploaded trace %s could not be drawn", path, exc_info=True)
            _warn(f"Could not read this trace: it could not be drawn ({type(e).__name__}: {e}).")
        return skip(REPLAY, self.out)

    def on_replay_pick(self, choice, upload, cycle, colour_by, show_dropped, panels=None, accept=None) -> dict:
        """A shipped trace picked (whatever was uploaded before). Outputs: REPLAY."""
        return self.on_replay_load(choice, None, cycle, colour_by, show_dropped, panels, accept)

    def on_replay_view(self, view, cycle, colour_by, show_dropped, panels=None, accept=None) -> dict:
        """Cycle slider / display options changed. Outputs: DASH."""
        if view is None:
            return skip(DASH, self.out)
        return render(view, cycle, colour_by, show_dropped, panels, self.out, accept)


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
        if sess is not None and sess.following is not None:   # the presenter's race as the follower sees it
            source, view = "replay", live_view(sess)
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
    return live_view(sess) if source == LIVE_SOURCE else view


class Explain:
    """The "Explain a cycle" tab's handlers (outputs: EXPLAIN), keyed by `out[name]` (NAMES: the
    names themselves)."""

    def __init__(self, out=NAMES):
        self.out = out

    def on_explain(self, source, sess, view, cycle, phase_label, move=0) -> dict:
        """One phase of one cycle (`move` steps to the previous/next phase). Outputs: EXPLAIN."""
        o = self.out
        v = explain_source(source, sess, view)
        st = v.step_at(int(cycle) if cycle else None) if v is not None else None
        if st is None:
            msg = ("Press Step in the Live tab first." if source == LIVE_SOURCE
                   else "Load a trace in the Replay tab first.")
            return {o["cycle"]: gr.Slider(), o["phase"]: gr.Radio(choices=[], value=None),
                    o["figure"]: viz.empty_figure(msg, 460), o["text"]: msg}
        ph = viz.phases(st)
        labels = [lab for _, lab in ph]
        i = labels.index(phase_label) if phase_label in labels else (len(labels) - 1 if move < 0 else 0)
        if phase_label in labels:
            i = max(0, min(len(labels) - 1, i + move))
        key = ph[i][0]
        dr = v.drafted
        return {o["cycle"]: gr.Slider(minimum=dr[0], maximum=max(dr[-1], dr[0] + 1), value=st.cycle, step=1,
                                      interactive=len(dr) > 1),
                o["phase"]: gr.Radio(choices=labels, value=labels[i]),
                o["figure"]: viz.explain_figure(st, key), o["text"]: viz.explain_text(st, key, greedy=v.greedy)}

    def on_explain_source(self, source, sess, view, cycle, phase_label) -> dict:
        """Source changed: its latest cycle, first phase."""
        return self.on_explain(source, sess, view, None, None)

    def on_explain_cycle(self, source, sess, view, cycle, phase_label) -> dict:
        """Cycle changed: its first phase."""
        return self.on_explain(source, sess, view, cycle, None)

    def on_explain_next(self, source, sess, view, cycle, phase_label) -> dict:
        return self.on_explain(source, sess, view, cycle, phase_label, move=1)

    def on_explain_prev(self, source, sess, view, cycle, phase_label) -> dict:
        return self.on_explain(source, sess, view, cycle, phase_label, move=-1)
