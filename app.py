"""eagle2-viz: step through EAGLE-2 speculative decoding in the browser.

    python app.py                       # http://127.0.0.1:7860 (GRADIO_SERVER_NAME / _PORT honoured)
    python app.py --host 0.0.0.0 --port 8080 --device cuda
    python app.py --record-traces       # re-record the shipped traces in assets/traces/

Three decoders run the same prompt in lockstep, each timed on its own: the selected tree policy,
a comparison policy (default: EAGLE-1's static tree) and plain autoregressive decoding. Every
figure comes from viz/, so the app, notebooks and benchmark reports draw the same pictures.
The model loads once per process in a background thread; until it is ready the page shows a
recorded trace. Each browser session owns its decoders (gr.State); the shared model is read-only.
"""
from __future__ import annotations

import argparse
import json
import os
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import gradio as gr

import viz
from eagle2.errors import UserError
from eagle2.sampling import SamplingParams
from eagle2.trace import StepTrace, Trace
from viz.charts import series as make_series
from viz.tokens import TOKEN_CSS

ROOT = Path(__file__).resolve().parent
TRACES_DIR = ROOT / "assets" / "traces"
EXAMPLES_FILE = ROOT / "assets" / "prompts" / "examples.json"
DEFAULT_TRACE = "writing-greedy.json"
VIZ_KEY = "viz"   # trace meta key holding the comparison/plain series and the side-by-side previews

BUILTIN_EXAMPLES = {
    "Writing": ["Write a short poem about a city at night seen from a rooftop."],
    "Reasoning": ["If a week from tomorrow is Sunday, what day was yesterday?"],
    "Math": ["What is 7/8 as a percentage?"],
    "Code": ["Write a Python function that checks whether two strings are anagrams."],
    "Translation": ["Translate into French: 'The library opens at nine and closes at six.'"],
}

HELP = {
    "policy": "How the draft tree is built. eagle2: context-aware dynamic tree; static: EAGLE-1's fixed "
              "25-node shape.",
    "eagle2-auto": "eagle2-auto: EAGLE-2 whose N and depth are chosen every cycle from this machine's measured "
                   "costs (the N and depth sliders become caps); its first use measures the target's "
                   "verification times (seconds, cached).",
    "ddd": "ddd: EAGLE-2 that stops expanding when the beam's mass is low.",
    "dyspec": "dyspec: a greedy tree of sampled drafts.",
    "lantern": "lantern: static tree with relaxed acceptance — LOSSY (its first use builds a neighbour index, "
               "minutes on a CPU).",
    "compare": "Runs in lockstep with the selected policy; its tree for the same cycle is drawn alongside.",
    "total_tokens": "N: tokens the target verifies per cycle (root + the N-1 best drafted nodes).",
    "depth": "Expansion levels after the first: the tree reaches depth + 1.",
    "top_k": "Children per expanded node and the beam width (nodes expanded per level).",
    "temperature": "0 = greedy (output identical to plain decoding). Above 0: sampled, same distribution.",
    "top_p": "Nucleus sampling: keep the smallest set of tokens with this much probability.",
    "seed": "Seeds the samplers; applies when a prompt starts (Step on a new prompt, or Reset).",
    "max_new_tokens": "Generation stops here (or at end-of-sequence).",
}


# --------------------------------------------------------------------------------------------
# The model: loaded once per process, in a background thread
# --------------------------------------------------------------------------------------------
class ModelHolder:
    """Loads the Bundle once, in the background, and tells the page how it is going."""

    def __init__(self):
        self.bundle = None
        self.error: str | None = None
        self.warning: str | None = None
        self.stage = "not started"
        self.t0 = None
        self.elapsed = None
        self._done = threading.Event()
        self._thread: threading.Thread | None = None
        self.options: dict = {}

    def start(self, target=None, head=None, device="cpu", dtype=None) -> None:
        if self._thread is not None or self.bundle is not None:
            return
        self.options = dict(target=target, head=head, device=device, dtype=dtype)
        self.t0 = time.time()
        self.stage = "starting"
        self._thread = threading.Thread(target=self._load, name="eagle2-model-loader", daemon=True)
        self._thread.start()

    def _load(self) -> None:
        try:
            self.stage = "importing the engine (torch)"
            from eagle2.loading import load_bundle
            opts = dict(self.options)
            self.stage = "loading the target model and the draft head"
            try:
                b = load_bundle(**opts)
            except UserError as e:
                if not str(opts.get("device") or "cpu").startswith("cuda"):
                    raise
                self.warning = f"{e} Running on CPU instead."
                opts["device"], opts["dtype"] = "cpu", None
                b = load_bundle(**opts)
            self.stage = "warming up (token table)"
            b.token_texts([0])
            self.set(b)
        except Exception as e:  # shown in the page; the replay tab keeps working
            self.error = f"{type(e).__name__}: {e}" if not isinstance(e, UserError) else str(e)
            self.stage = "failed"
            self._done.set()

    def set(self, bundle) -> None:
        """Use an already loaded bundle (tests, the trace recorder)."""
        self.bundle = bundle
        self.stage = "ready"
        self.elapsed = time.time() - self.t0 if self.t0 else 0.0
        self._done.set()

    @property
    def ready(self) -> bool:
        return self.bundle is not None

    def get(self, timeout: float = 600.0):
        if self.bundle is None and self._thread is None and self.error is None:
            self.start(**self.options) if self.options else self.start()
        if not self._done.wait(timeout):
            raise UserError(f"The model is still loading ({self.stage}); try again in a moment.")
        if self.bundle is None:
            raise UserError(f"The model could not be loaded: {self.error}")
        return self.bundle

    def info_md(self) -> str:
        if self.bundle is not None:
            b = self.bundle
            dev = f"{b.device.type}" + (f" · {b.dtype}".replace("torch.", "") if b.dtype is not None else "")
            head = b.head_name
            if "random" in head:
                head += " — acceptance is near zero until a trained head is installed"
            warn = f'<span class="warnbadge">⚠ {self.warning}</span> ' if self.warning else ""
            return (f'{warn}<span class="okdot">●</span> <b>{b.name.split(" (")[0]}</b> on <b>{dev}</b> · '
                    f"draft head: {head} · ready in {self.elapsed or 0:.1f} s")
        if self.error:
            return f'<span class="errbadge">✖ model failed to load: {self.error}</span> — Replay still works.'
        el = time.time() - self.t0 if self.t0 else 0.0
        return (f'<span class="loaddot">●</span> Loading the model: {self.stage} … {el:.0f} s. '
                f"Meanwhile the page shows a recorded trace.")


