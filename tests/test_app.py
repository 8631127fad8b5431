"""The app's sessions and handlers: concurrent sessions through the real Gradio queue, errors that
keep the session usable, mid-run settings, exports and replay."""
from __future__ import annotations

import json
import socket
import threading
import time
import warnings
from pathlib import Path
from types import SimpleNamespace

import pytest

import app
import viz
from eagle2.trace import Trace

SMALL = dict(policy="eagle2", compare="static", total_tokens=10, depth=3, top_k=4, temperature=0.0,
             top_p=1.0, seed=0, max_new_tokens=8, side_by_side=True)
UI_ORDER = ["policy", "compare", "total_tokens", "depth", "top_k", "temperature", "top_p", "seed",
            "max_new_tokens", "side_by_side"]


def ui(**over):
    d = dict(SMALL, **over)
    return [d[k] for k in UI_ORDER] + ["path value", False]


@pytest.fixture(scope="module")
def bundle(real_bundle):
    """The default model (conftest's session bundle), installed as the app's loaded model."""
    app.MODEL.set(real_bundle)
    return real_bundle


def solo(bundle, prompt, ticks, **over):
    s = app.Settings(**dict(SMALL, **over))
    sess = app.Session()
    sess.start(bundle, prompt, s)
    for _ in range(ticks):
        sess.tick()
    return sess


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def table_text(table) -> str:
    """The 'text' column of the per-cycle table as returned by the API."""
    cols = table["headers"]
    return "".join(row[cols.index("text")] for row in table["data"])


def test_two_sessions_step_at_once_through_the_queue(bundle, monkeypatch):
    """Two browser sessions (two clients) step different prompts at the same time through the
    real queue; each ends with exactly the tokens of a solo run of its own prompt."""
    from gradio_client import Client
    prompts = ["Name three colours.", "What is the capital of France?"]
    ticks = 2
    expected = [solo(bundle, p, ticks) for p in prompts]
    port = free_port()
    spans, real = [], app.do_steps

    def timed(sess, prompt, *a, **k):  # record when each session's decoding runs, server side
        t0 = time.perf_counter()
        out = real(sess, prompt, *a, **k)
        spans.append((prompt, t0, time.perf_counter()))
        return out

    monkeypatch.setattr(app, "do_steps", timed)
    demo = app.launch("127.0.0.1", port, concurrency=2, block=False)
    try:
        results, errors = {}, []
        barrier = threading.Barrier(2)

        def drive(i):
            try:
                c = Client(f"http://127.0.0.1:{port}/", verbose=False, download_files=False)
                barrier.wait()
                out = None
                for _ in range(ticks):
                    out = c.predict(prompts[i], *ui(), api_name="/step")
                results[i] = out
            except Exception as e:  # reported below
                errors.append(repr(e))

        th = [threading.Thread(target=drive, args=(i,)) for i in range(2)]
        for t in th:
            t.start()
        for t in th:
            t.join(timeout=240)
        assert not errors, errors
        for i in range(2):
            status, table = results[i][0], results[i][10]
            exp = expected[i]
            want = viz.cycle_table(exp.main.trace.steps)
            assert f"cycle {ticks}" in status and f"{len(exp.main.generated)} tokens" in status
            assert table_text(table) == "".join(want["text"]), f"session {i} got another session's text"
            assert [r[0] for r in table["data"]] == list(range(ticks + 1))
        assert table_text(results[0][10]) != table_text(results[1][10])
        a = [(t0, t1) for p, t0, t1 in spans if p == prompts[0]]
        b = [(t0, t1) for p, t0, t1 in spans if p == prompts[1]]
        assert len(a) == len(b) == ticks
        assert any(x0 < y1 and y0 < x1 for x0, x1 in a for y0, y1 in b), "the sessions never decoded at once"
    finally:
        demo.close()


