"""The page's sessions and handlers (ui/): concurrent sessions through the real Gradio queue, errors
that keep the session usable, mid-run settings, exports and replay, outputs bound by name."""
from __future__ import annotations

import inspect
import json
import subprocess
import sys
import threading
import warnings
from pathlib import Path
from types import SimpleNamespace

import gradio as gr
import pytest

import viz
from eagle2.decoding.race import RaceSettings
from eagle2.policies.registry import TRACES
from eagle2.errors import UserError
from eagle2.policies.registry import EAGLE2, HARDWARE_AWARE, default_policy, describe, names
from ui import handlers
from ui.dashboard import ACCEPT, ALWAYS, DASH, OPEN, PANELS, SECTIONS, render
from ui.model import MODEL, ModelHolder
from ui.page import build_app, launch
from ui.screenshot import free_port
from ui.session import Session, Settings
from ui.traces import shipped_traces
from ui.view import View
from page_controls import DISPLAY, SMALL, STEP_API, ui
from ui import outputs
from ui.status import live_status

SKIP = type(gr.skip())
# Each tab's handlers keyed by the output names (what tests read); the page's are keyed by its components.
live, replay, explain = handlers.Live(), handlers.Replay(), handlers.Explain()


def settings_ui(**over):
    """The values Settings.from_ui takes (the controls but the display options)."""
    return [v for k, v in zip(outputs.CONTROLS, ui(**over)) if k not in DISPLAY]


@pytest.fixture(scope="module")
def bundle(real_bundle):
    """The default model (conftest's session bundle), installed as the page's loaded model."""
    MODEL.set(real_bundle)
    return real_bundle


def solo(bundle, prompt, ticks, **over):
    s = Settings(**dict(SMALL, **over))
    sess = Session()
    sess.start(bundle, prompt, s)
    for _ in range(ticks):
        sess.tick()
    return sess


def test_page_binds_controls_and_outputs_by_name():
    """The events' inputs and outputs are the components their names say (each tab's handlers key
    their dicts by its components), and the controls start at the race's defaults for
    the device the page runs on."""
    cfg = build_app(preload_trace=False, device="cpu").config
    comps = {c["id"]: c for c in cfg["components"]}

    def dep(elem_id, event):
        return next(d for d in cfg["dependencies"]
                    if [comps[t]["props"].get("elem_id") for t, ev in d["targets"] if t in comps] == [elem_id]
                    and d["targets"][0][1] == event)

    def props(names, ids):
        assert len(names) == len(ids)
        return {n: dict(comps[i]["props"], type=comps[i]["type"]) for n, i in zip(names, ids)}

    suffix = {"compare": "cmp"}    # dashboard elem_ids that differ from the output's name
    step = dep("step-btn", "click")
    assert step["api_name"] == "step"
    out = props(outputs.LIVE, step["outputs"])
    assert out["session"]["type"] == "state" and out["status"]["elem_id"] == "live-status"
    assert all(out[n]["elem_id"] == f"live-{suffix.get(n, n)}" for n in DASH), out
    inp = props(("session", "prompt", *outputs.CONTROLS, outputs.PANELS_STATE, ACCEPT), step["inputs"])
    assert inp[outputs.PANELS_STATE]["type"] == "state"    # what is on screen: test_an_update_sends_only_what_is_shown
    assert inp[ACCEPT]["type"] == "state"    # the acceptance what-if's a: a state, so not in the /step API
    assert [comps[i]["props"].get("elem_id") for i in step["show_progress_on"]] == ["live-status"]   # one spinner
    labels = dict(prompt="Prompt (chat message)", policy="Tree policy", compare="Compare with",
                  total_tokens="Total tokens N", depth="Depth d", top_k="Top-k", temperature="Temperature",
                  top_p="Top-p", seed="Seed", max_new_tokens="Max new tokens", colour_by="Colour nodes by")
    assert {n: inp[n]["label"] for n in labels} == labels
    assert inp["show_dropped"]["elem_id"] == "show-dropped" and inp["side_by_side"]["type"] == "checkbox"
    defaults = RaceSettings.for_device("cpu")
    assert {n: inp[n]["value"] for n in outputs.CONTROLS[:outputs.N_SETTINGS]} == \
        {n: getattr(defaults, n) for n in outputs.CONTROLS[:outputs.N_SETTINGS]}
    assert inp["policy"]["choices"] == inp["compare"]["choices"] == [(n, n) for n in names()]
    assert all(describe(n) in inp["policy"]["info"] for n in names())
    live = props(DASH, dep("live-cycle", "input")["outputs"])
    assert all(live[n]["elem_id"] == f"live-{suffix.get(n, n)}" for n in DASH)
    replay = props(outputs.REPLAY, dep("trace-pick", "change")["outputs"])
    assert replay["view"]["type"] == "state" and replay["info"]["elem_id"] == "trace-info"
    assert all(replay[n]["elem_id"] == f"replay-{suffix.get(n, n)}" for n in DASH)
    for tab in ("live", "replay"):   # each section under the trees opens as OPEN says and, opened, draws its charts
        for name, _ in SECTIONS:
            section = next(c for c in cfg["components"] if c["props"].get("elem_id") == f"{tab}-{name}-section")
            assert section["type"] == "accordion" and section["props"]["open"] == (name in OPEN)
            opened = props(handlers.panel_outputs(name), dep(f"{tab}-{name}-section", "expand")["outputs"])
            assert opened[outputs.PANELS_STATE]["type"] == "state"
            assert all(opened[n]["elem_id"] == f"{tab}-{n}" for n in PANELS[name])
        moved = dep(f"{tab}-accept-a", "input")   # the acceptance slider redraws its chart alone
        assert props((ACCEPT, "chain"), moved["outputs"])["chain"]["elem_id"] == f"{tab}-chain"
        assert comps[moved["inputs"][-1]]["props"]["label"] == "per-token acceptance a"
    ex = props(outputs.EXPLAIN, dep("explain-phase", "change")["outputs"])
    assert {n: ex[n]["elem_id"] for n in ex} == dict(cycle="explain-cycle", phase="explain-phase",
                                                    figure="explain-tree", text="explain-text")