MODEL = ModelHolder()


def policy_names() -> list[str]:
    from eagle2 import extra_policies
    return ["eagle2", "eagle2-auto", "static"] + [n for n in extra_policies.REGISTRY if n not in ("eagle2", "static")]


# --------------------------------------------------------------------------------------------
# Settings and the per-session lockstep run
# --------------------------------------------------------------------------------------------
@dataclass
class Settings:
    policy: str = "eagle2"
    compare: str = "static"
    total_tokens: int = 60
    depth: int = 5
    top_k: int = 10
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 64
    side_by_side: bool = True

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
        s = cls(policy=str(policy or "eagle2"), compare=str(compare or "static"),
                total_tokens=as_int(total_tokens, "Total tokens N"), depth=as_int(depth, "Depth"),
                top_k=as_int(top_k, "Top-k"), temperature=float(temperature or 0.0),
                top_p=float(1.0 if top_p is None else top_p), seed=as_int(0 if seed in (None, "") else seed, "Seed"),
                max_new_tokens=as_int(max_new_tokens, "Max new tokens"), side_by_side=bool(side_by_side))
        s.sampling().validate()
        s.validate_policy(s.policy)
        s.validate_policy(s.compare)
        return s

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed)

    def validate_policy(self, name: str) -> None:
        """Checks the name and tree parameters before any model work (eagle2-auto's caps obey
        eagle2's ranges; its measured costs come when a decoder builds it)."""
        from eagle2.policies import make_policy
        make_policy("eagle2" if name == "eagle2-auto" else name, total_tokens=self.total_tokens, depth=self.depth,
                    top_k=self.top_k)


