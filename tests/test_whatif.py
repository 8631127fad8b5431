"""The two speedups and the what-if (viz/whatif.py): runs priced with price tables, on hand-built
runs whose prices are worked out by hand below. No model, no browser."""
from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

import viz
from eagle2.cycle.trace import StepTrace
from eagle2.cycle.tree import DraftTree
from eagle2.model.verify_times import RECORD_KEY, VerifyTimes
from eagle2.policies.registry import TRACES
from eagle2.cycle.series import series
from viz.charts import forward_speedup, truncate
from viz.whatif import PriceTable, gpu_model_table, price_run, price_table_from_trace, run_cycles, whatif_chart

ROOT = Path(__file__).resolve().parent.parent


def tree(n: int, calls: int) -> DraftTree:
    """A chain of n verified nodes (root included) plus one dropped node."""
    m = n + 1
    return DraftTree(tokens=list(range(m)), parents=[-1] + list(range(n - 1)) + [0], depths=list(range(n)) + [1],
                     ranks=[0] * n + [1], logp=[0.0] * m, values=[0.0] * m, levels=list(range(-1, n - 1)) + [0],
                     kept=[True] * n + [False], draft_calls=calls)


def run(cycles, policy="pol", prefill_s=0.5) -> list[StepTrace]:
    """Steps of a speculative run: a prefill emitting one token, then one step per
    (N verified, draft calls, tokens emitted, verify_s, draft_s)."""
    steps = [StepTrace(cycle=0, policy=policy, new_tokens=[0], new_texts=["a"], accepted_len=0, bonus=None,
                       timings={"draft_s": 0.0, "verify_s": prefill_s, "commit_s": 0.0, "total_s": prefill_s},
                       cumulative={"tokens": 1, "target_forwards": 1, "wall_s": prefill_s, "draft_calls": 0})]
    toks, wall, calls = 1, prefill_s, 0
    for c, (n, d, k, vs, ds) in enumerate(cycles, 1):
        toks, wall, calls = toks + k, wall + vs + ds, calls + d
        steps.append(StepTrace(
            cycle=c, policy=policy, new_tokens=list(range(k)), new_texts=["x"] * k, accepted_len=k - 1, bonus=1,
            timings={"draft_s": ds, "verify_s": vs, "commit_s": 0.0, "total_s": vs + ds},
            cumulative={"tokens": toks, "target_forwards": c + 1, "wall_s": wall, "draft_calls": calls},
            tree=tree(n, d)))
    return steps


def plain_run(n_tokens: int, t1: float = 0.01, prefill_s=0.5) -> list[StepTrace]:
    steps = [StepTrace(cycle=0, policy="plain", new_tokens=[0], new_texts=["a"], accepted_len=0, bonus=None,
                       timings={"draft_s": 0.0, "verify_s": prefill_s, "commit_s": 0.0, "total_s": prefill_s},
                       cumulative={"tokens": 1, "target_forwards": 1, "wall_s": prefill_s, "draft_calls": 0})]
    for c in range(1, n_tokens):
        steps.append(StepTrace(cycle=c, policy="plain", new_tokens=[c], new_texts=["x"], accepted_len=0, bonus=None,
                               timings={"draft_s": 0.0, "verify_s": t1, "commit_s": 0.0, "total_s": t1},
                               cumulative={"tokens": c + 1, "target_forwards": c + 1, "wall_s": prefill_s + c * t1,
                                           "draft_calls": 0}))
    return steps


# 3 cycles after the prefill: N verified, draft calls, tokens emitted, verify_s, draft_s
CYCLES = [(4, 2, 3, 0.02, 0.02), (4, 2, 1, 0.04, 0.03), (8, 3, 4, 0.05, 0.06)]
FLAT = PriceTable("flat", "model", VerifyTimes({1: 1.0}), draft_call_s=0.0)
STEEP = PriceTable("steep", "model", VerifyTimes({1: 1.0, 8: 8.0}), draft_call_s=0.5)  # t(N) = N