def control_values(cfg, *elem_ids) -> dict:
    comps = {c["props"].get("elem_id"): c["props"] for c in cfg["components"]}
    return {i: comps[i]["value"] for i in elem_ids}


def test_controls_start_at_the_defaults_that_pay_on_the_device(monkeypatch):
    """CPU: the hardware-aware policy; CUDA: EAGLE-2 at (60, 5, 10). The fixed large tree stays one
    click away (a preset button per device kind), with the reason in one line beside it."""
    from ui.tabs.live import TREE, preset_values
    cpu, gpu = RaceSettings.for_device("cpu"), RaceSettings.for_device("cuda")
    assert cpu.policy == default_policy("cpu") == HARDWARE_AWARE
    assert gpu.policy == default_policy("cuda") == EAGLE2 and (gpu.total_tokens, gpu.depth, gpu.top_k) == (60, 5, 10)
    for device, want in (("cpu", cpu), ("cuda", gpu), ("cuda:0", gpu)):
        cfg = build_app(preload_trace=False, device=device).config
        assert control_values(cfg, "policy", "compare") == {"policy": want.policy, "compare": want.compare}
        buttons = {c["props"].get("elem_id"): c["props"]["value"] for c in cfg["components"]
                   if c["type"] == "button"}
        assert "this machine" in buttons["preset-cpu" if want is cpu else "preset-cuda"]
        assert "(60, 5, 10)" in buttons["preset-cuda"] and EAGLE2 in buttons["preset-cuda"]
        help_md = control_values(cfg, "presets-help")["presets-help"]
        assert "on a GPU 60 tokens cost about what one does" in help_md and "EAGLE-2 (60, 5, 10) wins" in help_md
    # one click: the preset sets the tree controls to that device's defaults
    assert preset_values("cuda")() == [getattr(gpu, n) for n in TREE]
    assert preset_values("cpu")() == [getattr(cpu, n) for n in TREE]
    # the device the page's model was started for decides when none is given (app.py's --device)
    from ui.session import defaults, device_kind
    monkeypatch.setattr(MODEL, "options", dict(MODEL.options, device="cuda"))
    assert defaults() == gpu and device_kind() == "cuda"
    assert Settings.from_ui(None, None, 60, 5, 10, 0, 1, 0, 8).policy == gpu.policy   # empty: the default
    monkeypatch.setattr(MODEL, "options", dict(MODEL.options, device="cpu"))
    assert defaults() == cpu and Settings.from_ui(None, None, 60, 5, 10, 0, 1, 0, 8).policy == cpu.policy


def test_the_model_line_names_the_head_not_a_machine_path(bundle):
    info = MODEL.info_md()
    assert "smollm2-135m (shipped EAGLE-3 head)" in info, info
    assert str(Path(__file__).resolve().parent.parent) not in info and "assets/heads" not in info


def test_a_session_holds_the_engines_race_rather_than_being_one():
    from eagle2.decoding.race import Race
    sess = Session()
    assert not isinstance(sess, Race) and isinstance(sess.race, Race) and not sess.started


