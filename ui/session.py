"""A browser session: it holds the engine's lockstep race (eagle2/decoding/race.py) and adds what
the page needs of it: settings read from the controls, Stop, a View to draw, an export with every
series, and a bound on the memory its decoders hold (LivePool)."""
from __future__ import annotations

import threading
import time
import weakref
from collections import OrderedDict

import viz
from eagle2 import config
from eagle2.decoding.race import ROLES, Race, RaceSettings
from eagle2.cycle.series import Series, extend_series
from eagle2.cycle.series import series as make_series
from eagle2.cycle.trace import Trace
from eagle2.devices import device_kind as engine_device_kind
from eagle2.errors import UserError
from eagle2.heap import trim_heap

from .model import MODEL
from .view import View

def device_kind(device: str | None = None) -> str:
    """'cuda' or 'cpu': the kind of `device`, by default the one the page's model was started for
    (app.py's --device). Read from the option string, so nothing asks torch."""
    d = MODEL.options.get("device") if device is None else device
    return engine_device_kind(d)


def defaults(device: str | None = None) -> RaceSettings:
    """The controls' initial values and the fallbacks for empty ones: what pays on that device."""
    return RaceSettings.for_device(device_kind(device))


class Settings(RaceSettings):
    """The race's settings, read from the page's controls."""

    @classmethod
    def from_ui(cls, policy, compare, total_tokens, depth, top_k, temperature, top_p, seed, max_new_tokens,
                side_by_side=True) -> "Settings":
        def as_int(v, name):
            try:
                f = float(v)
            except (TypeError, ValueError):
                raise UserError(f"{name} must be a whole number (got {v!r}).") from None
            if f != int(f):
                raise UserError(f"{name} must be a whole number (got {v!r}).")
            return int(f)
        d = defaults()
        s = cls(policy=str(policy or d.policy), compare=str(compare or d.compare),
                total_tokens=as_int(total_tokens, "Total tokens N"), depth=as_int(depth, "Depth"),
                top_k=as_int(top_k, "Top-k"), temperature=float(temperature or d.temperature),
                top_p=float(d.top_p if top_p is None else top_p),
                seed=as_int(d.seed if seed in (None, "") else seed, "Seed"),
                max_new_tokens=as_int(max_new_tokens, "Max new tokens"), side_by_side=bool(side_by_side))
        s.validate()
        return s


class Session:
    """One browser session: the engine's lockstep race (`race`), plus what the page needs of it.
    Its decoders' KV caches (about 30 MB at the default settings) are freed when it stays idle or
    when other sessions need the room (LivePool); its traces stay to be browsed, explained and
    exported. `lock` is held through a Step: one at a time per session, and none freed mid-Step."""

    def __init__(self):
        self.race = Race()
        self.lock = threading.Lock()
        self.running = False          # a Run goes on: its timer's next tick steps (ui/handlers.py on_run_tick)
        self.stop_requested = False   # Stop pressed during a Run: the tick after the cycle in progress says so
        self.presentation = None      # the ui.classroom.Presentation this session's race is published to
        self.following = None         # the ui.classroom.Following the tab shows instead of this race (None: its own)
        self.released: str | None = None   # why its decoders were freed, once they are
        self._series: dict[int, tuple] = {}   # decoder index -> (decoder, its series, steps in it)
        # the page's own seconds in this run, counted in no decoder's time: the comparison's preview
        # and the race's bookkeeping in each tick, and drawing the dashboard (Live.live adds it)
        self.page_s = 0.0

    @property
    def presenting(self):
        """The presentation this race is published to, while it lasts and the tab shows this race
        (a presenter that follows another presentation publishes nothing meanwhile); else None."""
        p = self.presentation
        return None if p is None or p.ended or self.following is not None else p

    @property
    def started(self) -> bool:
        return self.race.started

    @property
    def finished(self) -> str | None:
        return self.race.finished

    @property
    def prompt(self) -> str | None:
        return self.race.prompt

    @property
    def decoders(self):
        return self.race.decoders

    def start(self, bundle, prompt: str, s: RaceSettings) -> None:
        self.race.start(bundle, prompt, s)
        self.released = None
        self.page_s = 0.0
        pool().touch(self)

    def tick(self) -> None:
        if self.released:
            raise UserError(f"This session's decoders were freed {self.released}, to make room for other "
                            "visitors. Its cycles are still here to browse, explain and export; press Reset "
                            "(or edit the prompt) to start again.")
        pool().touch(self)
        t0, own = time.perf_counter(), self._decoders_wall()
        self.race.tick()
        self.page_s += (time.perf_counter() - t0) - (self._decoders_wall() - own)

    def _decoders_wall(self) -> float:
        return sum(d.wall for d in self.decoders if d is not None and d.started)

    def release(self, why: str) -> bool:
        """Free the decoders' KV caches (a step in progress keeps them: False)."""
        if not self.started or self.released or not self.lock.acquire(blocking=False):
            return False
        try:
            for d in self.decoders:
                d.release()
            self.released = why
        finally:
            self.lock.release()
        return True

    def __deepcopy__(self, memo):  # gr.State copies its value; a session is never shared
        return self

    def view(self) -> View:
        """What the dashboard shows now. Each decoder's series is extended by the cycles since the
        last view (a tick costs the same at cycle 5 and at cycle 500); the view gets copies."""
        r = self.race
        series = []
        for i, (d, label, role) in enumerate(zip(r.decoders, r.labels(), ROLES)):
            cached = self._series.get(i)
            if cached is None or cached[0] is not d:   # a new run (Reset, another prompt)
                cached = self._series[i] = (d, make_series(label, [], role), 0)
            _, s, done = cached
            steps = d.trace.steps
            extend_series(s, steps, done)
            self._series[i] = (d, s, len(steps))
            s["label"] = label                           # a policy changed mid-run renames it
            series.append(Series(**{k: list(v) if isinstance(v, list) else v for k, v in s.items()}))
        return View(steps=list(r.main.trace.steps), series=series, previews=dict(r.previews),
                    meta=r.main.trace.meta, source="live", greedy=r.main.sampling.greedy,
                    lossy={r.labels()[1]: viz.lossy_summary(r.cmp.trace.steps)}, page_s=self.page_s)

    def export(self) -> Trace:
        """The main decoder's trace, with the other decoders' series and the previews in meta."""
        return self.race.export()