class Session:
    """One browser session: three decoders on the same prompt, advanced in lockstep.

    A tick runs one cycle of the main decoder (after drafting the comparison policy's tree on the
    same context, for the side-by-side view), then steps the comparison and plain decoders until
    they have caught up with its token count. Each decoder's clock counts only its own work."""

    def __init__(self):
        self.lock = threading.Lock()
        self.prompt: str | None = None
        self.main = self.cmp = self.plain = None
        self.previews: dict[int, StepTrace] = {}
        self.settings: Settings | None = None
        self.stop_requested = False   # set by Stop; Run ends after the cycle in progress

    def __deepcopy__(self, memo):  # gr.State copies its value; a session is never shared
        return self

    @property
    def started(self) -> bool:
        return self.main is not None

    @property
    def finished(self) -> str | None:
        return self.main.finished if self.main is not None else None

    def start(self, bundle, prompt: str, s: Settings) -> None:
        from eagle2.decoder import Decoder
        if not isinstance(prompt, str) or not prompt.strip():
            raise UserError("The prompt is empty: type something first (or pick an example).")
        kw = dict(total_tokens=s.total_tokens, depth=s.depth, top_k=s.top_k)
        decs = [Decoder(bundle, s.policy, s.sampling(), max_new_tokens=s.max_new_tokens, **kw),
                Decoder(bundle, s.compare, s.sampling(), max_new_tokens=s.max_new_tokens, **kw),
                Decoder(bundle, "plain", s.sampling(), max_new_tokens=s.max_new_tokens)]
        for d in decs:
            d.start(prompt)
        self.main, self.cmp, self.plain = decs
        self.prompt, self.settings, self.previews = prompt, s, {}

    def apply(self, s: Settings) -> list[str]:
        """Settings changed mid-run: they apply from the next cycle. Returns notes for the user."""
        notes = []
        old = self.settings
        if old is None or s == old:
            return notes
        tree = (s.total_tokens, s.depth, s.top_k)
        for d, name, was in ((self.main, s.policy, old.policy), (self.cmp, s.compare, old.compare)):
            if (name, tree) != (was, (old.total_tokens, old.depth, old.top_k)):  # keep policy state otherwise
                d.set_policy(name, total_tokens=s.total_tokens, depth=s.depth, top_k=s.top_k)
        for d in (self.main, self.cmp, self.plain):
            d.sampling = s.sampling()
            if s.max_new_tokens > len(d.generated):
                d.max_new_tokens = s.max_new_tokens
            elif s.max_new_tokens != old.max_new_tokens:
                notes.append(f"{len(d.generated)} tokens are already generated; max new tokens stays "
                             f"{d.max_new_tokens}.")
        if s.seed != old.seed:
            notes.append("The new seed applies when a prompt starts (Reset).")
        self.settings = s
        return sorted(set(notes))

    def tick(self) -> None:
        m = self.main
        if m.finished is not None:
            return
        if self.settings.side_by_side:
            nxt = m.cycle
            pv = m.preview(self.cmp.policy)  # the comparison's own policy object: eagle2-auto keeps what it learnt
            pv.cycle = nxt  # the cycle whose context it shares (the engine numbers it one ahead)
            self.previews[nxt] = pv
        m.step()
        goal = len(m.generated)
        for d in (self.cmp, self.plain):
            while d.finished is None and len(d.generated) < goal:
                d.step()

    def labels(self) -> tuple[str, str, str]:
        a, b = self.main.policy_name, self.cmp.policy_name
        return a, (b if b != a else f"{b} (compare)"), "plain"

    def view(self) -> "View":
        la, lb, lc = self.labels()
        series = [make_series(la, self.main.trace.steps, "main"),
                  make_series(lb, self.cmp.trace.steps, "compare"),
                  make_series(lc, self.plain.trace.steps, "plain")]
        return View(steps=list(self.main.trace.steps), series=series, previews=dict(self.previews),
                    meta=self.main.trace.meta, source="live", greedy=self.main.sampling.greedy,
                    lossy={lb: viz.lossy_summary(self.cmp.trace.steps)})

    def export(self) -> Trace:
        """The main decoder's trace, with the other decoders' series and the previews in meta."""
        v = self.view()
        meta = dict(self.main.trace.meta)
        meta[VIZ_KEY] = {"series": v.series[1:], "previews": [p.to_dict() for p in self.previews.values()],
                         "compare_policy": self.cmp.policy_name}
        return Trace(meta=meta, steps=list(self.main.trace.steps))


# --------------------------------------------------------------------------------------------
# What a dashboard shows: a live session or a loaded trace
# --------------------------------------------------------------------------------------------
@dataclass
class View:
    steps: list
    series: list
    previews: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)
    source: str = "live"
    greedy: bool = True
    lossy: dict = field(default_factory=dict)   # other decoders' lossy_summary (live only)

    def __deepcopy__(self, memo):  # read-only once built: sessions may share one
        return self

    @classmethod
    def from_trace(cls, tr: Trace, source: str) -> "View":
        if not tr.steps:
            raise UserError("This trace has no steps.")
        label = tr.steps[0].policy
        series = [make_series(label, tr.steps, "main")]
        previews = {}
        extra = tr.meta.get(VIZ_KEY) or {}
        try:
            for s in extra.get("series", []):
                if isinstance(s, dict) and {"label", "tokens", "wall_s", "forwards", "accepted"} <= set(s):
                    series.append(s)
            for d in extra.get("previews", []):
                p = StepTrace.from_dict(d)
                previews[p.cycle] = p
        except (TypeError, ValueError, KeyError, AttributeError):
            previews = {}  # optional extras: a trace without them still replays
        temp = (tr.meta.get("sampling") or {}).get("temperature", 0.0) or 0.0
        return cls(steps=list(tr.steps), series=series, previews=previews, meta=tr.meta, source=source,
                   greedy=float(temp) == 0.0)

    @property
    def drafted(self) -> list[int]:
        return [s.cycle for s in self.steps if s.tree is not None]

    def step_at(self, cycle: int | None):
        dr = self.drafted
        if not dr:
            return None
        c = dr[-1] if cycle is None or cycle not in dr else cycle
        return next(s for s in self.steps if s.cycle == c)


def cut_series(s: dict, tokens: int) -> dict:
    """A series up to the first cycle that reached `tokens` tokens."""
    n = 0
    for n, t in enumerate(s["tokens"], 1):
        if t >= tokens:
            break
    return viz.charts.truncate(s, n)


# --------------------------------------------------------------------------------------------
# Dashboard: the same components and rendering in the Live and Replay tabs
# --------------------------------------------------------------------------------------------
N_DASH = 11


def render(view: View | None, cycle=None, colour_by="path value", show_dropped=False) -> list:
    """All dashboard outputs for a view, at a cycle (None = the latest)."""
    cb = "prob" if str(colour_by).startswith("draft") or colour_by == "prob" else "value"
    if view is None or not view.steps:
        e = viz.empty_figure
        return ["", viz.token_stream_html([]), e("Press Step to draft the first tree.", 460),
                e("The comparison tree appears here.", 460), e("", 300), e("", 300), e("", 300), e("", 300),
                e("", 300), viz.cycle_table([]), gr.Slider(minimum=0, maximum=1, value=0, interactive=False)]
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
    return [viz.metrics_html(m, lossy),
            viz.token_stream_html(view.steps, highlight=st.cycle if (st and cycle not in (None, 0)) else None),
            tree, cmp, viz.race_chart(allser), viz.speedup_chart(main, others), viz.acceptance_histogram(allser),
            viz.calibration_chart(steps), viz.depth_chart(allser), viz.cycle_table(steps), slider]


