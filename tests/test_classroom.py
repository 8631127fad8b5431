"""Classroom mode (ui/classroom.py): a presenter's race followed by a class. Codes, the follow
link, one render per cycle for every follower, break-away and return, a presentation's end, and
only the presenter driving; then the same over HTTP against the real server, where the followers'
polls answer while a decode holds the only decoding slot. Every wait is bounded."""
from __future__ import annotations

import threading
import time
from types import SimpleNamespace

import gradio as gr
import pytest

import viz
from eagle2.errors import UserError
from ui import classroom, handlers
from ui.classroom import ALPHABET, CODE_LEN, Classroom, Presentation, follow_link
from ui.dashboard import DASH, OPEN
from ui.model import MODEL
from ui.page import launch, tab_closed
from ui.screenshot import free_port
from ui.session import Session
from page_controls import STEP_API, ui
from ui import outputs
from ui.status import live_status

SKIP = type(gr.skip())
live = handlers.Live()
SETTINGS = dict(policy="eagle2", compare="static", total_tokens=8, depth=3, top_k=4, max_new_tokens=40)
FOLLOW_API = [n for n in outputs.FOLLOW if n != "session"]
WAIT = 90.0


@pytest.fixture(scope="module")
def tiny(tiny_target):
    """The page's model: a tiny random Llama with a random head (a Step takes milliseconds)."""
    from eagle2.model.loading import load_bundle
    folder, _ = tiny_target("classroom")
    bundle = load_bundle(target=str(folder), head="random")
    before = MODEL.loading
    MODEL.set(bundle)
    yield bundle
    MODEL.loading = before


def step(sess, prompt="w3 w5 w9"):
    return live.on_step(sess, prompt, *ui(**SETTINGS), OPEN)


def cycle_of(status: str) -> int:
    return int(status.split("cycle ")[1].split(" ")[0])


def test_codes_are_random_well_formed_and_found_forgivingly():
    room = Classroom(cap=1000)
    codes = [room.open().code for _ in range(300)]
    assert len(set(codes)) == 300
    assert all(len(c) == CODE_LEN and set(c) <= set(ALPHABET) for c in codes)
    c = codes[7]
    assert room.find(f"  {c.lower()[:3]} {c.lower()[3:]} ").code == c          # spaces and case ignored
    for bad, says in (("", "Type the presenter's code"), ("AB", "is not a presentation code"),
                      ("0O0O0O", "is not a presentation code"), ("ZZZZZZ", "No presentation has the code")):
        with pytest.raises(UserError, match=says):
            room.find(bad)
    room.close(room.find(c), "the presenter left")
    with pytest.raises(UserError, match="has ended .the presenter left"):
        room.find(c)


def test_old_presentations_make_room_and_follower_memory_is_bounded(monkeypatch):
    room = Classroom(cap=3)
    first = room.open()
    later = [room.open() for _ in range(3)]
    assert first.ended and not any(p.ended for p in later)
    monkeypatch.setattr(classroom, "MAX_FOLLOWERS", 50)
    p = Presentation("ABCDEF")
    for i in range(80):
        p.poll(f"f{i}")
    assert len(p._polls) == 50 and p.following() == 50
    now = time.monotonic()
    monkeypatch.setattr(classroom.time, "monotonic", lambda: now + classroom.FOLLOWING_S + 1)
    assert p.following() == 0 and not p._polls                   # gone quiet: no longer counted, not kept


def test_the_follow_link_is_an_address_the_class_can_reach(monkeypatch):
    monkeypatch.setattr(classroom, "lan_address", lambda: "192.168.1.20")
    local = {"host": "127.0.0.1:7860", "referer": "http://127.0.0.1:7860/"}
    link, note = follow_link(local, "K7P2QX", "127.0.0.1")
    assert link == "http://127.0.0.1:7860/?follow=K7P2QX" and "--host 0.0.0.0" in note
    assert follow_link(local, "K7P2QX", "0.0.0.0") == ("http://192.168.1.20:7860/?follow=K7P2QX", None)
    space = {"host": "0.0.0.0:7860", "referer": "https://someone-eagle2.hf.space/?__theme=dark",
             "x-forwarded-proto": "https"}
    assert follow_link(space, "K7P2QX", "0.0.0.0") == ("https://someone-eagle2.hf.space/?follow=K7P2QX", None)
    proxied = {"host": "10.0.0.5:7860", "x-forwarded-host": "class.example.org", "x-forwarded-proto": "https"}
    assert follow_link(proxied, "K7P2QX", "0.0.0.0")[0] == "https://class.example.org/?follow=K7P2QX"
    monkeypatch.setattr(classroom, "lan_address", lambda: None)
    assert follow_link(local, "K7P2QX", "0.0.0.0")[1]          # no LAN address: the note says what to do


