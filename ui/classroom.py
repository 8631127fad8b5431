"""Classroom mode: one presenter's race on the projector, followed live by the class.

A presenter's session publishes every cycle it draws (its View, status line and prompt) to its
Presentation, under a short code. A follower's session holds a Following (the code, its id among
the followers, the cycle on screen); its own race waits behind it. Each second a follower's tab
asks the classroom's mark route (`GET /classroom/mark`, MARK_ROUTE): a few bytes answered from
memory, no Gradio event. Only when the mark changes does the tab call the page's follow_frame
event, which brings the presenter's dashboard as a Frame: rendered once per cycle for all of them,
each output built on first demand and its Plotly figure serialised once (forty followers cost one
render, not forty). A follower decodes nothing.

Codes come from `secrets` (6 characters out of 31: guessing one is one chance in about 900
million, and one code says nothing of another). A presentation ends when its presenter presses
Stop presenting or leaves (the tab closes); its followers are told and keep the last cycle.
"""
from __future__ import annotations

import secrets
import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import gradio as gr

from eagle2.errors import UserError

from .dashboard import At, Blank
from .view import View

ALPHABET = "ABCDEFGHJKLMNPQRSTUVWXYZ23456789"   # no 0/O or 1/I: read off a projector
CODE_LEN = 6
FOLLOWING_S = 5.0        # a follower counts as following while it polled within this many seconds
MAX_PRESENTATIONS = 256  # ended ones are kept (their followers are told) until this many are newer
MAX_FOLLOWERS = 10_000   # poll times (and break-aways) kept per presentation; the oldest go first
MARK_ROUTE = "/classroom/mark"   # a follower tab's poll: ?code=CODE&tab=ID -> {"mark": ...}
OFF = "off"              # the mark of a tab that neither follows nor presents
WAITING = "Waiting for the presenter's first **Step**."

_PLOT = gr.Plot(render=False)   # only to serialise figures: Gradio passes its PlotData through as is


def _shared(value):
    """An output value as every follower gets it: a Plotly figure serialised once (PlotData)."""
    return _PLOT.postprocess(value) if hasattr(value, "to_plotly_json") else value


class Frame:
    """One presenter cycle as the followers see it. Each output is built on first demand, once,
    under a lock (the followers polling after a Step wait for the first one's render and reuse it)."""

    def __init__(self, version: int, view: View | None, status: str, prompt: str | None):
        self.version, self.view, self.status, self.prompt = version, view, status, prompt
        self._at = At(view) if view is not None and view.steps else Blank()
        self._built: dict = {}
        self._lock = threading.Lock()

    def outputs(self, names) -> dict:
        """The dashboard's outputs named `names` (ui/dashboard.py DASH), keyed by name."""
        with self._lock:
            for n in names:
                if n not in self._built:
                    self._built[n] = _shared(getattr(self._at, n)())
            return {n: self._built[n] for n in names}


class Presentation:
    """A presenter's race as published to its followers. `tab`: the presenter's browser tab (its
    Gradio session hash), whose closing ends the presentation."""

    def __init__(self, code: str, tab: str | None = None):
        self.code, self.tab = code, tab
        self.frame = Frame(0, None, WAITING, None)
        self.ended: str | None = None   # why it ended, once it has
        self._polls: OrderedDict[str, float] = OrderedDict()   # follower id -> last poll (monotonic)
        self._left: OrderedDict[str, None] = OrderedDict()     # followers that broke away: their tabs' polls say OFF
        self._lock = threading.Lock()

    def publish(self, view: View | None, status: str, prompt: str | None) -> None:
        """The presenter drew a cycle (or started over: view None)."""
        self.frame = Frame(self.frame.version + 1, view, status if view is not None else WAITING, prompt)

    def poll(self, follower_id: str) -> Frame:
        """A follower's session asks for the latest frame (and so counts as following, again if it
        had broken away)."""
        with self._lock:
            self._left.pop(follower_id, None)
            self._count(follower_id)
        return self.frame

    def ask(self, follower_id: str) -> Frame | None:
        """A follower's tab asks for the latest frame (MARK_ROUTE); None once it broke away (its
        session no longer follows, whatever its tab still polls)."""
        with self._lock:
            if follower_id in self._left:
                return None
            self._count(follower_id)
        return self.frame

    def _count(self, follower_id: str) -> None:
        self._polls[follower_id] = time.monotonic()
        self._polls.move_to_end(follower_id)
        while len(self._polls) > MAX_FOLLOWERS:
            self._polls.popitem(last=False)

    def leave(self, follower_id: str) -> None:
        with self._lock:
            self._polls.pop(follower_id, None)
            self._left[follower_id] = None
            while len(self._left) > MAX_FOLLOWERS:
                self._left.popitem(last=False)

    def following(self) -> int:
        """Followers that polled within FOLLOWING_S (the older entries are dropped)."""
        cutoff = time.monotonic() - FOLLOWING_S
        with self._lock:
            while self._polls and next(iter(self._polls.values())) < cutoff:
                self._polls.popitem(last=False)
            return len(self._polls)

    def end(self, why: str) -> None:
        self.ended = self.ended or why


@dataclass(eq=False)
class Following:
    """What a session follows (ui/session.py Session.following): a presentation's code and this
    tab's id among its followers (the tab's Gradio session hash, which its polls of MARK_ROUTE
    send; a random one without a browser)."""
    code: str
    id: str = field(default_factory=lambda: secrets.token_hex(8))
    seen: int = -1                  # the frame version on screen
    prompt: str | None = None       # the presenter's prompt last put in the prompt box


def is_code(c: str) -> bool:
    """Whether `c` has a presentation code's form (CODE_LEN characters of ALPHABET)."""
    return len(c) == CODE_LEN and all(ch in ALPHABET for ch in c)