def _slider_kw(upd) -> dict:
    return {k: getattr(upd, k) for k in ("minimum", "maximum", "value", "interactive")}


def build_dashboard(prefix: str, init: list | None = None) -> list:
    """Create the dashboard components in the current layout context, showing `init` (render()'s
    output) from the start; returns them in render order."""
    v = init or render(None)
    metrics = gr.HTML(v[0], elem_id=f"{prefix}-metrics", elem_classes=["metricsbox"])
    tokens = gr.HTML(v[1], elem_id=f"{prefix}-tokens")
    cycle = gr.Slider(step=1, label="Cycle shown" + (" (the next Step jumps back to the latest)"
                                                     if prefix == "live" else ""),
                      elem_id=f"{prefix}-cycle", **_slider_kw(v[10]))
    with gr.Row(equal_height=False):
        tree = gr.Plot(v[2], label="Draft tree (this cycle)", show_label=False, elem_id=f"{prefix}-tree", scale=3)
        cmp = gr.Plot(v[3], label="Comparison tree, same context", show_label=False, elem_id=f"{prefix}-cmp", scale=2)
    with gr.Row(equal_height=True):
        race = gr.Plot(v[4], label="Race", show_label=False, elem_id=f"{prefix}-race")
        speed = gr.Plot(v[5], label="Speedup", show_label=False, elem_id=f"{prefix}-speedup")
    with gr.Row(equal_height=True):
        hist = gr.Plot(v[6], label="Acceptance lengths", show_label=False, elem_id=f"{prefix}-hist")
        calib = gr.Plot(v[7], label="Calibration", show_label=False, elem_id=f"{prefix}-calib")
        depth = gr.Plot(v[8], label="Per-depth acceptance", show_label=False, elem_id=f"{prefix}-depth")
    with gr.Accordion("Per-cycle table", open=False):
        table = gr.Dataframe(v[9], elem_id=f"{prefix}-table", interactive=False, wrap=False, max_height=420,
                             max_chars=48)
    return [metrics, tokens, tree, cmp, race, speed, hist, calib, depth, table, cycle]


# --------------------------------------------------------------------------------------------
# Shipped traces, examples
# --------------------------------------------------------------------------------------------
_TITLES: dict[tuple, str | None] = {}


def shipped_traces() -> dict[str, Path]:
    """Display name -> path of the recorded traces in assets/traces (the default first)."""
    out = {}
    if TRACES_DIR.is_dir():
        files = sorted(TRACES_DIR.glob("*.json"), key=lambda p: (p.name != DEFAULT_TRACE, p.name))
        for p in files:
            key = (str(p), p.stat().st_mtime)
            if key not in _TITLES:
                try:
                    meta = json.loads(p.read_text(encoding="utf-8")).get("meta", {})
                    _TITLES[key] = (meta.get(VIZ_KEY) or {}).get("title") or p.stem
                except (OSError, ValueError, AttributeError):
                    _TITLES[key] = None
            if _TITLES[key]:
                out[_TITLES[key]] = p
    return out


_TRACE_CACHE: dict[str, View] = {}


def load_view(path) -> View:
    key = str(path)
    if key not in _TRACE_CACHE or not key.startswith(str(TRACES_DIR)):
        _TRACE_CACHE[key] = View.from_trace(Trace.load(path), Path(path).name)
    return _TRACE_CACHE[key]


def load_examples() -> dict[str, list[str]]:
    try:
        d = json.loads(EXAMPLES_FILE.read_text(encoding="utf-8"))
        out = {}
        if isinstance(d, dict):
            for cat, items in d.items():
                if isinstance(items, str):
                    items = [items]
                prompts = [i if isinstance(i, str) else (i.get("prompt") or (i.get("turns") or [""])[0])
                           for i in items if isinstance(i, (str, dict))]
                out[str(cat)] = [p for p in prompts if p]
        elif isinstance(d, list):
            for i in d:
                if isinstance(i, dict) and (i.get("prompt") or i.get("turns")):
                    out.setdefault(str(i.get("category", "Other")), []).append(i.get("prompt") or i["turns"][0])
        if out:
            return out
    except (OSError, ValueError, TypeError, AttributeError, IndexError):
        pass
    return BUILTIN_EXAMPLES


# --------------------------------------------------------------------------------------------
# Event handlers (plain functions: the tests call them directly)
# --------------------------------------------------------------------------------------------
def _warn(msg: str) -> None:
    gr.Warning(msg)


def _skip(n: int) -> list:
    return [gr.skip() for _ in range(n)]


def live_status(sess: Session | None) -> str:
    if sess is None or not sess.started:
        return "Type a prompt (or pick an example) and press **Step**."
    m = sess.main
    done = f" · **finished** ({m.finished})" if m.finished else ""
    return (f"**Live** · cycle {m.cycle - 1} · {len(m.generated)} tokens · "
            f"{sess.labels()[0]} vs {sess.labels()[1]} vs plain{done}")