def test_followers_mirror_the_presenter_from_one_render(tiny, monkeypatch):
    """Five followers of one presenter: each new cycle reaches every follower (cycle N on its
    status line, the presenter's prompt in its prompt box), the tree figure is built once for all
    of them and sent as the same serialised figure, a follower that has the latest cycle gets
    nothing, and the presenter's status line counts them."""
    pres = live.on_present(None)
    code, sess = pres["follow_code"], pres["session"]
    assert pres["follow_timer"].active and f"Presenting **{code}** · 0 following" in pres["status"]
    assert "<svg" in pres["follow_link"] and f"/?follow={code}" in pres["follow_link"]   # a QR code and the link
    followers = [live.on_follow(None, code, OPEN) for _ in range(5)]
    assert all("Waiting for the presenter's first" in f["status"] for f in followers)
    fs = [f["session"] for f in followers]
    assert all(isinstance(f, Session) and f.following.code == code for f in fs)
    out = step(sess)
    assert "cycle 1 " in out["status"] and f"Presenting **{code}** · 5 following" in out["status"]
    marks = [live.on_follow_tick(f) for f in fs]                   # each second: two plain values
    assert all(m["follow_mark"] == marks[0]["follow_mark"] and m["follow_mark"].startswith(f"{code}:") for m in marks)
    assert all("cycle 1 " in m["status"] for m in marks)
    built = []
    real = viz.tree_figure
    monkeypatch.setattr(viz, "tree_figure", lambda *a, **k: built.append(1) or real(*a, **k))
    frames = [live.on_follow_frame(f, OPEN) for f in fs]             # the new mark: the frame
    assert len(built) == 2                     # one render for the class: the tree and the comparison tree
    assert all(f"cycle 1 " in t["status"] and f"Following **{code}**" in t["status"] for t in frames)
    assert all(t["prompt"] == "w3 w5 w9" for t in frames)
    assert all(t["tree"] is frames[0]["tree"] for t in frames)        # the same serialised figure
    assert all(isinstance(t[n], SKIP) for t in frames for n in DASH if n not in OPEN and n in handlers.PANELS)
    again = live.on_follow_frame(fs[0], OPEN)
    assert all(isinstance(v, SKIP) for v in again.values())          # nothing new: nothing sent
    assert live.on_follow_tick(fs[0])["follow_mark"] == marks[0]["follow_mark"]   # and the mark stays
    step(sess)
    assert live.on_follow_tick(fs[0])["follow_mark"] != marks[0]["follow_mark"]   # a new cycle: a new mark
    t = live.on_follow_frame(fs[0], OPEN)
    assert "cycle 2 " in t["status"] and isinstance(t["prompt"], SKIP)  # same prompt: the box is left alone
    beat = live.on_follow_tick(sess)                                 # the presenter's tick: the count
    assert "5 following" in beat["status"] and beat["follow_mark"] == "presenting"


def test_only_the_presenter_drives(tiny):
    """A follower's Step, Run, Reset and Stop run or change its own session only; the presenter's
    race stays where it was, and goes on at its next Step."""
    pres = live.on_present(None)
    sess = pres["session"]
    step(sess)
    f = live.on_follow(None, pres["follow_code"], OPEN)["session"]
    handlers.on_stop(f)
    own = step(f)                                                   # a break-away: its own race
    assert own["session"] is not sess and isinstance(own["session"], Session)
    assert cycle_of(own["status"]) == 1 and "Presenting" not in own["status"]
    ran = live.on_run(live.on_follow(None, pres["follow_code"], OPEN)["session"], "w4 w4", *ui(**SETTINGS), OPEN)
    assert ran["session"] is not sess
    live.on_reset(live.on_follow(None, pres["follow_code"], OPEN)["session"])
    assert cycle_of(live_status(sess)) == 1 and sess.presentation is not None
    assert cycle_of(step(sess)["status"]) == 2


def test_a_followers_refused_step_keeps_it_following(tiny):
    """A Step that does not run (an empty prompt) is not a break-away: the tab still follows, and
    still counts among the followers."""
    pres = live.on_present(None)
    code, sess = pres["follow_code"], pres["session"]
    step(sess)
    f = live.on_follow(None, code, OPEN)["session"]
    with pytest.warns(UserWarning, match="prompt is empty"):
        out = live.on_step(f, "  ", *ui(**SETTINGS), OPEN)
    assert isinstance(out["session"], SKIP) and f.following.code == code
    assert f"Following **{code}**" in out["status"] and "prompt is empty" in out["status"]
    assert "1 following" in live_status(sess)