@pytest.mark.slow   # the full suite's: a fresh interpreter importing torch (the fast tier stays under two minutes)
def test_the_session_layer_imports_no_gradio():
    """Sessions, views, the model holder and the trace recorder work without Gradio (scripts,
    the recorder); only the dashboard, handlers, tabs and page import it."""
    code = ("import sys, ui.model, ui.session, ui.view, ui.traces, ui.help\n"
            "assert 'gradio' not in sys.modules, sorted(m for m in sys.modules if m.startswith('gradio'))\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parent.parent,
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_handlers_key_their_outputs_by_the_tabs_components():
    """On the page each handler returns (or, Run, yields) {component: value} for its event's
    outputs, which Gradio puts in the outputs' order; the API's endpoint names are the handlers'."""
    from gradio.blocks import convert_component_dict_to_list
    demo = build_app(preload_trace=False, device="cpu")
    fns = {f.api_name: f for f in demo.fns.values()}
    step, run = fns["step"], fns["run"]
    # Run is one Step, then one queued Step per tick of its timer: no generator holding a slot
    assert step.fn.__name__ == "on_step" and run.fn.__name__ == "on_run" and not inspect.isgeneratorfunction(run.fn)
    assert fns["run_next"].fn.__name__ == "on_run_tick" and fns["run_next"].outputs == run.outputs
    assert run.outputs[:len(step.outputs)] == step.outputs and len(run.outputs) == len(outputs.RUN)
    status = step.outputs[outputs.LIVE.index("status")]
    for fn in (step, run):
        with pytest.warns(UserWarning, match="prompt is empty"):
            out = fn.fn(None, "  ", *ui(), OPEN)
        assert set(out) == set(fn.outputs)              # keyed by the components, every output named
        values = convert_component_dict_to_list(fn.outputs, out)
        assert values[outputs.LIVE.index("status")] == out[status] and "prompt is empty" in out[status]
    panels = fns["close_race"]       # a section closed: one output, the tab's open panels
    assert panels.fn(OPEN) == {panels.outputs[0]: OPEN - {"race"}}
    ex = fns["on_explain_source"]
    drawn = ex.fn(handlers.LIVE_SOURCE, None, None, None, None)
    assert list(drawn) == ex.outputs and drawn[ex.outputs[outputs.EXPLAIN.index("text")]].startswith("Press Step")


@pytest.mark.slow  # two sessions decoding the real model at once
def test_two_sessions_step_at_once_through_the_queue(bundle, monkeypatch):
    """Two browser sessions (two clients) step different prompts through the real queue, which
    runs them at the same time (checked server side, by a meeting point, not by timings); each
    ends with exactly the tokens of a solo run of its own prompt."""
    from gradio_client import Client
    prompts = ["Name three colours.", "What is the capital of France?"]
    ticks = 2
    expected = [solo(bundle, p, ticks) for p in prompts]
    port = free_port()
    real, met = handlers.do_steps, []
    # Server side, each session's first Step waits for the other's before decoding: both get past
    # only if the queue runs them at the same time (one after the other, the wait times out and
    # that Step fails). No timing is measured.
    meet = threading.Barrier(2, timeout=60)

    def meeting(sess, prompt, *a, **k):
        if prompt not in met:
            met.append(prompt)
            meet.wait()
        return real(sess, prompt, *a, **k)

    monkeypatch.setattr(handlers, "do_steps", meeting)
    demo = launch("127.0.0.1", port, concurrency=2, block=False)
    try:
        results, errors = {}, []
        barrier = threading.Barrier(2, timeout=60)

        def drive(i):
            try:
                c = Client(f"http://127.0.0.1:{port}/", verbose=False, download_files=False)
                barrier.wait()
                out = None
                for _ in range(ticks):
                    out = c.predict(prompts[i], *ui(), api_name="/step")
                assert len(out) == len(STEP_API), out
                results[i] = dict(zip(STEP_API, out))
            except Exception as e:  # reported below
                errors.append(repr(e))

        th = [threading.Thread(target=drive, args=(i,), daemon=True) for i in range(2)]
        for t in th:
            t.start()
        for t in th:
            t.join(timeout=240)
        assert not errors, errors
        assert not any(t.is_alive() for t in th), "a session got no answer within 240 s"
        for i in range(2):
            status, tokens = results[i]["status"], results[i]["tokens"]
            exp = expected[i]
            assert f"cycle {ticks}" in status and f"{len(exp.race.main.generated)} tokens" in status
            # the token stream: every token's text and cycle (the table is in a closed section: not sent)
            assert tokens == viz.token_stream_html(exp.race.main.trace.steps), f"session {i} got another session's text"
        assert results[0]["tokens"] != results[1]["tokens"]
        assert sorted(met) == sorted(prompts) and not meet.broken, "the sessions never decoded at once"
    finally:
        demo.close()


def test_an_update_sends_only_what_is_shown(bundle):
    """A Step builds and sends the tree, the metrics, the token stream and the cycle slider, and
    the open panels' outputs only: with the comparison hidden and every section closed, the
    others are gr.skip() (neither built nor redrawn). Opening a section draws it at once; hiding
    the comparison hides its panel. A caller that names no panels gets every output."""
    q, room = "Write two sentences about apples.", dict(max_new_tokens=40)  # room for three more Steps
    sess = solo(bundle, q, 1, **room)
    out = live.on_step(sess, q, *ui(side_by_side=False, **room), frozenset())
    assert {n for n, v in out.items() if isinstance(v, SKIP)} == set(DASH) - set(ALWAYS)
    assert out["tree"].layout.title.text.startswith("Cycle 2 ") and "cycle 2" in out["status"]
    out = live.on_step(sess, q, *ui(**room), OPEN)  # the page's default panels
    assert {n for n, v in out.items() if not isinstance(v, SKIP)} == \
        {"session", "status", *ALWAYS, *(n for p in OPEN for n in PANELS[p])}
    assert out["compare"].layout.title.text.startswith("static on the same context")
    assert not any(isinstance(v, SKIP) for v in live.on_step(sess, q, *ui(**room)).values())
    drawn = live.live(sess, "path value", False, frozenset({"chain"}), 0.9)   # the acceptance slider's a
    assert drawn["chain"].data[0].name == "model, a = 0.90 (slider)" and isinstance(drawn["whatif"], SKIP)

    opened = live.panel_open("whatif")(sess, None, "path value", False, OPEN)
    assert list(opened) == list(handlers.panel_outputs("whatif"))
    assert opened["panels"] == OPEN | {"whatif"} and opened["whatif"].data             # drawn now
    assert live.panel_close("whatif")(opened["panels"]) == {"panels": OPEN}
    recorded = View.from_trace(TRACES.load(next(iter(shipped_traces().values()))), "replay")
    before_step = handlers.Live(view_of=lambda s: handlers.live_view(s, recorded)).panel_open("table")
    assert len(before_step(None, None, "path value", False, OPEN)["table"]) == len(recorded.steps)  # a new page's trace
    assert before_step(Session(), None, "path value", False, OPEN)["table"].empty     # after Reset: empty

    side_by_side = live.side_by_side
    hidden = side_by_side(sess, False, None, "path value", False, OPEN)
    assert hidden["panels"] == OPEN - {"compare"} and hidden["compare"].visible is False
    shown = side_by_side(sess, True, None, "path value", False, hidden["panels"])
    assert shown["panels"] == OPEN and shown["compare"].visible is True
    reset = live.on_reset(sess, hidden["panels"])
    assert isinstance(reset["compare"], SKIP) and not isinstance(reset["tree"], SKIP)


def test_the_opening_trace_is_the_race_a_live_cpu_page_runs_at_its_defaults():
    """The page opens on the first shipped trace: the race Step then continues on a CPU, recorded
    with the page's own settings (ui.traces.record_traces: recorded_race.record_settings("cpu"),
    the embedded model in its CPU precision, one thread a session), named with its CPU; its card
    against plain does not say speculation loses."""
    from eagle2.cycle.trace import DEVICE_NAME, VIZ_KEY
    from eagle2.decoding.recorded_race import record_settings
    from eagle2.policies.registry import make_policy
    from ui.traces import DEFAULT_TRACE, RECORDINGS

    title, path = next(iter(shipped_traces().items()))
    assert path.name == DEFAULT_TRACE == RECORDINGS[0][0]
    tr = TRACES.load(path)
    meta, live = tr.meta, record_settings("cpu", 48)
    assert meta["policy"] == {"name": live.policy, **make_policy(live.policy, **live.tree).params()}
    assert meta[VIZ_KEY]["compare_policy"] == live.compare and meta["device"] == "cpu"
    assert meta["dtype"] == "q4_1"          # the embedded model's precision on a CPU (load_bundle's default)
    assert meta["threads"] == 1             # a session's: 2 CPUs shared by the page's 2 sessions at once
    assert meta["sampling"]["temperature"] == live.temperature == 0.0 and meta["max_new_tokens"] == 48
    assert meta[DEVICE_NAME] and meta[DEVICE_NAME] in title and f"{live.policy} vs {live.compare}" in title
    view = View.from_trace(tr, "replay")
    speedup = viz.metrics(view.series[0], view.series[1:])["speedups"]["plain"]
    assert speedup >= 1.0, f"the opening trace says {live.policy} is {speedup:.2f}x plain"


def test_the_acceptance_whatif_opens_and_its_slider_redraws_it_alone():
    """Opening the acceptance what-if draws it at the tab's a; moving its slider redraws that chart
    alone (no decoding) and keeps a for the tab's later redraws, which draw it only while open."""
    name, path = next(iter(shipped_traces().items()))
    recorded = View.from_trace(TRACES.load(path), "replay")
    slider_a = lambda fig: fig.data[0].name   # noqa: E731  the model curve at the slider's a comes first
    opened = replay.panel_open("chain")(recorded, None, "path value", False, OPEN, 0.9)
    assert list(opened) == list(handlers.panel_outputs("chain")) and opened["panels"] == OPEN | {"chain"}
    assert slider_a(opened["chain"]) == "model, a = 0.90 (slider)"
    assert any(d.name == "measured, this run" for d in opened["chain"].data)
    moved = replay.on_accept(recorded, None, "path value", False, 0.5)
    assert list(moved) == [ACCEPT, "chain"] and moved[ACCEPT] == 0.5
    assert slider_a(moved["chain"]) == "model, a = 0.50 (slider)"
    redrawn = replay.on_replay_view(recorded, 3, "path value", False, opened["panels"], 0.5)
    assert slider_a(redrawn["chain"]) == "model, a = 0.50 (slider)"
    assert isinstance(replay.on_replay_view(recorded, 3, "path value", False, OPEN, 0.5)["chain"], SKIP)   # closed
    loaded = replay.on_replay_pick(name, None, None, "path value", False, OPEN | {"chain"}, 0.75)
    assert slider_a(loaded["chain"]) == "model, a = 0.75 (slider)"
    # the Live tab: a new page's recorded trace until the first Step; after Reset, nothing to measure
    page_live = handlers.Live(view_of=lambda s: handlers.live_view(s, recorded))
    assert slider_a(page_live.on_accept(None, None, "path value", False, 0.6)["chain"]) == "model, a = 0.60 (slider)"
    assert not page_live.on_accept(Session(), None, "path value", False, 0.6)["chain"].data


def test_lockstep_session_is_lossless_and_timed_separately(bundle):
    # room for 4 cycles even when the trained head accepts several tokens per cycle
    sess = solo(bundle, "Write a short story about a lighthouse keeper.", 4, max_new_tokens=40)
    m, c, p = sess.race.main, sess.race.cmp, sess.race.plain
    assert m.finished is None
    n = len(m.generated)
    assert c.generated[:n] == m.generated and p.generated[:n] == m.generated   # greedy: identical text
    assert len(c.generated) >= n and len(p.generated) >= n                      # caught up in lockstep
    assert set(sess.race.previews) == {1, 2, 3, 4}                               # one side-by-side per cycle
    for cyc, pv in sess.race.previews.items():
        st = m.trace.steps[cyc]
        assert pv.policy == "static" and pv.root == st.root                      # same context
    walls = [d.trace.steps[-1].cumulative["wall_s"] for d in (m, c, p)]
    assert len(set(walls)) == 3 and all(w > 0 for w in walls)
    v = sess.view()
    assert [s["role"] for s in v.series] == ["main", "compare", "plain"]
    outs = render(v)
    assert list(outs) == list(DASH)
    by_role = {s["role"]: s for s in v.series}
    xs, ys = viz.speedup_series(by_role["main"], by_role["plain"])
    assert ys and all(y > 0 for y in ys)


def test_auto_budget_policy_in_a_session(bundle):
    """eagle2-auto in the page: lossless against plain, N within the slider's cap, its choice
    explained, and the comparison previews drawn with the comparison decoder's own policy."""
    sess = solo(bundle, "Write a haiku about autumn leaves.", 4, policy="eagle2-auto", compare="eagle2",
                total_tokens=12, depth=4, max_new_tokens=40)
    m, p = sess.race.main, sess.race.plain
    n = len(m.generated)
    assert n > 4 and p.generated[:n] == m.generated
    assert sess.race.labels()[0] == "eagle2-auto" and sess.race.previews[1].policy == "eagle2"
    steps = [s for s in m.trace.steps if s.tree is not None]
    assert steps and all(1 <= s.tree.record.n <= 12 for s in steps)
    assert all(sum(map(bool, s.tree.kept)) == s.tree.record.n for s in steps)
    assert all(max(s.tree.depths) <= 5 for s in steps)  # depth 4 expansions reach depth 5 at most
    text = viz.explain_text(steps[-1], viz.explain.RERANK)
    assert f"N = {steps[-1].tree.record.n}" in text and "Hardware-aware budget" in text
    assert list(render(sess.view())) == list(DASH)
    with pytest.raises(UserError, match="total tokens"):
        Settings.from_ui(*settings_ui(policy="eagle2-auto", total_tokens=0))


def test_settings_change_mid_run_applies_from_next_cycle(bundle):
    sess = solo(bundle, "Say hello.", 1)
    notes = sess.race.apply(Settings(**dict(SMALL, policy="static", temperature=0.5, seed=3)))
    assert any("seed" in n for n in notes)
    sess.tick()
    steps = sess.race.main.trace.steps
    assert steps[1].policy == "eagle2" and steps[2].policy == "static"
    assert sess.race.main.sampling.temperature == 0.5
    assert sess.race.labels()[:2] == ("static", "static (compare)")


def test_user_errors_warn_and_keep_the_session(bundle):
    sess = solo(bundle, "Say hello.", 1)
    before = len(sess.race.main.trace.steps)
    with pytest.warns(UserWarning, match="prompt is empty"):
        out = live.on_step(sess, "   ", *ui())
    assert list(out) == list(outputs.LIVE) and all(isinstance(o, SKIP) for n, o in out.items() if n != "status")
    assert "The prompt is empty: type something" in out["status"]               # the status line says it too,
    assert out["status"].startswith(live_status(sess))                # under where the session stands
    with pytest.warns(UserWarning, match="Depth must be a whole number"):
        live.on_step(sess, "Say hello.", *ui(depth=2.5))
    with pytest.warns(UserWarning, match="depth must be an integer in"):
        live.on_step(sess, "Say hello.", *ui(depth=0))
    with pytest.warns(UserWarning, match="Shorten it"):
        live.on_step(sess, "word " * 9000, *ui())              # longer than the model's context
    assert len(sess.race.main.trace.steps) == before and sess.prompt == "Say hello."
    out = live.on_step(sess, "Say hello.", *ui())             # still usable
    assert out["session"] is sess and len(sess.race.main.trace.steps) == before + 1
    sess.race.apply(Settings(**dict(SMALL, max_new_tokens=len(sess.race.main.generated) + 1)))
    while not sess.finished:
        sess.tick()
    with pytest.warns(UserWarning, match="has finished"):
        live.on_step(sess, "Say hello.", *ui())


def test_a_refused_step_says_what_to_do_on_the_status_line():
    """Step or Run with an empty prompt on a new page: one warning, and the status line (which
    read "... until you press Step") says what to do; no session is made, nothing else changes."""
    for press, names in ((lambda: live.on_step(None, "  ", *ui()), outputs.LIVE),
                         (lambda: live.on_run(None, "", *ui()), outputs.RUN)):
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = press()
        assert [str(x.message) for x in w] == [
            "The prompt is empty: type something in the prompt box (or pick an example), then press Step."]
        assert out["status"] == f"**{w[0].message}**"
        assert list(out) == list(names)
        assert all(isinstance(o, SKIP) for n, o in out.items() if n in outputs.LIVE and n != "status")   # no session
        if "run_timer" in names:
            assert out["run_timer"].active is False          # a refused Run does not tick on


def test_the_prompt_starts_with_an_example():
    """A first visitor can press Step at once: the prompt box holds the first example prompt,
    which the example picker also offers; the page says it shows the recorded trace until Step."""
    from ui.traces import load_examples
    first = next(iter(load_examples().values()))[0]
    cfg = build_app(device="cpu").config
    props = {c["props"].get("elem_id"): c["props"] for c in cfg["components"]}
    assert props["prompt"]["value"] == first and first.strip()
    assert any(label.endswith(f" · {first}") for label, _ in props["examples"]["choices"])
    assert props["examples"].get("value") is None          # picking the first example still fills it
    assert "until you press **Step**" in props["live-status"]["value"]


def test_malformed_trace_upload_gives_clear_error_and_keeps_state(tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something/else", "steps": []}))
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"schema": "eagle2-viz/trace/v1", "meta": {}, "steps": [{"cycle": 0}]}))
    for path, msg in ((bad_json, "not valid JSON"), (other, "not an eagle2-viz trace"), (broken, "malformed")):
        with pytest.warns(UserWarning, match=msg):
            out = replay.on_replay_load(None, str(path), 0, "path value", False)
        assert list(out) == list(outputs.REPLAY)
        assert all(isinstance(o, SKIP) for o in out.values())              # nothing replaced
    traces = shipped_traces()
    name = next(iter(traces))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = replay.on_replay_load(name, None, 0, "path value", False)
    assert list(out) == list(outputs.REPLAY)
    view = out["view"]
    assert isinstance(view, View) and len(view.steps) >= 2
    cyc = view.drafted[0]
    again = replay.on_replay_view(view, cyc, "draft prob", True)
    assert list(again) == list(DASH)
    assert again["tree"].layout.title.text.startswith(f"Cycle {cyc} ")


