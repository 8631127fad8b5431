"""The page's event handlers (the tests call them directly, without a page).

A handler with several outputs returns a dict keyed by its outputs' components, which Gradio
updates. Each tab's handlers are the methods of one object (Live, Replay, Explain) made with that
tab's outputs by name (`out`, the names below); made without, they key their dicts by the names
themselves (dashboard.NAMES: tests, the values a new page starts with). User errors become a
warning and leave every output as it was (gr.skip()); a refused Step or Run also says why on the
Live status line.
"""
from __future__ import annotations

import html
import logging
import tempfile
import time
from pathlib import Path
from typing import Callable

import gradio as gr

import viz
from eagle2.cycle.trace import Trace
from eagle2.errors import UserError

from .classroom import CLASSROOM, Follower, follow_link, qr_svg
from .dashboard import ACCEPT, DASH, NAMES, PANELS, render, render_panel, shown, toggle
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
LIVE = ("session", "status", *DASH)      # Step, Reset
RUN = (*LIVE, "run_timer")               # Run and its ticks (each tick one queued Step)
PRESENT = ("follow_code", "follow_link", "status", "session", "follow_timer")   # Present, Stop presenting
FOLLOW = ("status", "session", "follow_timer", "prompt", *DASH)                 # Follow, a follower's new frame
TICK = ("follow_mark", "status")                                                 # the follow timer's tick
REPLAY = ("view", "info", *DASH)         # loading a trace
EXPLAIN = ("cycle", "phase", "figure", "text")

# Where "Explain a cycle" takes its cycles from
LIVE_SOURCE, REPLAY_SOURCE = "Live session", "Replay trace"


def skip(names, out=NAMES) -> dict:
    """Leave every output named in `names` as it is (keyed by `out[name]`)."""
    return {out[n]: gr.skip() for n in names}


def _warn(msg: str) -> None:
    gr.Warning(msg)


# --------------------------------------------------------------------------------------------
# Live
# --------------------------------------------------------------------------------------------
def live_status(sess: Session | None) -> str:
    if isinstance(sess, Follower):
        return follower_status(sess)
    if sess is None or not sess.started:
        return "Type a prompt (or pick an example) and press **Step**." + presenting_note(sess)
    return race_status(sess) + presenting_note(sess)


def race_status(sess: Session) -> str:
    """Where a started race stands: its cycle, tokens and decoders (what followers see too)."""
    m, labels = sess.race.main, sess.race.labels()
    done = f" · **finished** ({m.finished})" if m.finished else ""
    return (f"**Live** · cycle {m.cycle - 1} · {len(m.generated)} tokens · "
            f"{labels[0]} vs {labels[1]} vs plain{done}")


def presenting(sess):
    """The presentation `sess` publishes to, while it lasts (else None)."""
    p = sess.presentation if isinstance(sess, Session) else None
    return None if p is None or p.ended else p


def presenting_note(sess) -> str:
    """The presenter's line: its code and how many follow."""
    p = presenting(sess)
    return f"  \nPresenting **{p.code}** · {p.following()} following" if p is not None else ""


def follower_status(f: Follower) -> str:
    """A follower's line: the presenter's (``cycle N`` as there), and whose race it is."""
    try:
        frame = CLASSROOM.find(f.code).frame
    except UserError as e:
        return (f"**{e}** Its last cycle stays on screen; press **Step** to decode your own prompt, or "
                "type another code and press **Follow**.")
    return (f"{frame.status}  \nFollowing **{f.code}** · press **Step** to take this prompt (or your own) "
            "into your own session, **Follow** to come back.")


def refused_status(sess: Session | None, msg: str) -> str:
    """The status line after a Step or Run that did not run: why and what to do (`msg`), under
    where the session stands if it has started (the dashboard still shows that)."""
    note = f"**{msg}**"
    shown_before = isinstance(sess, Follower) or (sess is not None and sess.started)
    return f"{live_status(sess)}  \n{note}" if shown_before else note


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
    if isinstance(sess, Session) and sess.running:
        sess.running, sess.stop_requested = False, True


def live_view(sess, before: View | None = None) -> View | None:
    """What the Live dashboard shows: the session's decoders once started; a follower's, the
    presenter's latest cycle; `before` (the recorded trace a new page shows) while the page has no
    session yet (a Reset leaves an empty one)."""
    if sess is None:
        return before
    if isinstance(sess, Follower):
        try:
            return CLASSROOM.find(sess.code).frame.view
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