def test_lockstep_session_is_lossless_and_timed_separately(bundle):
    # room for 4 cycles even when the trained head accepts several tokens per cycle
    sess = solo(bundle, "Write a short story about a lighthouse keeper.", 4, max_new_tokens=40)
    m, c, p = sess.main, sess.cmp, sess.plain
    assert m.finished is None
    n = len(m.generated)
    assert c.generated[:n] == m.generated and p.generated[:n] == m.generated   # greedy: identical text
    assert len(c.generated) >= n and len(p.generated) >= n                      # caught up in lockstep
    assert set(sess.previews) == {1, 2, 3, 4}                                    # one side-by-side per cycle
    for cyc, pv in sess.previews.items():
        st = m.trace.steps[cyc]
        assert pv.policy == "static" and pv.root == st.root                      # same context
    walls = [d.trace.steps[-1].cumulative["wall_s"] for d in (m, c, p)]
    assert len(set(walls)) == 3 and all(w > 0 for w in walls)
    v = sess.view()
    assert [s["role"] for s in v.series] == ["main", "compare", "plain"]
    outs = app.render(v)
    assert len(outs) == app.N_DASH
    xs, ys = viz.speedup_series(v.series[0], v.series[2])
    assert ys and all(y > 0 for y in ys)


def test_auto_budget_policy_in_a_session(bundle):
    """eagle2-auto in the page: lossless against plain, N within the slider's cap, its choice
    explained, and the comparison previews drawn with the comparison decoder's own policy."""
    sess = solo(bundle, "Write a haiku about autumn leaves.", 4, policy="eagle2-auto", compare="eagle2",
                total_tokens=12, depth=4, max_new_tokens=40)
    m, p = sess.main, sess.plain
    n = len(m.generated)
    assert n > 4 and p.generated[:n] == m.generated
    assert sess.labels()[0] == "eagle2-auto" and sess.previews[1].policy == "eagle2"
    steps = [s for s in m.trace.steps if s.tree is not None]
    assert steps and all(1 <= s.tree.extra["auto_n"] <= 12 for s in steps)
    assert all(sum(map(bool, s.tree.kept)) == s.tree.extra["auto_n"] for s in steps)
    assert all(max(s.tree.depths) <= 5 for s in steps)  # depth 4 expansions reach depth 5 at most
    text = viz.explain_text(steps[-1], "rerank")
    assert f"N = {steps[-1].tree.extra['auto_n']}" in text and "Hardware-aware budget" in text
    assert len(app.render(sess.view())) == app.N_DASH
    with pytest.raises(app.UserError, match="total tokens"):
        app.Settings.from_ui(*ui(policy="eagle2-auto", total_tokens=0)[:10])


def test_settings_change_mid_run_applies_from_next_cycle(bundle):
    sess = solo(bundle, "Say hello.", 1)
    notes = sess.apply(app.Settings(**dict(SMALL, policy="static", temperature=0.5, seed=3)))
    assert any("seed" in n for n in notes)
    sess.tick()
    steps = sess.main.trace.steps
    assert steps[1].policy == "eagle2" and steps[2].policy == "static"
    assert sess.main.sampling.temperature == 0.5
    assert sess.labels()[:2] == ("static", "static (compare)")


def test_user_errors_warn_and_keep_the_session(bundle):
    sess = solo(bundle, "Say hello.", 1)
    before = len(sess.main.trace.steps)
    with pytest.warns(UserWarning, match="prompt is empty"):
        out = app.on_step(sess, "   ", *ui())
    assert all(isinstance(o, type(app.gr.skip())) for o in out)
    with pytest.warns(UserWarning, match="Depth must be a whole number"):
        app.on_step(sess, "Say hello.", *ui(depth=2.5))
    with pytest.warns(UserWarning, match="depth must be an integer in"):
        app.on_step(sess, "Say hello.", *ui(depth=0))
    with pytest.warns(UserWarning, match="Shorten it"):
        app.on_step(sess, "word " * 9000, *ui())              # longer than the model's context
    assert len(sess.main.trace.steps) == before and sess.prompt == "Say hello."
    out = app.on_step(sess, "Say hello.", *ui())             # still usable
    assert out[0] is sess and len(sess.main.trace.steps) == before + 1
    sess.apply(app.Settings(**dict(SMALL, max_new_tokens=len(sess.main.generated) + 1)))
    while not sess.finished:
        sess.tick()
    with pytest.warns(UserWarning, match="has finished"):
        app.on_step(sess, "Say hello.", *ui())