def test_series_carries_what_pricing_needs():
    s = series("pol", run(CYCLES))
    assert s["verified"] == [0, 4, 4, 8] and s["draft_calls"] == [0, 2, 2, 3]
    assert s["verify_s"] == [0.5, 0.02, 0.04, 0.05] and s["draft_s"] == [0.0, 0.02, 0.03, 0.06]
    assert truncate(s, 2)["verified"] == [0, 4] and truncate(s, 2)["draft_s"] == [0.0, 0.02]
    p = series("plain", plain_run(4), "plain")
    assert p["verified"] == [0, 1, 1, 1] and p["draft_calls"] == [0, 0, 0, 0]
    assert run_cycles(s) == [{"cycle": 1, "tokens": 3, "n": 4, "draft_calls": 2},
                             {"cycle": 2, "tokens": 1, "n": 4, "draft_calls": 2},
                             {"cycle": 3, "tokens": 4, "n": 8, "draft_calls": 3}]
    # traces recorded before trees kept their draft-call count: the cumulative count's growth
    old = run(CYCLES)
    for st in old[1:]:
        st.tree.draft_calls = 0
    assert series("pol", old)["draft_calls"] == [0, 2, 2, 3]


def test_the_gpu_model_is_flat_then_linear():
    g = gpu_model_table()
    assert [g.times.t(n) for n in (1, 25, 61, 64, 96, 128, 256)] == pytest.approx([1, 1, 1, 1, 1.5, 2, 4])


def test_flat_table_gives_the_tokens_per_cycle():
    p = price_run(run(CYCLES), FLAT)
    # plain: 8 tokens x t(1) = 8; speculative: three cycles at t(N) = 1 and free drafting = 3
    assert (p["cycles"], p["tokens"], p["plain"], p["speculative"]) == (3, 8, 8.0, 3.0)
    assert p["speedup"] == pytest.approx(8 / 3) and p["tokens_per_cycle"] == pytest.approx(8 / 3)
    assert [c["speedup"] for c in p["per_cycle"]] == pytest.approx([3, 1, 4])
    assert [c["running"] for c in p["per_cycle"]] == pytest.approx([3, 2, 8 / 3])
    # a series prices the same as its steps
    assert price_run(series("pol", run(CYCLES)), FLAT)["speedup"] == pytest.approx(8 / 3)


def test_steep_table_makes_the_speculative_run_lose():
    p = price_run(run(CYCLES), STEEP)
    # verify 4 + 4 + 8 = 16, drafting (2 + 2 + 3) x 0.5 = 3.5, plain 8 x 1 = 8
    assert (p["verify"], p["draft"], p["speculative"], p["plain"]) == pytest.approx((16, 3.5, 19.5, 8))
    assert p["speedup"] == pytest.approx(8 / 19.5) and p["speedup"] < 1
    assert p["mean_n"] == pytest.approx(16 / 3)
    assert (p["verify_per_cycle"], p["draft_per_cycle"], p["cost_per_cycle"]) == pytest.approx((16 / 3, 3.5 / 3, 6.5))


def test_gpu_model_is_labelled_not_measured():
    g = gpu_model_table()
    assert g.source == "model" and g.label == \
        "GPU model (not measured): t(N) = t(1) up to N = 64, then linear"
    assert g.draft_call_s == pytest.approx(0.1 * g.times.t(1))
    # verify 3 x 1, drafting 7 x 0.1: 8 / 3.7
    assert price_run(run(CYCLES), g)["speedup"] == pytest.approx(8 / 3.7)
    fig = whatif_chart([series("pol", run(CYCLES)), series("plain", plain_run(9), "plain")], [g])
    text = json.dumps(fig.to_plotly_json(), default=str)
    assert "GPU model (not measured): t(N) = t(1) up to N = 64," in text and "then linear" in text
    bar = fig.data[0]
    assert list(bar.x) == ["wall clock<br>here", "priced:<br>GPU model<br>(not measured)"]
    assert bar.marker.pattern.shape == ("", "/")                       # hatched: a model, not a measurement


