"""The Live tab's status line: where a visitor's session stands (its own race, the presentation
it gives, or the one it follows), and why a Step did not run."""
from __future__ import annotations

from eagle2.errors import UserError

from .classroom import CLASSROOM, Following
from .session import Session


def live_status(sess: Session | None) -> str:
    if sess is not None and sess.following is not None:
        return follower_status(sess.following)
    if sess is None or not sess.started:
        return "Type a prompt (or pick an example) and press **Step**." + presenting_note(sess)
    return race_status(sess) + presenting_note(sess)


def race_status(sess: Session) -> str:
    """Where a started race stands: its cycle, tokens and decoders (what followers see too)."""
    m, labels = sess.race.main, sess.race.labels()
    done = f" · **finished** ({m.finished})" if m.finished else ""
    return (f"**Live** · cycle {m.cycle - 1} · {len(m.generated)} tokens · "
            f"{labels[0]} vs {labels[1]} vs plain{done}")


def presenting_note(sess: Session | None) -> str:
    """The presenter's line: its code and how many follow."""
    p = sess.presenting if sess is not None else None
    return f"  \nPresenting **{p.code}** · {p.following()} following" if p is not None else ""


def follower_status(f: Following) -> str:
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
    where the session stands if it has started or follows (the dashboard still shows that)."""
    note = f"**{msg}**"
    shown_before = sess is not None and (sess.following is not None or sess.started)
    return f"{live_status(sess)}  \n{note}" if shown_before else note
