"""The Live tab's classroom events: Present and Stop presenting, Follow, and a follower's tab
keeping up with the presenter (a part of handlers.Live; ui/classroom.py holds the presentations).

A tab's follow timer runs in the browser (ui/tabs/live.py FOLLOW_TICK_JS): while it follows, it
asks the classroom's mark route each second and calls no event; when the mark changes,
`on_follow_frame` brings the new cycle. Anything else (a tab that just pressed Follow, or one
that presents and shows its followers' count) pokes `on_follow_tick`, which says where the tab
stands. The session is always one ui.session.Session: following is a part of it (`following`),
and its own race waits behind it until a Step breaks away."""
from __future__ import annotations

import html

import gradio as gr

from eagle2.errors import UserError

from .classroom import CLASSROOM, OFF, Following, follow_link, qr_svg
from .dashboard import DASH, shown
from .outputs import FOLLOW, skip, warn
from .session import Session
from .status import live_status, race_status, refused_status


def tab_id(request) -> str | None:
    """The browser tab's id among a presentation's followers: its Gradio session hash, which its
    polls of the mark route send (None without a browser: Following picks a random one)."""
    return getattr(request, "session_hash", None)


def follow_mark(sess: Session | None) -> str:
    """Where a tab stands for the follow timer: following (the code and the latest frame, or that
    it ended), presenting, or neither. A change of mark is what redraws a follower."""
    if sess is not None and sess.following is not None:
        return CLASSROOM.mark(sess.following)   # asking counts as following (the presenter's count)
    return "presenting" if sess is not None and sess.presenting is not None else OFF


def break_away(sess: Session | None) -> Session:
    """The visitor's own race again: a follower stops following (no longer counted)."""
    sess = sess or Session()
    if sess.following is not None:
        CLASSROOM.leave(sess.following)
        sess.following = None
    return sess


class ClassroomEvents:
    """Present, Stop presenting, Follow and the follow timer's events (outputs: PRESENT, FOLLOW,
    TICK), keyed by `self.out` as the rest of handlers.Live."""
    out: dict

    def on_present(self, sess: Session | None, request: gr.Request = None) -> dict:
        """Present: this session's race under a short code that a class follows (the same code
        again while it presents). Outputs: PRESENT, the code first (the API's answer)."""
        o = self.out
        sess = break_away(sess)
        if sess.presenting is None:
            sess.presentation = CLASSROOM.open(tab_id(request))
            sess.presentation.publish(sess.view() if sess.started else None,
                                      race_status(sess) if sess.started else "", sess.prompt)
        code = sess.presentation.code
        link, note = follow_link(getattr(request, "headers", None), code, CLASSROOM.bind_host)
        howto = (f'<div class="follow-qr">{qr_svg(link)}</div><p>Students scan this, open <a href="{html.escape(link)}" '
                 f'target="_blank">{html.escape(link)}</a>, or type the code <b>{code}</b> and press <b>Follow</b>.</p>'
                 + (f"<p><i>{html.escape(note)}</i></p>" if note else ""))
        return {o["follow_code"]: code, o["follow_link"]: howto,
                o["status"]: live_status(sess), o["session"]: sess, o["follow_timer"]: gr.Timer(active=True)}

    def on_unpresent(self, sess: Session | None) -> dict:
        """Stop presenting: the followers are told, and keep the last cycle. Outputs: PRESENT."""
        o = self.out
        if sess is not None and sess.presentation is not None:
            CLASSROOM.close(sess.presentation, "the presenter stopped presenting")
            sess.presentation = None
        return {o["follow_code"]: "", o["follow_link"]: "", o["status"]: live_status(sess), o["session"]: sess,
                o["follow_timer"]: gr.Timer(active=False)}

    def on_follow(self, sess: Session | None, code, panels=None, request: gr.Request = None) -> dict:
        """Follow: this tab mirrors the presentation under `code` (its latest cycle now, each new
        one as it comes), decoding nothing; its own race, if any, waits for a break-away. A bad or
        ended code: a warning and the status line say why, nothing changes. Outputs: FOLLOW."""
        o = self.out
        try:
            pres = CLASSROOM.find(code)
        except UserError as e:
            warn(str(e))
            return {**skip(FOLLOW, o), o["status"]: refused_status(sess, str(e))}
        sess = sess or Session()
        if sess.following is None or sess.following.code != pres.code:
            break_away(sess)
            tab = tab_id(request)
            sess.following = Following(pres.code, tab) if tab else Following(pres.code)
        sess.following.seen = -1
        return {**self._followed(sess, pres, panels), o["follow_timer"]: gr.Timer(active=True)}

    def on_follow_tick(self, sess: Session | None) -> dict:
        """Where the tab stands, as a mark (whose change brings on_follow_frame) and the status
        line: asked by a tab that just followed (its timer then asks the mark route) and each
        second by a presenter's tab, whose line counts its followers. Cheap: two plain values, no
        component update (Gradio rebuilds a component's config for every update it gets, a skip
        included: ~1 ms each). Outputs: TICK."""
        o = self.out
        if sess is not None and sess.following is not None:
            return {o["follow_mark"]: follow_mark(sess), o["status"]: live_status(sess)}
        quiet = sess is None or sess.presenting is None or sess.lock.locked()   # a Step will say where it stands
        return {o["follow_mark"]: follow_mark(sess), o["status"]: gr.skip() if quiet else live_status(sess)}

    def on_follow_frame(self, sess: Session | None, panels=None) -> dict:
        """The follow mark changed: a follower gets the presenter's new cycle (nothing is sent if it
        has it), or is told the presentation ended (its timer stops). A tab that no longer follows
        gets nothing: its timer asks nothing of the server meanwhile (OFF), and stopping it here
        could undo a Follow pressed while this answer was on its way. Outputs: FOLLOW."""
        o = self.out
        if sess is None or sess.following is None:
            return skip(FOLLOW, o)
        try:
            pres = CLASSROOM.find(sess.following.code)
        except UserError:
            return {**skip(FOLLOW, o), o["status"]: live_status(sess), o["follow_timer"]: gr.Timer(active=False)}
        return self._followed(sess, pres, panels)

    def _followed(self, sess: Session, pres, panels) -> dict:
        """A follower brought up to the presentation's latest frame (nothing sent if it has it)."""
        o, f = self.out, sess.following
        frame = pres.poll(f.id)
        if frame.version == f.seen:
            return skip(FOLLOW, o)
        f.seen = frame.version
        want = shown(panels)
        drawn = frame.outputs([n for n in DASH if n in want])
        new_prompt = frame.prompt is not None and frame.prompt != f.prompt
        f.prompt = frame.prompt if new_prompt else f.prompt
        return {o["session"]: sess, o["status"]: live_status(sess), o["follow_timer"]: gr.skip(),
                o["prompt"]: frame.prompt if new_prompt else gr.skip(),
                **{o[n]: drawn[n] if n in drawn else gr.skip() for n in DASH}}

    def on_open(self, sess: Session | None, panels=None, request: gr.Request = None) -> dict:
        """A page opened at /?follow=CODE follows at once; any other page: nothing. Outputs: FOLLOW."""
        code = (getattr(request, "query_params", None) or {}).get("follow")
        return self.on_follow(sess, code, panels, request) if code else skip(FOLLOW, self.out)