def test_price_table_from_the_runs_own_timings():
    main, plain = run(CYCLES), series("plain", plain_run(9, t1=0.01), "plain")
    tab = price_table_from_trace(main, {}, [plain])
    assert tab.label == "this machine (estimated from this run)" and tab.source == "measured"
    # median verify_s per N: N=1 from plain (0.01), N=4 median(0.02, 0.04) = 0.03, N=8 0.05
    assert tab.times.points == pytest.approx({1: 0.01, 4: 0.03, 8: 0.05})
    # draft_s / draft_calls: 0.02/2, 0.03/2, 0.06/3 -> median 0.015
    assert tab.draft_call_s == pytest.approx(0.015)
    p = price_run(main, tab)
    # plain 8 x 0.01 = 0.08; speculative 0.03 + 0.03 + 0.05 + 7 x 0.015 = 0.215
    assert p["speedup"] == pytest.approx(0.08 / 0.215)
    # a plain series recorded before the pricing keys: its seconds per cycle stand for t(1)
    old = {k: v for k, v in plain.items() if k not in ("verified", "draft_calls", "verify_s", "draft_s")}
    assert price_table_from_trace(main, None, [old]).times.points[1] == pytest.approx(0.01)
    # nothing tells t(1): no table
    assert price_table_from_trace(main, {}, []) is None


def test_price_table_measured_by_the_engine():
    meta = json.loads(json.dumps({RECORD_KEY: {1: 0.05, 64: 0.15, "bad": 1}}))   # keys become strings
    tab = price_table_from_trace(run(CYCLES), meta)
    assert tab.label == "this machine (measured t(N))" and tab.source == "measured"
    assert tab.times.points == {1: 0.05, 64: 0.15} and tab.draft_call_s == pytest.approx(0.015)
    assert tab.times.t(8) == pytest.approx(0.05 + 7 * 0.1 / 63)


def test_big_tree_pays_on_the_gpu_model_small_trees_here():
    """The picture the what-if gives a CPU visitor: with a CPU's t(N) (measured here: 60 tokens cost
    about 2.5 single-token forwards) a small tree wins; on the GPU model the 60-node tree wins."""
    cpu = PriceTable("this machine (measured t(N))", "measured",
                     VerifyTimes({1: 0.054, 8: 0.047, 16: 0.062, 64: 0.141}), draft_call_s=0.009)
    small = run([(8, 3, 3, 0.05, 0.03)] * 10)       # N = 8, 3 draft calls, 3 tokens a cycle
    big = run([(60, 6, 4, 0.14, 0.06)] * 10)        # N = 60, 6 draft calls, 4 tokens a cycle
    here_small, here_big = price_run(small, cpu)["speedup"], price_run(big, cpu)["speedup"]
    # 30 x 0.054 / 10 (0.047 + 3 x 0.009) and 40 x 0.054 / 10 (t(60) + 6 x 0.009), t(60) between 16 and 64
    assert here_small == pytest.approx(1.62 / 0.74)
    assert here_big == pytest.approx(2.16 / (10 * (0.062 + 44 / 48 * 0.079) + 0.54))
    gpu_small, gpu_big = price_run(small, gpu_model_table())["speedup"], price_run(big, gpu_model_table())["speedup"]
    assert gpu_small == pytest.approx(30 / 13) and gpu_big == pytest.approx(40 / 16)
    assert here_small > here_big and gpu_big > gpu_small