def test_break_away_and_come_back_keeps_the_own_race(tiny):
    pres = live.on_present(None)
    code, sess = pres["follow_code"], pres["session"]
    step(sess)
    f = live.on_follow(None, code, OPEN)["session"]
    mine = step(f, "w11 w12")["session"]                             # break away with its own prompt
    assert cycle_of(live_status(mine)) == 1
    back = live.on_follow(mine, code, OPEN)                          # Follow: the presenter's race again
    assert "cycle 1 " in back["status"] and "Following" in back["status"] and back["session"] is mine
    again = step(back["session"], "w11 w12")["session"]               # its own race goes on
    assert again is mine and cycle_of(live_status(mine)) == 2


def test_a_presentation_ends_and_its_followers_are_told(tiny):
    """Stop presenting, or the presenter's tab closing: the followers' next poll says so and stops
    their timer; they keep the last cycle; the code no longer follows."""
    for end in ("stop", "close"):
        pres = live.on_present(None, SimpleNamespace(session_hash=f"tab-{end}", headers={}))
        code, sess = pres["follow_code"], pres["session"]
        step(sess)
        f = live.on_follow(None, code, OPEN)["session"]
        if end == "stop":
            out = live.on_unpresent(sess)
            assert out["follow_code"] == "" and out["follow_timer"].active is False and sess.presentation is None
        else:
            tab_closed(SimpleNamespace(session_hash="tab-other"))   # another tab: it goes on
            assert live.on_follow_tick(f)["follow_mark"] != f"{code}:ended"
            tab_closed(SimpleNamespace(session_hash="tab-close"))
        assert live.on_follow_tick(f)["follow_mark"] == f"{code}:ended"
        t = live.on_follow_frame(f, OPEN)
        assert "has ended" in t["status"] and t["follow_timer"].active is False
        assert isinstance(t["tree"], SKIP)                           # the last cycle stays on screen
        assert handlers.live_view(f) is None or handlers.live_view(f).steps
        with pytest.warns(UserWarning, match="has ended"):
            refused = live.on_follow(None, code, OPEN)
        assert "has ended" in refused["status"] and isinstance(refused["session"], SKIP)


def test_a_page_opened_with_a_follow_code_follows(tiny):
    pres = live.on_present(None)
    step(pres["session"])
    opened = live.on_open(None, OPEN, SimpleNamespace(query_params={"follow": pres["follow_code"]}))
    assert "cycle 1 " in opened["status"] and opened["session"].following is not None
    plain = live.on_open(None, OPEN, SimpleNamespace(query_params={}))
    assert all(isinstance(v, SKIP) for v in plain.values())


# ---------------------------------------------------------------------------------------------
# Over HTTP, against the real server
# ---------------------------------------------------------------------------------------------
def client(url):
    from gradio_client import Client
    return Client(url, verbose=False, download_files=False)


def mark_of(url, code, tab) -> str:
    """The classroom's mark route, as a follower's tab asks it (ui/tabs/live.py FOLLOW_TICK_JS)."""
    import httpx
    r = httpx.get(url.rstrip("/") + classroom.MARK_ROUTE, params={"code": code, "tab": tab}, timeout=WAIT)
    r.raise_for_status()
    return r.json()["mark"]


def test_the_mark_route_answers_a_followers_tab_from_memory(tiny):
    """The route a following tab polls: the latest frame's mark while its session follows (and it
    counts among the followers), OFF once it broke away (whatever the tab still asks) or for a
    malformed query, "CODE:ended" once the presentation ended; Follow again counts it again."""
    import asyncio
    pres = live.on_present(None)
    code, sess = pres["follow_code"], pres["session"]
    f = live.on_follow(None, code, OPEN, SimpleNamespace(session_hash="tab-7"))["session"]
    assert f.following.id == "tab-7"
    ask = lambda c, t: asyncio.run(classroom.mark_route(c, t))["mark"]   # noqa: E731
    first = ask(code.lower(), "tab-7")
    assert first == live.on_follow_tick(f)["follow_mark"] and first.startswith(f"{code}:")
    step(sess)
    assert ask(code, "tab-7") != first and "1 following" in live_status(sess)
    step(f, "w2 w2")                                                   # a break-away
    assert ask(code, "tab-7") == classroom.OFF and "0 following" in live_status(sess)
    live.on_follow(f, code, OPEN, SimpleNamespace(session_hash="tab-7"))   # and back, from the same tab
    assert ask(code, "tab-7").startswith(f"{code}:") and "1 following" in live_status(sess)
    for bad in (("", "tab-7"), (code, ""), ("0O0O0O", "tab-7"), ("x" * 10_000, "t"), (code + "Z", "tab-7")):
        assert ask(*bad) == classroom.OFF
    live.on_unpresent(sess)
    assert ask(code, "tab-7") == f"{code}:ended"