def do_steps(sess: Session | None, prompt: str, settings: Settings, n: int = 1) -> tuple[Session, list[str]]:
    """Start (if the prompt is new) and advance the session by up to n lockstep ticks."""
    sess = sess or Session()
    notes = []
    if not sess.lock.acquire(blocking=False):
        raise UserError("This session is busy with another step; wait for it (or press Stop).")
    try:
        if not sess.started or (prompt or "").strip() != (sess.prompt or "").strip():
            if not (prompt or "").strip():
                raise UserError("The prompt is empty: type something first (or pick an example).")
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


def on_step(sess, prompt, *ui):
    """Step button: outputs = [state, status] + dashboard."""
    try:
        settings = Settings.from_ui(*ui[:10])
        sess, notes = do_steps(sess, prompt, settings)
    except UserError as e:
        _warn(str(e))
        return _skip(2 + N_DASH)
    for n in notes:
        gr.Info(n)
    return [sess, live_status(sess)] + render(sess.view(), None, *ui[10:12])


def on_run(sess, prompt, *ui):
    """Run button: keeps stepping, streaming every update, until the end (or Stop)."""
    try:
        settings = Settings.from_ui(*ui[:10])
        sess, notes = do_steps(sess, prompt, settings, n=1)
    except UserError as e:
        _warn(str(e))
        yield _skip(2 + N_DASH)
        return
    for n in notes:
        gr.Info(n)
    sess.stop_requested = False
    yield [sess, live_status(sess)] + render(sess.view(), None, *ui[10:12])
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
        yield [sess, live_status(sess)] + render(sess.view(), None, *ui[10:12])


def on_stop(sess) -> None:
    """Stop: Run finishes the cycle in progress, shows it and stops (a forward pass cannot be cut)."""
    if sess is not None:
        sess.stop_requested = True


def on_reset(sess):
    if sess is not None and sess.lock.locked():
        _warn("A step is running; press Stop first.")
        return _skip(2 + N_DASH)
    return [Session(), live_status(None)] + render(None)


def on_live_view(sess, cycle, colour_by, show_dropped):
    """Cycle slider / display options changed: redraw (no decoding)."""
    if sess is None or not sess.started:
        return _skip(N_DASH)
    return render(sess.view(), cycle, colour_by, show_dropped)


def on_replay_load(choice, upload, cycle, colour_by, show_dropped):
    """Load a shipped or uploaded trace. Returns [replay view state, info] + dashboard."""
    try:
        if upload:
            path = upload if isinstance(upload, str) else getattr(upload, "name", upload)
            view = View.from_trace(Trace.load(path), Path(path).name)
        else:
            traces = shipped_traces()
            if choice not in traces:
                raise UserError("Pick a recorded trace or upload one.")
            view = load_view(traces[choice])
    except UserError as e:
        _warn(str(e))
        return _skip(2 + N_DASH)
    return [view, trace_info(view)] + render(view, None, colour_by, show_dropped)


def on_replay_view(view, cycle, colour_by, show_dropped):
    if view is None:
        return _skip(N_DASH)
    return render(view, cycle, colour_by, show_dropped)


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


# Explain mode --------------------------------------------------------------------------------
def explain_source(source, sess, view) -> View | None:
    if source == "Live session":
        return sess.view() if sess is not None and sess.started else None
    return view


def on_explain(source, sess, view, cycle, phase_label, move=0):
    """Outputs: cycle slider, phase radio, figure, text."""
    v = explain_source(source, sess, view)
    st = v.step_at(int(cycle) if cycle else None) if v is not None else None
    if st is None:
        msg = ("Press Step in the Live tab first." if source == "Live session"
               else "Load a trace in the Replay tab first.")
        return [gr.Slider(), gr.Radio(choices=[], value=None), viz.empty_figure(msg, 460), msg]
    ph = viz.phases(st)
    labels = [lab for _, lab in ph]
    i = labels.index(phase_label) if phase_label in labels else (len(labels) - 1 if move < 0 else 0)
    if phase_label in labels:
        i = max(0, min(len(labels) - 1, i + move))
    key = ph[i][0]
    dr = v.drafted
    return [gr.Slider(minimum=dr[0], maximum=max(dr[-1], dr[0] + 1), value=st.cycle, step=1, interactive=len(dr) > 1),
            gr.Radio(choices=labels, value=labels[i]),
            viz.explain_figure(st, key), viz.explain_text(st, key, greedy=v.greedy)]


# --------------------------------------------------------------------------------------------
# The page
# --------------------------------------------------------------------------------------------
CSS = TOKEN_CSS + """
.gradio-container { max-width: 1680px !important; }
#header h1 { font-size: 28px; margin: 0 0 2px 0; }
#header p { font-size: 15px; color: #4b5563; margin: 0; }
#modelinfo { font-size: 14px; padding: 6px 10px; border-radius: 8px; background: #f8fafc; border: 1px solid #e5e7eb; }
.okdot { color: #16a34a; } .loaddot { color: #d97706; }
.warnbadge { color: #92400e; background: #fef3c7; padding: 1px 6px; border-radius: 6px; }
.errbadge { color: #991b1b; background: #fee2e2; padding: 1px 6px; border-radius: 6px; }
.metrics { display: flex; flex-wrap: wrap; gap: 10px; margin: 2px 0 6px 0; }
.mcard { flex: 1 1 170px; border: 1px solid #e5e7eb; border-radius: 10px; padding: 8px 12px; background: #fff;
  display: flex; align-items: center; gap: 10px; }
.mcard.speed { background: #eff6ff; border-color: #bfdbfe; }
.mval { font-size: 26px; font-weight: 700; color: #111827; min-width: 64px; }
.mcard.speed .mval { color: #1d4ed8; }
.mcard.lossy { background: #fef2f2; border-color: #fecaca; } .mcard.lossy .mval { color: #b91c1c; font-size: 20px; }
.mcard.hint { background: #fffbeb; border-color: #fde68a; flex-basis: 260px; }
.mlab { font-size: 13px; color: #374151; line-height: 1.25; }
.banner { font-size: 15px; }
#explain-text { font-size: 16px; line-height: 1.55; }
.controls button { font-size: 16px !important; }
"""