def test_metric_cards_show_both_speedups_and_why():
    main, plain = series("pol", run(CYCLES)), series("plain", plain_run(9), "plain")
    m = viz.metrics(main, [plain])
    # 9 tokens: plain needed 9 forwards, the tree 4 -> 2.25 (= tau); wall: 0.5 + 0.08 vs 0.5 + 0.22
    assert m["forward_speedups"]["plain"] == pytest.approx(9 / 4) and m["decoders"][0]["tau"] == pytest.approx(9 / 4)
    assert m["speedups"]["plain"] == pytest.approx(0.58 / 0.72)
    h = viz.metrics_html(m)
    card = re.search(r'<b>pol</b> vs plain: speedup</div>(.*?)</div></div></div>', h).group(1)
    assert re.findall(r'<div class="mval"[^>]*>([^<]*)</div><div class="mlab"><small>([^<]*)<br>([^<]*)</small>',
                      card) == [("0.81×", "wall clock,", "this machine"), ("2.25×", "in target", "forward passes")]
    assert "Why the two differ:</b> on this machine a cycle's verification of N tokens costs t(N)/t(1) times " \
           "one token's forward, plus drafting." in h
    p = price_run(main, STEEP)
    h = viz.metrics_html(m, why=p)
    line = re.search(r"Why the two differ:</b>([^<]*)", h).group(1)
    assert "N ≈ 5 costs 5.3×, drafting 1.2×, so a cycle costs 6.5 forwards' time for its 2.7 tokens" in line
    assert "(0.41× at these prices)" in line
    # against a speculative decoder: forwards at equal tokens (linear between its cycles)
    other = dict(main, label="other", tokens=[1, 3, 9], forwards=[1, 2, 3])
    assert forward_speedup(main, other) == pytest.approx(3 / 4)
    assert viz.metrics(main, [other])["forward_speedups"]["other"] == pytest.approx(0.75)


def test_chart_prices_each_speculative_decoder_beside_its_wall_clock():
    main = series("pol", run(CYCLES))
    cmp = dict(series("cmp", run([(2, 1, 2, 0.011, 0.01)] * 4)), role="compare")
    plain = series("plain", plain_run(9), "plain")
    here = price_table_from_trace(run(CYCLES), {}, [cmp, plain])
    fig = whatif_chart([main, cmp, plain], [here, gpu_model_table()])
    assert [b.name for b in fig.data] == ["pol", "cmp"]                          # plain is the 1x line
    assert list(fig.data[0].x) == ["wall clock<br>here", "priced:<br>this machine",
                                   "priced:<br>GPU model<br>(not measured)"]
    # t(N) from the three runs: N=1 0.01 (plain), N=2 0.011 (cmp), N=4 0.03, N=8 0.05; a draft call:
    # median of 0.01 (x4, cmp), 0.01, 0.015, 0.02 = 0.01. main: 8 x 0.01 / (0.03 + 0.03 + 0.05 + 7 x 0.01)
    assert here.times.points == pytest.approx({1: 0.01, 2: 0.011, 4: 0.03, 8: 0.05}) and here.draft_call_s == 0.01
    assert price_run(main, here)["speedup"] == pytest.approx(0.08 / 0.18)
    # what the run got (tokens per second against plain at 9 tokens), then its two prices
    assert fig.data[0].y == pytest.approx((0.58 / 0.72, 0.08 / 0.18, 8 / 3.7))
    assert fig.data[1].y[2] == pytest.approx(8 / (4 * 1.1))                     # N = 2 is free on the GPU model
    assert fig.data[0].text == ("0.81×", "0.44×", "2.16×")
    assert "This machine (t(N) estimated from this run):<br>t(1) = 10 ms, a draft call = 10 ms (run median)" \
        in fig.layout.annotations[0].text
    # a series recorded without per-cycle tree sizes is not priced, and the figure says so
    old = {k: v for k, v in cmp.items() if k not in ("verified", "draft_calls")}
    assert price_run(old, here) is None
    fig = whatif_chart([main, old, plain], [here, gpu_model_table()])
    assert [t.name for t in fig.data] == ["pol"]
    assert "cmp: not priced (trace lacks tree sizes)" in fig.layout.annotations[0].text
    empty = whatif_chart([series("pol", run([])), plain], [here])                # prefill only: nothing to price
    assert not empty.data and "once a tree has been verified" in empty.layout.annotations[0].text