def unreadable_uploads(tmp_path) -> dict[str, tuple[Path, str]]:
    """name -> (file, what its warning must say): every way an upload can fail to be a trace."""
    from ui.traces import MAX_UPLOAD_MB
    good = json.loads(next(iter(shipped_traces().values())).read_text(encoding="utf-8"))

    def edited(change) -> str:
        d = json.loads(json.dumps(good))
        change(d)
        return json.dumps(d)

    def cyclic_tree(d):
        d["steps"][2]["tree"]["parents"][1:3] = [2, 1]       # two nodes each other's parent
    files = {
        "deep list": ("[" * 100_000, "nested far too deeply"),
        "deep object": ('{"a":' * 100_000, "nested far too deeply"),
        "deep but parseable": (edited(lambda d: d["meta"].update(x=json.loads("[" * 500 + "]" * 500))),
                               "nests more than 32 levels"),
        "binary": (bytes(range(256)) * 64, "not a text file"),
        "empty": ("", "the file is empty"),
        "bad json": ("{oops", "not valid JSON"),
        "a list": ("[1, 2, 3]", "not an eagle2-viz trace"),
        "no steps": (edited(lambda d: d.update(steps=[])), "has no steps"),
        "meta not an object": (edited(lambda d: d.update(meta=5)), "malformed"),
        "a step's field": (edited(lambda d: d["steps"][1].update(timings=None)),
                           "the trace is malformed (steps[1].timings: expected dict, got None)"),
        "cyclic tree": (edited(cyclic_tree), "parent is not an earlier node"),
        "a series' counts": (edited(lambda d: d["meta"]["viz"]["series"][0]["accepted"].__setitem__(1, 10 ** 9)),
                             "accepted count is out of range"),        # would allocate GBs in a histogram
    }
    out = {}
    for i, (name, (data, msg)) in enumerate(files.items()):
        p = tmp_path / f"upload-{i}.json"
        p.write_bytes(data if isinstance(data, bytes) else data.encode("utf-8"))
        out[name] = (p, msg)
    huge = tmp_path / "huge.json"
    with open(huge, "wb") as f:
        f.truncate((MAX_UPLOAD_MB + 1) * 2 ** 20)                    # sparse: no disk used
    out["huge"] = (huge, f"up to {MAX_UPLOAD_MB} MB")
    return out