@pytest.mark.slow
def test_a_class_follows_over_http_and_polls_never_wait_behind_a_decode(tiny, monkeypatch):
    """One decoding slot (concurrency 1): a presenter Steps and Presents; four followers follow
    by code and see each new cycle (/follow_tick, then /follow_frame, as the page's follow timer
    and follow mark call them); while another visitor's Step holds the only
    slot, the followers' polls still answer (their own lane); a follower's /step is its own race;
    a bad code is a message; Stop presenting reaches them; the server answers after."""
    held, release, real = threading.Event(), threading.Event(), handlers.do_steps

    def steps(sess, prompt, *a, **k):           # the HOLD visitor's Step keeps the slot until released
        if prompt == "HOLD":
            held.set()
            release.wait(WAIT)
        return real(sess, prompt, *a, **k)

    monkeypatch.setattr(handlers, "do_steps", steps)
    port = free_port()
    demo = launch("127.0.0.1", port, concurrency=1, block=False)
    url = f"http://127.0.0.1:{port}/"
    try:
        p = client(url)
        first = p.submit("w3 w5 w9", *ui(**SETTINGS), api_name="/step").result(timeout=WAIT)
        code = p.submit(api_name="/present").result(timeout=WAIT)[0]
        assert len(code) == CODE_LEN
        fs = [client(url) for _ in range(4)]
        seen = [dict(zip(FOLLOW_API, f.submit(code, api_name="/follow").result(timeout=WAIT))) for f in fs]
        assert all("cycle 1 " in s["status"] and code in s["status"] for s in seen), seen
        assert cycle_of(dict(zip(STEP_API, first))["status"]) == 1

        other = client(url).submit("HOLD", *ui(**SETTINGS), api_name="/step")
        assert held.wait(WAIT), "the other visitor's Step never started"
        stuck = p.submit("w3 w5 w9", *ui(**SETTINGS), api_name="/step")     # queued behind HOLD
        for f in fs:                                     # the slot is held: the followers still answer
            f.submit(api_name="/follow_tick").result(timeout=WAIT)
        assert not stuck.done()
        release.set()
        assert cycle_of(dict(zip(STEP_API, stuck.result(timeout=WAIT)))["status"]) == 2
        other.result(timeout=WAIT)

        for f in fs:                                     # the new cycle reaches every follower
            mark, status = f.submit(api_name="/follow_tick").result(timeout=WAIT)
            assert "cycle 2 " in status and mark.startswith(f"{code}:")
            out = dict(zip(FOLLOW_API, f.submit(api_name="/follow_frame").result(timeout=WAIT)))
            assert "cycle 2 " in out["status"] and out["tree"], out["status"]
        marks = [mark_of(url, code, f.session_hash) for f in fs]        # what a follower's tab asks each second
        assert all(m.startswith(f"{code}:") and m.split(":")[1].isdigit() for m in marks), marks
        own = dict(zip(STEP_API, fs[0].submit("w8 w9", *ui(**SETTINGS), api_name="/step").result(timeout=WAIT)))
        assert cycle_of(own["status"]) == 1 and code not in own["status"]            # its own race
        assert mark_of(url, code, fs[0].session_hash) == classroom.OFF               # its tab stops asking
        assert mark_of(url, "not a code", fs[1].session_hash) == classroom.OFF
        bad = dict(zip(FOLLOW_API, fs[1].submit("HJKM23", api_name="/follow").result(timeout=WAIT)))
        assert "No presentation has the code HJKM23" in bad["status"]
        nxt = dict(zip(STEP_API, p.submit("w3 w5 w9", *ui(**SETTINGS), api_name="/step").result(timeout=WAIT)))
        assert cycle_of(nxt["status"]) == 3                          # the presenter's race, untouched
        p.submit(api_name="/unpresent").result(timeout=WAIT)
        ended = dict(zip(FOLLOW_API, fs[2].submit(api_name="/follow_frame").result(timeout=WAIT)))
        assert "has ended (the presenter stopped presenting)" in ended["status"]
        assert mark_of(url, code, fs[3].session_hash) == f"{code}:ended"
        assert client(url).submit(api_name="/model_status").result(timeout=WAIT)    # still answering
    finally:
        release.set()
        demo.close()