@pytest.mark.parametrize("name", ["writing-greedy.json", "math-greedy.json"])
def test_recorded_traces_price_the_60_node_tree_higher_on_the_gpu_model(name):
    """Two fp32 EAGLE-2 (60, 5, 10) races recorded on a CPU (the page shipped them before it opened
    on eagle2-auto; tests/data keeps them): priced on their recording machine's t(N) and on the
    GPU model."""
    from ui.dashboard import DASH, render
    from ui.view import View
    v = View.from_trace(TRACES.load(ROOT / "tests" / "data" / f"fp32-eagle2-{name}"), "replay")
    out = render(v)
    assert list(out) == list(DASH) and "whatif" in DASH
    here = price_table_from_trace(v.steps, v.meta, v.series[1:])
    assert here.label == "this machine (measured t(N))"  # the recording machine's table travels in the trace
    p_here, p_gpu = price_run(v.series[0], here), price_run(v.series[0], gpu_model_table())
    # with the EAGLE-3 head the math trace's tree (tau 4.4) pays on the recording CPU as well
    assert p_here["mean_n"] == 60 and p_here["speedup"] < p_gpu["speedup"] and p_gpu["speedup"] > 1
    if name == "writing-greedy.json":
        assert p_here["speedup"] < 1  # ...the writing one's does not there
    wall = viz.metrics(v.series[0], v.series[1:])["speedups"]["plain"]
    assert list(out["whatif"].data[0].y) == pytest.approx([wall, p_here["speedup"], p_gpu["speedup"]])
    own = price_table_from_trace(v.steps, {}, v.series[1:])  # without it: estimated from the run's own timings
    assert own.label == "this machine (estimated from this run)"
    assert abs(price_run(v.series[0], own)["speedup"] - wall) < 0.1 * wall  # ...close to what it got
    assert "Why the two differ" in out["metrics"] and "in target<br>forward passes" in out["metrics"]


def test_the_why_line_says_what_the_cycles_took_when_they_were_split_into_phases():
    """With each cycle split into phases (eagle2/phases.py), the line says what the main decoder's
    cycles took against plain's own steps, measured; a run without the split keeps its price."""
    from eagle2.phases import PHASES, key

    def phased(steps, split):
        for st in steps[1:]:
            st.timings.update({key(p): split.get(p, 0.0) for p in PHASES})
        return steps

    # plain: a step is 0.01 s of forward + 0.002 s around it; a cycle: head 0.004, tree 0.002,
    # a 0.014 s forward over N = 4, 0.002 s around it, and 3 tokens (CYCLES[0]) each time
    main = series("pol", phased(run([CYCLES[0]] * 4), {"draft_head": 0.004, "draft_tree": 0.002,
                                                        "target_forward": 0.014, "accept": 0.002}))
    plain = series("plain", phased(plain_run(9), {"target_forward": 0.01, "accept": 0.002}), "plain")
    why = viz.measured_why(main, [plain])
    assert why["measured"] and why["cycles"] == 4 and why["mean_n"] == 4
    assert why["verify_per_cycle"] == pytest.approx(1.4) and why["draft_per_cycle"] == pytest.approx(0.6)
    assert why["cost_per_cycle"] == pytest.approx(0.022 / 0.012) and why["tokens_per_cycle"] == 3
    assert why["speedup"] == pytest.approx(3 * 0.012 / 0.022)
    line = re.search(r"Why the two differ:</b>([^<]*)", viz.metrics_html(viz.metrics(main, [plain]), why=why)).group(1)
    assert "as measured, N ≈ 4 took 1.4× plain's forward, drafting 0.6×, so a cycle took 1.8 plain steps' " \
           "time for its 3.0 tokens (1.64×)" in line
    assert "The race runs its decoders in turn, so each pays for the caches the others left it" in line
    assert viz.measured_why(series("pol", run(CYCLES)), [plain]) is None        # recorded before the split
    assert viz.measured_why(main, []) is None                                   # no plain decoder