def test_unreadable_uploads_give_one_clear_warning_and_keep_state(tmp_path, monkeypatch):
    """Whatever an uploaded file holds (JSON nested 100,000 deep, binary garbage, an empty or a
    huge file, the wrong shape), the Replay tab gives exactly one warning, "Could not read this
    trace: ...", never Python's own error (no "maximum recursion depth"), and replaces nothing. A
    trace that reads but does not draw gives one warning too. A real trace still loads after."""
    shown = replay.on_replay_load(next(iter(shipped_traces())), None, 0, "path value", False)
    for name, (path, msg) in unreadable_uploads(tmp_path).items():
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = replay.on_replay_load(None, str(path), 0, "path value", False, OPEN)
        # a collection the deep file triggers may finalise other tests' event loops: their
        # ResourceWarnings are not the page's
        said = [str(x.message) for x in w if not issubclass(x.category, ResourceWarning)]
        assert len(said) == 1 and said[0].startswith("Could not read this trace: "), (name, said)
        assert msg in said[0] and "recursion" not in said[0], (name, said)
        assert list(out) == list(outputs.REPLAY) and all(isinstance(o, SKIP) for o in out.values()), name
    good = tmp_path / "good.json"
    good.write_text(next(iter(shipped_traces().values())).read_text(encoding="utf-8"), encoding="utf-8")

    def no_figures(*a, **k):
        raise ValueError("no figures today")
    with monkeypatch.context() as m:                      # reads, but the figures fail: still one warning
        m.setattr(handlers, "render", no_figures)
        with warnings.catch_warnings(record=True) as w:
            warnings.simplefilter("always")
            out = replay.on_replay_load(None, str(good), 0, "path value", False, OPEN)
        assert [str(x.message) for x in w] == [
            "Could not read this trace: it could not be drawn (ValueError: no figures today)."]
        assert all(isinstance(o, SKIP) for o in out.values())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = replay.on_replay_load(None, str(good), 0, "path value", False, OPEN)
    assert out["view"].source == "good.json" and len(out["view"].steps) == len(shown["view"].steps)