class Live(Tab):
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
        if presenting(sess) is not None:
            sess.presentation.publish(view, race_status(sess), sess.prompt)
        drawn = render(view, None, colour_by, show_dropped, panels, o, accept)
        sess.page_s += time.perf_counter() - t0    # the page's own work, shown in the next drawing
        return {o["session"]: sess, o["status"]: live_status(sess), **drawn}

    def on_step(self, sess, prompt, *controls) -> dict:
        """Step: one lockstep cycle (starting the prompt if it is new). A follower breaks away: the
        prompt (the presenter's, or one it typed) goes on in its own session. Outputs: LIVE."""
        try:
            settings = Settings.from_ui(*controls[:N_SETTINGS])
            sess, notes = do_steps(break_away(sess), prompt, settings)
        except UserError as e:
            return self.refused(sess, e)
        for n in notes:
            gr.Info(n)
        return self.live(sess, *controls[N_SETTINGS:])

    def on_run(self, sess, prompt, *controls) -> dict:
        """Run: one Step, then the run timer ticks (on_run_tick), each tick one more Step queued
        on its own, so the Runs and Steps of other visitors take turns with it. Outputs: RUN."""
        out = self.on_step(sess, prompt, *controls)
        sess = out[self.out["session"]]
        running = isinstance(sess, Session) and sess.started and not sess.finished
        if running:
            sess.running, sess.stop_requested = True, False
        return {**out, self.out["run_timer"]: gr.Timer(active=running)}

    def on_run_tick(self, sess, prompt, *controls) -> dict:
        """The run timer: the next cycle of a Run, until the end or Stop (the cycle in progress
        finishes first). The race's own prompt goes on (an edited prompt box starts a new race only
        with Step). Outputs: RUN."""
        o = self.out
        if not isinstance(sess, Session) or not sess.running or sess.finished:
            if isinstance(sess, Session) and sess.stop_requested:
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
        if isinstance(sess, Session) and sess.lock.locked():
            _warn("A step is running; press Stop first.")
            return skip(LIVE, o)
        fresh = Session()
        if isinstance(sess, Session) and sess.presentation is not None:
            fresh.presentation, sess.presentation = sess.presentation, None
            fresh.presentation.publish(None, "", None)
        if isinstance(sess, Session):
            sess.running = False
        return {o["session"]: fresh, o["status"]: live_status(fresh), **render(None, panels=panels, out=o)}

    def on_live_view(self, sess, cycle, colour_by, show_dropped, panels=None, accept=None) -> dict:
        """Cycle slider / display options changed: redraw (no decoding). Outputs: DASH."""
        view = live_view(sess) if isinstance(sess, Follower | Session) else None
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

    # ---------------------------------------------------------------- classroom: present, follow
    def on_present(self, sess, request: gr.Request = None) -> dict:
        """Present: this session's race under a short code that a class follows (the same code
        again while it presents). Outputs: PRESENT, the code first (the API's answer)."""
        o = self.out
        sess = own_session(sess) or Session()
        if presenting(sess) is None:
            sess.presentation = CLASSROOM.open(getattr(request, "session_hash", None))
            sess.presentation.publish(sess.view() if sess.started else None,
                                      race_status(sess) if sess.started else "", sess.prompt)
        code = sess.presentation.code
        link, note = follow_link(getattr(request, "headers", None), code, CLASSROOM.bind_host)
        howto = (f'<div class="follow-qr">{qr_svg(link)}</div><p>Students scan this, open <a href="{html.escape(link)}" '
                 f'target="_blank">{html.escape(link)}</a>, or type the code <b>{code}</b> and press <b>Follow</b>.</p>'
                 + (f"<p><i>{html.escape(note)}</i></p>" if note else ""))
        return {o["follow_code"]: code, o["follow_link"]: howto,
                o["status"]: live_status(sess), o["session"]: sess, o["follow_timer"]: gr.Timer(active=True)}

    def on_unpresent(self, sess) -> dict:
        """Stop presenting: the followers are told, and keep the last cycle. Outputs: PRESENT."""
        o = self.out
        if isinstance(sess, Session) and sess.presentation is not None:
            CLASSROOM.close(sess.presentation, "the presenter stopped presenting")
            sess.presentation = None
        return {o["follow_code"]: "", o["follow_link"]: "", o["status"]: live_status(sess), o["session"]: sess,
                o["follow_timer"]: gr.Timer(active=False)}

    def on_follow(self, sess, code, panels=None) -> dict:
        """Follow: this tab mirrors the presentation under `code` (its latest cycle now, each new
        one as it comes), decoding nothing; its own race, if any, waits for a break-away. A bad or
        ended code: a warning and the status line say why, nothing changes. Outputs: FOLLOW."""
        o = self.out
        try:
            pres = CLASSROOM.find(code)
        except UserError as e:
            _warn(str(e))
            return {**skip(FOLLOW, o), o["status"]: refused_status(sess, str(e))}
        f = sess if isinstance(sess, Follower) and sess.code == pres.code else Follower(pres.code, own_session(sess))
        f.seen = -1
        return {**self._followed(f, pres, panels), o["follow_timer"]: gr.Timer(active=True)}

    def on_follow_tick(self, sess) -> dict:
        """The follow timer (each second): where the tab stands, as a mark (a state whose change
        brings on_follow_frame) and the status line. Cheap when nothing changed: two plain values,
        no component update (Gradio rebuilds a component's config for every update it gets, a
        skip included: ~1 ms each). A presenter's line counts its followers. Outputs: TICK."""
        o = self.out
        if isinstance(sess, Follower):
            return {o["follow_mark"]: follow_mark(sess), o["status"]: live_status(sess)}
        quiet = presenting(sess) is None or sess.lock.locked()   # a Step under way will say where it stands
        return {o["follow_mark"]: follow_mark(sess), o["status"]: gr.skip() if quiet else live_status(sess)}

    def on_follow_frame(self, sess, panels=None) -> dict:
        """The follow mark changed: a follower gets the presenter's new cycle (nothing is sent if it
        has it), or is told the presentation ended; the timer stops once the tab neither follows
        nor presents. Outputs: FOLLOW."""
        o = self.out
        if presenting(sess) is not None:
            return skip(FOLLOW, o)
        if not isinstance(sess, Follower):
            return {**skip(FOLLOW, o), o["follow_timer"]: gr.Timer(active=False)}
        try:
            pres = CLASSROOM.find(sess.code)
        except UserError:
            return {**skip(FOLLOW, o), o["status"]: live_status(sess), o["follow_timer"]: gr.Timer(active=False)}
        return self._followed(sess, pres, panels)

    def _followed(self, f: Follower, pres, panels) -> dict:
        """A follower brought up to the presentation's latest frame (nothing sent if it has it)."""
        o = self.out
        frame = pres.poll(f.id)
        if frame.version == f.seen:
            return skip(FOLLOW, o)
        f.seen = frame.version
        want = shown(panels)
        drawn = frame.outputs([n for n in DASH if n in want])
        new_prompt = frame.prompt is not None and frame.prompt != f.prompt
        f.prompt = frame.prompt if new_prompt else f.prompt
        return {o["session"]: f, o["status"]: live_status(f), o["follow_timer"]: gr.skip(),
                o["prompt"]: frame.prompt if new_prompt else gr.skip(),
                **{o[n]: drawn[n] if n in drawn else gr.skip() for n in DASH}}

    def on_open(self, sess, panels=None, request: gr.Request = None) -> dict:
        """A page opened at /?follow=CODE follows at once; any other page: nothing. Outputs: FOLLOW."""
        code = (getattr(request, "query_params", None) or {}).get("follow")
        return self.on_follow(sess, code, panels) if code else skip(FOLLOW, self.out)


def follow_mark(sess) -> str:
    """Where a tab stands for the follow timer: following (the code and the latest frame, or that
    it ended), presenting, or neither. A change of mark is what redraws a follower."""
    if isinstance(sess, Follower):
        try:   # asking counts as following (the presenter's count)
            return f"{sess.code}:{CLASSROOM.find(sess.code).poll(sess.id).version}"
        except UserError:
            return f"{sess.code}:ended"
    if presenting(sess) is not None:
        return "presenting"
    return "off"


def own_session(sess):
    """The visitor's own race: a follower's, the one it had before following (or none)."""
    return sess.own if isinstance(sess, Follower) else sess


def break_away(sess):
    """A follower stops following (no longer counted) and goes back to its own race."""
    if isinstance(sess, Follower):
        CLASSROOM.leave(sess)
    return own_session(sess)


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
        if isinstance(sess, Follower):   # the presenter's race as the follower sees it
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