def build_app(preload_trace: bool = True) -> gr.Blocks:
    examples = load_examples()
    ex_choices = [f"{cat} · {p}" for cat, ps in examples.items() for p in ps]
    ex_map = dict(zip(ex_choices, [p for ps in examples.values() for p in ps]))
    traces = shipped_traces()
    pols = policy_names()
    # The default recorded trace, rendered once per process: every new page shows it at once.
    init_view, init_dash, init_info, init_ex = None, None, "", None
    init_status = live_status(None)
    if preload_trace and traces:
        try:
            init_view = load_view(next(iter(traces.values())))
            init_dash = render(init_view)
            init_info = trace_info(init_view)
            init_ex = on_explain("Replay trace", None, init_view, None, None)
            init_status = (f"Showing the recorded trace **{next(iter(traces))}** until you press **Step** "
                           f"(the Replay tab has more).")
        except UserError as e:
            init_info = f"Could not open the default trace: {e}"

    with gr.Blocks(title="EAGLE-2, step by step") as demo:
        sess = gr.State(None)
        rview = gr.State(init_view)
        with gr.Row(elem_id="header"):
            gr.HTML("<h1>EAGLE-2, step by step</h1><p>Speculative decoding with a context-aware dynamic draft "
                    "tree: a small draft head proposes a tree of tokens, the target model checks them all in one "
                    "forward pass and keeps the longest correct path.</p>")
        model_md = gr.HTML(MODEL.info_md(), elem_id="modelinfo")
        timer = gr.Timer(1.0)

        with gr.Tabs(selected="live") as tabs:
            with gr.Tab("Live", id="live"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=1, min_width=340):
                        prompt = gr.Textbox(label="Prompt (chat message)", lines=4, elem_id="prompt",
                                            placeholder="Ask the model something…")
                        example = gr.Dropdown(choices=ex_choices, value=None, label="Example prompts",
                                              elem_id="examples", info="By category; picks fill the prompt box.")
                        with gr.Row(elem_classes=["controls"]):
                            step_b = gr.Button("Step", variant="primary", elem_id="step-btn", min_width=70)
                            run_b = gr.Button("Run", variant="secondary", elem_id="run-btn", min_width=70)
                            stop_b = gr.Button("Stop", variant="stop", elem_id="stop-btn", min_width=70)
                            reset_b = gr.Button("Reset", elem_id="reset-btn", min_width=70)
                        with gr.Accordion("Tree settings", open=True):
                            pol_help = " ".join([HELP["policy"]] + [HELP[p] for p in pols if p in HELP and
                                                                    p not in ("eagle2", "static")])
                            policy = gr.Dropdown(pols, value="eagle2", label="Tree policy", info=pol_help,
                                                 elem_id="policy")
                            compare = gr.Dropdown(pols, value="static", label="Compare with",
                                                  info=HELP["compare"], elem_id="compare")
                            total = gr.Slider(2, 256, value=60, step=1, label="Total tokens N",
                                              info=HELP["total_tokens"])
                            depth = gr.Slider(1, 12, value=5, step=1, label="Depth d", info=HELP["depth"])
                            topk = gr.Slider(1, 20, value=10, step=1, label="Top-k", info=HELP["top_k"])
                        with gr.Accordion("Generation settings", open=False):
                            temp = gr.Slider(0, 2, value=0.0, step=0.05, label="Temperature", info=HELP["temperature"])
                            topp = gr.Slider(0.05, 1, value=1.0, step=0.05, label="Top-p", info=HELP["top_p"])
                            seed = gr.Number(0, precision=0, label="Seed", info=HELP["seed"])
                            maxnew = gr.Slider(1, 512, value=64, step=1, label="Max new tokens",
                                               info=HELP["max_new_tokens"])
                        with gr.Accordion("Display", open=True):
                            side = gr.Checkbox(True, label="Draw the comparison policy's tree on the same context",
                                               info="Costs one extra draft + verify per step (not timed).")
                            colour = gr.Radio(["path value", "draft prob"], value="path value", label="Colour nodes by",
                                              info="Path value = product of draft probabilities from the root "
                                                   "(≈ chance of acceptance); draft prob = the node's own.")
                            dropped = gr.Checkbox(False, label="Show nodes dropped by the rerank (faded)",
                                                  elem_id="show-dropped")
                        with gr.Accordion("Downloads", open=False):
                            export_b = gr.Button("Export trace (JSON), table (CSV), tree (HTML)")
                            files = gr.File(file_count="multiple", label="Files", interactive=False)
                    with gr.Column(scale=4):
                        status = gr.Markdown(init_status, elem_id="live-status", elem_classes=["banner"])
                        live_dash = build_dashboard("live", init_dash)

            with gr.Tab("Replay", id="replay"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=1, min_width=340):
                        gr.Markdown("Browse a recorded run cycle by cycle; no model needed. Traces are "
                                    "written by *Export* in the Live tab or by `python app.py --record-traces`.")
                        pick = gr.Dropdown(list(traces), value=next(iter(traces), None), label="Recorded traces",
                                           elem_id="trace-pick")
                        upload = gr.File(label="…or upload a trace (.json)", file_types=[".json"], type="filepath",
                                         elem_id="trace-upload", height=110)
                        info = gr.Markdown(init_info, elem_id="trace-info")
                        r_colour = gr.Radio(["path value", "draft prob"], value="path value", label="Colour nodes by")
                        r_dropped = gr.Checkbox(False, label="Show nodes dropped by the rerank (faded)")
                        with gr.Accordion("Downloads", open=False):
                            r_export = gr.Button("Export this trace")
                            r_files = gr.File(file_count="multiple", label="Files", interactive=False)
                    with gr.Column(scale=4):
                        replay_dash = build_dashboard("replay", init_dash)

            with gr.Tab("Explain a cycle", id="explain"):
                with gr.Row(equal_height=False):
                    with gr.Column(scale=1, min_width=340):
                        gr.Markdown("Replay one cycle phase by phase: each expansion level of the draft tree, "
                                    "the rerank, the target's verification and the acceptance.")
                        ex_src = gr.Radio(["Live session", "Replay trace"], value="Replay trace", label="Source")
                        ex_cycle = gr.Slider(step=1, label="Cycle", elem_id="explain-cycle",
                                             **(_slider_kw(init_ex[0]) if init_ex else {}))
                        ex_phase = gr.Radio(init_ex[1].choices if init_ex else [],
                                            value=init_ex[1].value if init_ex else None,
                                            label="Phase", elem_id="explain-phase")
                        with gr.Row():
                            prev_b = gr.Button("◀ Previous phase")
                            next_b = gr.Button("Next phase ▶", variant="primary")
                        ex_text = gr.Markdown(init_ex[3] if init_ex else "", elem_id="explain-text")
                    with gr.Column(scale=3):
                        ex_fig = gr.Plot(init_ex[2] if init_ex else None, label="Tree at this phase",
                                         show_label=False, elem_id="explain-tree")

        # ---- events
        settings_in = [policy, compare, total, depth, topk, temp, topp, seed, maxnew, side, colour, dropped]
        live_out = [sess, status] + live_dash
        step_b.click(on_step, [sess, prompt] + settings_in, live_out, concurrency_id="decode",
                               api_name="step")
        prompt.submit(on_step, [sess, prompt] + settings_in, live_out, concurrency_id="decode",
                      api_visibility="private")
        run_b.click(on_run, [sess, prompt] + settings_in, live_out, concurrency_id="decode",
                             api_name="run")
        stop_b.click(on_stop, [sess], None, queue=False, show_progress="hidden")
        reset_b.click(on_reset, [sess], live_out, api_name="reset")
        example.change(lambda c: ex_map.get(c, gr.skip()) if c else gr.skip(), [example], [prompt])
        live_cycle = live_dash[-1]
        for comp, ev in ((live_cycle, "input"), (colour, "change"), (dropped, "change")):
            getattr(comp, ev)(on_live_view, [sess, live_cycle, colour, dropped], live_dash,
                              trigger_mode="always_last", show_progress="hidden")
        export_b.click(lambda s: on_export("live", s, None), [sess], [files])

        replay_in = [pick, upload, replay_dash[-1], r_colour, r_dropped]
        replay_out = [rview, info] + replay_dash
        pick.change(lambda c, *a: on_replay_load(c, None, *a[1:]), replay_in, replay_out)
        upload.upload(on_replay_load, replay_in, replay_out)
        r_cycle = replay_dash[-1]
        for comp, ev in ((r_cycle, "input"), (r_colour, "change"), (r_dropped, "change")):
            getattr(comp, ev)(on_replay_view, [rview, r_cycle, r_colour, r_dropped], replay_dash,
                              trigger_mode="always_last", show_progress="hidden")
        r_export.click(lambda v: on_export("replay", None, v), [rview], [r_files])

        ex_in = [ex_src, sess, rview, ex_cycle, ex_phase]
        ex_out = [ex_cycle, ex_phase, ex_fig, ex_text]
        ex_src.change(lambda *a: on_explain(*a[:3], None, None), ex_in, ex_out)
        ex_cycle.input(lambda *a: on_explain(*a[:4], None), ex_in, ex_out, trigger_mode="always_last")
        ex_phase.change(on_explain, ex_in, ex_out)
        next_b.click(lambda *a: on_explain(*a, move=1), ex_in, ex_out)
        prev_b.click(lambda *a: on_explain(*a, move=-1), ex_in, ex_out)

        def tick():
            return MODEL.info_md(), gr.Timer(active=not (MODEL.ready or MODEL.error))

        timer.tick(tick, None, [model_md, timer], show_progress="hidden")

        def on_load():
            if MODEL.warning:
                gr.Warning(MODEL.warning)
            return MODEL.info_md(), gr.Timer(active=not (MODEL.ready or MODEL.error))

        demo.load(on_load, None, [model_md, timer], show_progress="hidden")
    return demo