class Classroom:
    """Every presentation of this server, by code."""

    def __init__(self, cap: int = MAX_PRESENTATIONS):
        self.cap = cap
        self._by_code: OrderedDict[str, Presentation] = OrderedDict()
        self._lock = threading.Lock()
        self.bind_host: str | None = None   # the address the server listens on (ui/page.py launch)

    def open(self, tab: str | None = None) -> Presentation:
        """A new presentation under a fresh code, given from the browser tab `tab`."""
        with self._lock:
            code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LEN))
            while code in self._by_code:
                code = "".join(secrets.choice(ALPHABET) for _ in range(CODE_LEN))
            p = self._by_code[code] = Presentation(code, tab)
            while len(self._by_code) > self.cap:
                _, old = self._by_code.popitem(last=False)
                old.end("the server made room for newer presentations")
            return p

    def find(self, code) -> Presentation:
        """The presentation under `code` (spaces and case ignored); a UserError saying what is
        wrong for a code that is malformed, unknown or ended."""
        c = "".join(str(code or "").split()).upper().removeprefix("?FOLLOW=")
        if not c:
            raise UserError("Type the presenter's code (the 6 letters and digits on the projector), then press Follow.")
        if not is_code(c):
            raise UserError(f"{str(code).strip()[:40]!r} is not a presentation code: a code is {CODE_LEN} letters and "
                            "digits, as shown on the presenter's screen.")
        with self._lock:
            p = self._by_code.get(c)
        if p is None:
            raise UserError(f"No presentation has the code {c} on this server (check it on the projector).")
        if p.ended:
            raise UserError(f"The presentation {c} has ended ({p.ended}).")
        return p

    def leave(self, f: Following) -> None:
        """A follower breaks away: it no longer counts among the presentation's followers."""
        with self._lock:
            p = self._by_code.get(f.code)
        if p is not None:
            p.leave(f.id)

    def mark(self, f: Following, from_tab: bool = False) -> str:
        """Where a follower stands, as the follow mark: "CODE:VERSION" of the latest frame,
        "CODE:ended" once the presentation ended (or is unknown), OFF once it broke away (asked
        from its tab: its session may have stopped following while the tab still polls)."""
        try:
            p = self.find(f.code)
        except UserError:
            return f"{f.code}:ended"
        frame = p.ask(f.id) if from_tab else p.poll(f.id)
        return OFF if frame is None else f"{p.code}:{frame.version}"

    def close(self, p: Presentation | None, why: str) -> None:
        if p is not None:
            p.end(why)

    def tab_closed(self, tab: str | None) -> None:
        """The browser tab `tab` closed: the presentations given from it end."""
        if tab is None:
            return
        with self._lock:
            mine = [p for p in self._by_code.values() if p.tab == tab]
        for p in mine:
            p.end("the presenter left")


CLASSROOM = Classroom()


async def mark_route(code: str = "", tab: str = "") -> dict:
    """MARK_ROUTE: a follower's tab asks where its presentation stands, each second. Answered
    from memory on the server's event loop (a lock held for microseconds), never a Gradio event:
    forty tabs polling cost the presenter's Step next to nothing. A malformed query is OFF."""
    code, tab = str(code)[:16].strip().upper(), str(tab)[:64]
    if not is_code(code) or not tab:
        return {"mark": OFF}
    return {"mark": CLASSROOM.mark(Following(code, tab), from_tab=True)}


def qr_svg(link: str, px: int = 220) -> str:
    """The link as a QR code, inline SVG (a phone camera opens it from the projector)."""
    import qrcode
    import qrcode.image.svg
    svg = qrcode.make(link, image_factory=qrcode.image.svg.SvgPathImage, border=2).to_string(encoding="unicode")
    return svg[svg.index("<svg"):].replace("<svg ", f'<svg style="width:{px}px;height:{px}px" ', 1)


def lan_address() -> str | None:
    """This machine's first non-loopback IPv4 address (where the class reaches a laptop serving on
    0.0.0.0), read from the network interfaces; None if it has none."""
    import ipaddress

    import psutil
    for addrs in psutil.net_if_addrs().values():
        for a in addrs:
            if getattr(a.family, "name", "") != "AF_INET":
                continue
            ip = ipaddress.ip_address(a.address)
            if not (ip.is_loopback or ip.is_link_local or ip.is_unspecified):
                return a.address
    return None


def follow_link(headers, code: str, bind_host: str | None) -> tuple[str, str | None]:
    """The follow link for `code` and a note when students may not reach it. The page's own URL as
    the presenter's browser sees it (the Referer of the request, else its Host); a loopback
    address is replaced by this machine's LAN address when the server listens on every interface."""
    h = {k.lower(): v for k, v in dict(headers or {}).items()}
    ref = urlsplit(h.get("referer") or "")
    if ref.scheme in ("http", "https") and ref.netloc:
        scheme, netloc, path = ref.scheme, ref.netloc, ref.path or "/"
    else:
        scheme = (h.get("x-forwarded-proto") or "http").split(",")[0].strip()
        netloc, path = h.get("x-forwarded-host") or h.get("host") or "127.0.0.1", "/"
    host = urlsplit(f"//{netloc}").hostname or ""
    note = None
    if host in ("127.0.0.1", "localhost", "::1") or host.startswith("127."):
        lan = lan_address() if bind_host in ("0.0.0.0", "::") else None
        if lan:
            port = urlsplit(f"//{netloc}").port
            netloc = f"{lan}:{port}" if port else lan
        else:
            note = ("This address works on this computer only: to let a class follow, start the app with "
                    "--host 0.0.0.0 (a classroom network) or put it up as a Space.")
    return f"{scheme}://{netloc}{path.rstrip('/')}/?follow={code}", note
