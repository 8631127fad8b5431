"""Memory per visitor is bounded: a session's decoders are freed when it is idle, when too many
sessions hold decoders, or when its tab closes; what the visitor did (the traces) stays usable,
and a Step says why it cannot go on."""
from __future__ import annotations

import math

import gradio as gr
import pytest

import ui.session as session_mod
from eagle2.errors import UserError
from ui.model import MODEL
from ui.page import build_app, end_session
from ui.session import LivePool, Session, Settings

pytestmark = pytest.mark.slow  # sessions stepping the real model (3-16 s each)

SMALL = dict(policy="eagle2", compare="static", total_tokens=8, depth=3, top_k=4, temperature=0.0,
             top_p=1.0, seed=0, max_new_tokens=8, side_by_side=True)


@pytest.fixture()
def pool(real_bundle, monkeypatch):
    MODEL.set(real_bundle)
    p = LivePool(cap=2, idle_s=3600)
    monkeypatch.setattr(session_mod, "POOL", p)
    return p


def stepped(bundle, prompt: str, ticks: int = 1) -> Session:
    s = Session()
    s.start(bundle, prompt, Settings(**SMALL))
    for _ in range(ticks):
        s.tick()
    return s


def held(s: Session) -> bool:
    return all(d.state.cache is not None and d.state.hcache is not None for d in s.decoders)


def test_beyond_the_cap_the_least_recently_used_session_is_freed(real_bundle, pool):
    a = stepped(real_bundle, "Name a colour.")
    b = stepped(real_bundle, "Name a fruit.")
    a.tick()                                   # a is now the more recently used
    c = stepped(real_bundle, "Name a city.")
    assert held(a) and held(c) and not held(b) and len(pool) == 2
    assert "least recently used" in b.released
    with pytest.raises(UserError, match="freed .* Reset"):
        b.tick()
    # what the visitor did stays: the view and the export still hold every cycle
    v = b.view()
    assert len(v.steps) == len(b.race.main.trace.steps) == 2 and b.export().steps
    # a new prompt starts afresh
    b.start(real_bundle, "Name a tree.", Settings(**SMALL))
    b.tick()
    assert held(b) and b.released is None


def test_idle_sessions_are_freed_but_not_one_mid_step(real_bundle, pool):
    a = stepped(real_bundle, "Count to three.")
    b = stepped(real_bundle, "Say hi.")
    pool.idle_s = 0.0
    b.lock.acquire()                          # b is in the middle of a Step
    try:
        assert pool.sweep() == 1
    finally:
        b.lock.release()
    assert not held(a) and "idle" in a.released and held(b)
    assert pool.sweep() == 1 and not held(b)


def test_a_session_gradio_deletes_is_freed(real_bundle, pool):
    """The page's session State hands a deleted value (its tab closed an hour ago) to end_session,
    which frees its decoders; a follower's own race too."""
    from ui.classroom import Following
    state = next(b for b in build_app(preload_trace=False).blocks.values()
                 if isinstance(b, gr.State) and b.delete_callback is end_session)
    assert state.time_to_live == math.inf          # an open tab keeps its session
    s = stepped(real_bundle, "What is two plus two?")
    end_session(None)                                    # a tab that never stepped: nothing
    assert held(s)
    end_session(s)
    assert not held(s) and "closed" in s.released and len(pool) == 0
    end_session(s)                                       # twice: harmless
    own = stepped(real_bundle, "Name a river.")
    own.following = Following("ABCDEF")
    end_session(own)
    assert not held(own) and len(pool) == 0


def test_a_tick_adds_only_its_own_cycles_to_the_series(real_bundle, pool, monkeypatch):
    """Session.view extends each decoder's series by the steps since the last view: over a run the
    series code touches every step once, not once per tick (which made a run quadratic)."""
    import eagle2.cycle.series as built   # where a series is built from steps
    seen = []
    real = built.verified
    monkeypatch.setattr(built, "verified", lambda st: seen.append(st) or real(st))
    sess = Session()
    sess.start(real_bundle, "Count to ten.", Settings(**{**SMALL, "max_new_tokens": 60}))
    views = []
    for _ in range(6):
        sess.tick()
        views.append(sess.view())
    total = sum(len(d.trace.steps) for d in sess.decoders)
    assert len(seen) == total                              # each step once, whatever the number of ticks
    assert len(set(map(id, seen))) == total
    fresh = [built.series(s["label"], d.trace.steps, s["role"]) for s, d in zip(views[-1].series, sess.decoders)]
    assert views[-1].series == fresh                       # the same figures as a rebuild from scratch
    assert views[0].series[0]["tokens"] != views[-1].series[0]["tokens"]   # an old view is not changed