# --------------------------------------------------------------------------------------------
# Recording the shipped traces
# --------------------------------------------------------------------------------------------
RECORDINGS = [
    ("writing-greedy.json", "Writing, greedy (eagle2 vs static)", "Writing",
     "Write a short poem about a city at night seen from a rooftop.", dict(temperature=0.0)),
    ("math-greedy.json", "Math, greedy (eagle2 vs static)", "Math",
     "Solve for y: 5y - 3 = 2y + 12.", dict(temperature=0.0)),
    ("writing-sampled-t0.7.json", "Writing, sampled at temperature 0.7", "Writing",
     "Write a letter to your future self, to be opened in ten years.", dict(temperature=0.7, seed=1)),
]


def _round_floats(x, digits: int = 4):
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, list):
        return [_round_floats(v, digits) for v in x]
    if isinstance(x, dict):
        return {k: _round_floats(v, digits) for k, v in x.items()}
    return x


def record_traces(bundle, out_dir: Path = TRACES_DIR, max_new_tokens: int = 48, only=None) -> list[Path]:
    """Record the shipped traces (eagle2 + static preview + static/plain series) with `bundle`."""
    out_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for fname, title, cat, prompt, kw in RECORDINGS:
        if only and fname not in only:
            continue
        s = Settings(max_new_tokens=max_new_tokens, **kw)
        sess = Session()
        sess.start(bundle, prompt, s)
        while not sess.finished:
            sess.tick()
        tr = sess.export()
        tr.meta[VIZ_KEY].update(title=title, category=cat, recorded=time.strftime("%Y-%m-%d"))
        data = _round_floats(json.loads(tr.to_json()))
        path = out_dir / fname
        path.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
        Trace.load(path)  # must load back
        print(f"wrote {path} ({path.stat().st_size // 1024} KiB, {len(tr.steps)} cycles, "
              f"tau {sess.main.tau:.2f})", flush=True)
        written.append(path)
    return written