def test_export_and_replay_roundtrip(bundle, tmp_path):
    sess = solo(bundle, "Name a fruit.", 2)
    files = handlers.on_export("live", sess, None)
    assert [Path(f).suffix for f in files] == [".json", ".csv", ".html"]
    by_ext = {Path(f).suffix: Path(f) for f in files}
    tr = TRACES.load(by_ext[".json"])
    v = View.from_trace(tr, "x")
    from ui.traces import read_upload
    assert len(read_upload(by_ext[".json"]).steps) == len(tr.steps)    # an export passes the upload checks
    assert [s["role"] for s in v.series] == ["main", "compare", "plain"] and set(v.previews) == {1, 2}
    assert by_ext[".csv"].read_text().splitlines()[0].startswith("cycle,policy,accepted")
    assert "draft nodes" in by_ext[".html"].read_text()
    ex = explain.on_explain("Replay trace", None, v, 2, None)
    assert list(ex) == list(outputs.EXPLAIN)
    assert ex["phase"].value == "Expand level 1" and "Expansion level 1" in ex["text"]
    ex = explain.on_explain("Replay trace", None, v, 2, "Expand level 1", move=-1)
    assert ex["phase"].value == "Expand level 1"
    last = explain.on_explain("Replay trace", None, v, 2, "Verify", move=1)
    assert last["phase"].value == "Accept" and "Acceptance" in last["text"]