def test_malformed_trace_upload_gives_clear_error_and_keeps_state(tmp_path):
    bad_json = tmp_path / "bad.json"
    bad_json.write_text("{not json")
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"schema": "something/else", "steps": []}))
    broken = tmp_path / "broken.json"
    broken.write_text(json.dumps({"schema": "eagle2-viz/trace/v1", "meta": {}, "steps": [{"cycle": 0}]}))
    for path, msg in ((bad_json, "not valid JSON"), (other, "not an eagle2-viz trace"), (broken, "malformed")):
        with pytest.warns(UserWarning, match=msg):
            out = app.on_replay_load(None, str(path), 0, "path value", False)
        assert len(out) == 2 + app.N_DASH
        assert all(isinstance(o, type(app.gr.skip())) for o in out)        # nothing replaced
    traces = app.shipped_traces()
    name = next(iter(traces))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = app.on_replay_load(name, None, 0, "path value", False)
    view = out[0]
    assert isinstance(view, app.View) and len(view.steps) >= 2
    cyc = view.drafted[0]
    again = app.on_replay_view(view, cyc, "draft prob", True)
    assert again[2].layout.title.text.startswith(f"Cycle {cyc} ")


def test_export_and_replay_roundtrip(bundle, tmp_path):
    sess = solo(bundle, "Name a fruit.", 2)
    files = app.on_export("live", sess, None)
    assert [Path(f).suffix for f in files] == [".json", ".csv", ".html"]
    tr = Trace.load(files[0])
    v = app.View.from_trace(tr, "x")
    assert [s["role"] for s in v.series] == ["main", "compare", "plain"] and set(v.previews) == {1, 2}
    assert Path(files[1]).read_text().splitlines()[0].startswith("cycle,policy,accepted")
    assert "draft nodes" in Path(files[2]).read_text()
    ex = app.on_explain("Replay trace", None, v, 2, None)
    assert ex[1].value == "Expand level 1" and "Expansion level 1" in ex[3]
    ex = app.on_explain("Replay trace", None, v, 2, "Expand level 1", move=-1)
    assert ex[1].value == "Expand level 1"
    last = app.on_explain("Replay trace", None, v, 2, "Verify", move=1)
    assert last[1].value == "Accept" and "Acceptance" in last[3]


def test_cuda_without_gpu_falls_back_to_cpu_with_a_warning(monkeypatch):
    import eagle2.loading as loading
    calls = []

    def fake_load(target=None, head=None, device="cpu", dtype=None):
        calls.append(device)
        if device.startswith("cuda"):
            raise app.UserError("CUDA was requested but no GPU is available here: use --device cpu.")
        return fake

    fake = SimpleNamespace(token_texts=lambda ids: ["x"] * len(ids))
    monkeypatch.setattr(loading, "load_bundle", fake_load)
    holder = app.ModelHolder()
    holder.start(device="cuda")
    assert holder.get(timeout=30) is fake and calls == ["cuda", "cpu"]
    assert "no GPU" in holder.warning and "CPU instead" in holder.warning
    failing = app.ModelHolder()
    monkeypatch.setattr(loading, "load_bundle", lambda **kw: (_ for _ in ()).throw(app.UserError("no weights")))
    failing.start()
    with pytest.raises(app.UserError, match="could not be loaded: no weights"):
        failing.get(timeout=30)
    assert "failed to load" in failing.info_md()


def test_run_streams_until_stop_or_the_end(bundle):
    gen = app.on_run(None, "Say hello.", *ui(max_new_tokens=5))
    first = next(gen)
    sess = first[0]
    assert "cycle 1" in first[1]
    app.on_stop(sess)                       # Stop: the run ends after the cycle in progress
    rest = list(gen)
    assert len(rest) <= 1 and not sess.finished
    n = len(sess.main.trace.steps)
    outs = list(app.on_run(sess, "Say hello.", *ui(max_new_tokens=5)))   # Run again: to the end
    assert sess.finished == "max_new_tokens" and len(sess.main.generated) == 5
    assert len(outs) == len(sess.main.trace.steps) - n                   # one update per cycle
    assert "finished" in outs[-1][1]