# --------------------------------------------------------------------------------------------
def available_cpus() -> int:
    """CPUs this process may use: the cgroup quota (containers, Spaces) if any, else the affinity mask."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            return max(1, int(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    try:
        q = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        if q > 0:
            return max(1, q // int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text()))
    except (OSError, ValueError):
        pass
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def set_threads(n: int) -> None:
    """CPU threads for torch. Oversubscribing a small CPU (2 sessions x 2 threads on 2 vCPUs)
    makes tree verification an order of magnitude slower, so the default is cores / concurrency."""
    import torch
    torch.set_num_threads(max(1, int(n)))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", os.environ.get("PORT", 7860))))
    ap.add_argument("--target", default=os.environ.get("EAGLE2_TARGET"), help="model preset, folder or HF id")
    ap.add_argument("--head", default=os.environ.get("EAGLE2_HEAD"), help="EAGLE head folder/id or 'random'")
    ap.add_argument("--device", default=os.environ.get("EAGLE2_DEVICE", "cpu"), help="cpu or cuda")
    ap.add_argument("--dtype", default=os.environ.get("EAGLE2_DTYPE"))
    ap.add_argument("--concurrency", type=int, default=int(os.environ.get("EAGLE2_CONCURRENCY", 2)),
                    help="sessions decoding at the same time (each has its own decoders)")
    ap.add_argument("--record-traces", action="store_true", help="re-record assets/traces/*.json and exit")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="with --record-traces")
    ap.add_argument("--threads", type=int, default=int(os.environ.get("EAGLE2_THREADS", 0)) or None,
                    help="torch CPU threads per decode (default: CPU cores / concurrency)")
    a = ap.parse_args(argv)
    set_threads(a.threads or max(1, available_cpus() // max(1, a.concurrency)))
    if a.record_traces:
        from eagle2.loading import load_bundle
        try:
            record_traces(load_bundle(a.target, a.head, a.device, a.dtype), max_new_tokens=a.max_new_tokens)
        except UserError as e:
            print(f"error: {e}")
            return 2
        return 0
    MODEL.start(a.target, a.head, a.device, a.dtype)
    launch(a.host, a.port, a.concurrency)
    return 0


def launch(host: str = "127.0.0.1", port: int = 7860, concurrency: int = 2, block: bool = True) -> gr.Blocks:
    """Build and serve the page (block=False returns at once: tests; close with demo.close())."""
    demo = build_app()
    demo.queue(default_concurrency_limit=max(1, concurrency))
    demo.launch(server_name=host, server_port=port, ssr_mode=False, show_error=True, css=CSS,
                theme=gr.themes.Soft(primary_hue="blue", neutral_hue="slate",
                                     font=["Inter", "Segoe UI", "Helvetica", "Arial", "sans-serif"]),
                footer_links=["gradio"], prevent_thread_lock=not block, quiet=not block)
    return demo


if __name__ == "__main__":
    raise SystemExit(main())