class LivePool:
    """The sessions whose decoders hold memory, least recently used first. Touching one (a start, a
    Step) frees the least recently used others beyond `cap`; a sweeper thread frees those idle for
    more than `idle_s` seconds. Weak references: a session Gradio has dropped is not kept alive.

    Why: a class or a public Space opens many sessions, and a closed tab's state stays with Gradio
    for an hour (ui/page.py end_session frees it then); without this the server's memory grows by
    the decoders of every visitor."""

    def __init__(self, cap: int, idle_s: float):
        self.cap, self.idle_s = max(1, cap), idle_s
        self._lock = threading.Lock()
        self._live: OrderedDict[int, tuple[weakref.ref, float]] = OrderedDict()
        self._sweeper: threading.Thread | None = None

    def __len__(self) -> int:
        with self._lock:
            return sum(1 for ref, _ in self._live.values() if ref() is not None)

    def touch(self, sess: Session) -> None:
        with self._lock:
            self._live[id(sess)] = (weakref.ref(sess), time.monotonic())
            self._live.move_to_end(id(sess))
            over = len(self._live) - self.cap
            victims = [ref() for ref, _ in list(self._live.values())[:max(0, over)]]
            if self._sweeper is None and self.idle_s > 0:
                self._sweeper = threading.Thread(target=self._sweep_forever, daemon=True, name="eagle2-session-sweeper")
                self._sweeper.start()
        self._free([v for v in victims if v is not None and v is not sess], "while it was the least recently used")

    def sweep(self) -> int:
        """Free the sessions idle for more than idle_s; how many were freed."""
        now = time.monotonic()
        with self._lock:
            idle = [ref() for ref, t in self._live.values() if now - t > self.idle_s]
        return self._free([s for s in idle if s is not None], f"after {self.idle_s / 60:.0f} minutes idle")

    def forget(self, sess) -> None:
        """A session Gradio deleted (its tab closed): free it now."""
        if isinstance(sess, Session):
            self._free([sess], "when its tab was closed")

    def _free(self, sessions: list, why: str) -> int:
        """Release `sessions` (one in the middle of a Step stays); how many were freed now."""
        n = 0
        for s in sessions:
            freed = s.release(why)
            if s.released:   # freed now, or before: no longer holding memory
                with self._lock:
                    self._live.pop(id(s), None)
            n += freed
        with self._lock:  # drop references to sessions already gone
            for k in [k for k, (ref, _) in self._live.items() if ref() is None]:
                del self._live[k]
        if n:
            trim_heap()
        return n

    def _sweep_forever(self) -> None:
        while True:
            time.sleep(max(1.0, min(60.0, self.idle_s / 4)))
            self.sweep()


# Sessions holding decoders at once, and the idle time after which a session's are freed (the
# configuration's max_sessions and session_idle_s: the figures are in benchmarks/classroom/).
POOL: LivePool | None = None
_pool_lock = threading.Lock()


def pool() -> LivePool:
    """The process's LivePool, built from the configuration on first use."""
    global POOL
    with _pool_lock:
        if POOL is None:
            cfg = config.current()
            POOL = LivePool(cfg.max_sessions, cfg.session_idle_s)
        return POOL