def test_cuda_without_gpu_falls_back_to_cpu_with_a_warning(monkeypatch):
    import eagle2.model.loading as loading
    calls = []

    def fake_load(target=None, head=None, device="cpu", dtype=None):
        calls.append(device)
        if device.startswith("cuda"):
            raise UserError("CUDA was requested but no GPU is available here: use --device cpu.")
        return fake

    fake = SimpleNamespace(token_texts=lambda ids: ["x"] * len(ids))
    monkeypatch.setattr(loading, "load_bundle", fake_load)
    # the fake has no model to time: that step is not what this test is about
    monkeypatch.setattr(ModelHolder, "_measure_costs", lambda self, b: None)
    holder = ModelHolder()
    holder.start(device="cuda")
    assert holder.get(timeout=30) is fake and calls == ["cuda", "cpu"]
    assert "no GPU" in holder.warning and "CPU instead" in holder.warning
    failing = ModelHolder()
    monkeypatch.setattr(loading, "load_bundle", lambda **kw: (_ for _ in ()).throw(UserError("no weights")))
    failing.start()
    with pytest.raises(UserError, match="could not be loaded: no weights"):
        failing.get(timeout=30)
    assert "failed to load" in failing.info_md()


def test_a_bug_while_loading_the_model_is_logged_and_shown(monkeypatch, caplog):
    """What a user can fix (UserError, OSError: missing weights, no network, a full disk) is said
    as it is; anything else is a bug: its traceback goes to the log, the page says it failed."""
    import eagle2.model.loading as loading
    monkeypatch.setattr(loading, "load_bundle", lambda **kw: (_ for _ in ()).throw(OSError("No space left")))
    full = ModelHolder()
    with caplog.at_level("ERROR", logger="ui.model"):
        full.start()
        with pytest.raises(UserError, match="could not be loaded: OSError: No space left"):
            full.get(timeout=30)
    assert not caplog.records                       # expected: no traceback
    # a bundle the real steps cannot use (compiling it raises AttributeError): nothing swallows it
    monkeypatch.setattr(loading, "load_bundle", lambda **kw: SimpleNamespace())
    broken = ModelHolder()
    with caplog.at_level("ERROR", logger="ui.model"):
        broken.start()
        with pytest.raises(UserError, match="unexpected AttributeError"):
            broken.get(timeout=30)
    assert broken.stage == "failed" and "model failed to load: unexpected AttributeError" in broken.info_md()
    [rec] = caplog.records
    assert rec.exc_info and rec.exc_info[0] is AttributeError     # logged with its traceback


@pytest.mark.slow  # a Run of real-model Steps
def test_run_is_a_chain_of_queued_steps_until_stop_or_the_end(bundle):
    """Run steps once and starts its timer; each tick is one more Step (its own queued event, so
    other visitors' Steps take turns with it), the race's own prompt going on whatever the prompt
    box holds; Stop ends it after the cycle in progress; Run again goes on to the end, where the
    timer stops."""
    M = 24
    first = live.on_run(None, "Say hello.", *ui(max_new_tokens=M))
    assert list(first) == list(outputs.RUN)
    sess = first["session"]
    assert "cycle 1" in first["status"] and first["run_timer"].active and sess.running
    tick = live.on_run_tick(sess, "an edited prompt box", *ui(max_new_tokens=M))
    assert "cycle 2" in tick["status"] and sess.prompt == "Say hello." and tick["run_timer"].active
    handlers.on_stop(sess)                  # Stop: the next tick steps no more and stops the timer
    stopped = live.on_run_tick(sess, "Say hello.", *ui(max_new_tokens=M))
    assert stopped["run_timer"].active is False and isinstance(stopped["status"], SKIP)
    assert len(sess.race.main.trace.steps) == 3 and not sess.finished   # prefill + 2 cycles
    n = len(sess.race.main.trace.steps)
    outs = [live.on_run(sess, "Say hello.", *ui(max_new_tokens=M))]   # Run again: to the end
    while outs[-1]["run_timer"].active:
        assert len(outs) <= M, "the run never ended"
        outs.append(live.on_run_tick(sess, "Say hello.", *ui(max_new_tokens=M)))
    assert sess.finished == "max_new_tokens" and len(sess.race.main.generated) == M and not sess.running
    assert len(outs) == len(sess.race.main.trace.steps) - n                   # one update per cycle
    assert "finished" in outs[-1]["status"]
