"""viz/ on a hand-built fixture trace (known tree, known accepted path) and on the shipped traces."""
from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest

import viz
from eagle2.cycle.trace import StepTrace, Trace
from eagle2.cycle.records import DDDRecord, DySpecRecord, RelaxationRecord
from eagle2.cycle.tree import DraftTree
from viz.charts import series, speedup_series, wall_at
from viz.tables import COLUMNS
from viz.tree_graph import BONUS, layout, tree_graph

ROOT = Path(__file__).resolve().parent.parent
LN = math.log

# Pool of the fixture tree (index: parent, token, rank, draft prob, level, kept)
#   0 root "The"
#   1 " cat" (p .6)  2 " dog" (p .3)  3 " a" (p .05, dropped)
#   4 " sat" under 1 (.7)  5 " is" under 1 (.2)  6 " ran" under 2 (.5)  7 "\n" under 2 (.1, dropped)
#   8 " on" under 4 (.9)   9 " down" under 4 (.05, dropped)
POOL = [(-1, 100, 0, 1.0, -1, True, "The"),
        (0, 101, 0, .6, 0, True, " cat"), (0, 102, 1, .3, 0, True, " dog"), (0, 103, 2, .05, 0, False, " a"),
        (1, 104, 0, .7, 1, True, " sat"), (1, 105, 1, .2, 1, True, " is"), (2, 106, 0, .5, 1, True, " ran"),
        (2, 107, 1, .1, 1, False, "\n"), (4, 108, 0, .9, 2, True, " on"), (4, 109, 1, .05, 2, False, " down")]
TARGET_P = {1: .8, 2: .1, 4: .7, 5: .2, 6: .3, 8: .4}


def make_tree(accepted: list[int]) -> DraftTree:
    depths, values = [], []
    for i, (par, *_rest) in enumerate(POOL):
        depths.append(0 if par < 0 else depths[par] + 1)
        values.append(0.0 if par < 0 else values[par] + LN(POOL[i][3]))
    n = len(POOL)
    return DraftTree(
        tokens=[p[1] for p in POOL], parents=[p[0] for p in POOL], depths=depths, ranks=[p[2] for p in POOL],
        logp=[0.0] + [LN(p[3]) for p in POOL[1:]], values=values, levels=[p[4] for p in POOL],
        kept=[p[5] for p in POOL], order=list(range(n)),
        target_prob=[TARGET_P.get(i) for i in range(n)],
        accepted=[i == 0 or i in accepted for i in range(n)],
        beam=[[1, 2, 3], [4, 6]], beam_mass=[LN(.95), LN(.57)], draft_calls=3)


def make_steps() -> list[StepTrace]:
    texts = [p[6] for p in POOL]
    s0 = StepTrace(cycle=0, policy="eagle2", new_tokens=[100], new_texts=["The"], accepted_len=0, bonus=None,
                   timings={"draft_s": 0, "verify_s": .5, "commit_s": 0, "total_s": .5},
                   cumulative={"tokens": 1, "target_forwards": 1, "wall_s": .5, "draft_calls": 0})
    s1 = StepTrace(cycle=1, policy="eagle2", new_tokens=[101, 104, 555], new_texts=[" cat", " sat", " <b>&"],
                   accepted_len=2, bonus=555, timings={"draft_s": .1, "verify_s": .2, "commit_s": 0, "total_s": .3},
                   cumulative={"tokens": 4, "target_forwards": 2, "wall_s": .8, "draft_calls": 3},
                   tree=make_tree([1, 4]), tree_texts=texts, accepted_path=[1, 4], root=100)
    s2 = StepTrace(cycle=2, policy="eagle2", new_tokens=[7], new_texts=["\n"], accepted_len=0, bonus=7,
                   timings={"draft_s": .1, "verify_s": .2, "commit_s": 0, "total_s": .3},
                   cumulative={"tokens": 5, "target_forwards": 3, "wall_s": 1.1, "draft_calls": 6},
                   tree=make_tree([]), tree_texts=texts, accepted_path=[], root=555, finished="eos")
    return [s0, s1, s2]


@pytest.fixture
def steps():
    return make_steps()


def trace_named(fig, name):
    found = [t for t in fig.data if t.name == name]
    assert found, f"no trace named {name!r} in {[t.name for t in fig.data]}"
    return found[0]


# ---------------------------------------------------------------- the tree
def test_graph_nodes_edges_and_path(steps):
    G = tree_graph(steps[1])
    assert G.number_of_nodes() == len(POOL) + 1          # pool + the bonus
    assert G.number_of_edges() == len(POOL) - 1 + 1
    assert list(G.predecessors(BONUS)) == [4]           # bonus hangs after the last accepted node
    assert G.nodes[BONUS]["depth"] == 3 and G.nodes[BONUS]["text"] == " <b>&"
    assert viz.path_nodes(G) == [0, 1, 4, BONUS]
    assert G.nodes[3]["kind"] == "dropped" and G.nodes[8]["kind"] == "kept"
    assert G.nodes[8]["pv"] == pytest.approx(.6 * .7 * .9)
    # nothing accepted: the bonus follows the root
    G2 = tree_graph(steps[2])
    assert list(G2.predecessors(BONUS)) == [0] and viz.path_nodes(G2) == [0, BONUS]


def test_tree_figure_nodes_and_highlighted_path(steps):
    fig = viz.tree_figure(steps[1])
    nodes = trace_named(fig, "draft nodes")
    assert sorted(int(c) for c in nodes.customdata) == [1, 2, 4, 5, 6, 8]   # kept, root excluded
    assert not [t for t in fig.data if t.name == "dropped by rerank"]
    path = trace_named(fig, "accepted path")
    assert list(path.x) == [0, 1, 2, 3]                                     # root, 2 accepted, bonus
    acc = trace_named(fig, "accepted")
    assert [int(c) for c in acc.customdata] == [1, 4]
    bonus = trace_named(fig, "bonus token")
    assert bonus.text[0] == "␣&lt;b&gt;&amp;"                               # visible space, escaped HTML
    assert bonus.x[0] == 3
    pos = dict(zip((int(c) for c in nodes.customdata), zip(nodes.x, nodes.y)))
    assert (path.x[1], path.y[1]) == pos[1] and (path.x[2], path.y[2]) == pos[4]
    assert "accepted 2 + bonus = 3 tokens" in fig.layout.title.text
    # dropped nodes appear, faded, when asked for
    fig2 = viz.tree_figure(steps[1], show_dropped=True)
    dropped = trace_named(fig2, "dropped by rerank")
    assert sorted(int(c) for c in dropped.customdata) == [3, 7, 9]
    assert dropped.marker.opacity < 1


def test_colours_map_to_values(steps):
    fig = viz.tree_figure(steps[1], colour_by="value")
    nodes = trace_named(fig, "draft nodes")
    t = steps[1].tree
    for c, col, size in zip(nodes.customdata, nodes.marker.color, nodes.marker.size):
        assert col == pytest.approx(math.exp(t.values[int(c)]))
    sizes = dict(zip((int(c) for c in nodes.customdata), nodes.marker.size))
    assert sizes[1] > sizes[4] > sizes[8] > sizes[5]                        # size grows with value
    assert (nodes.marker.cmin, nodes.marker.cmax) == (0.0, 1.0)
    assert nodes.marker.colorbar.title.text == "path value"
    fig_p = viz.tree_figure(steps[1], colour_by="prob")
    nodes_p = trace_named(fig_p, "draft nodes")
    for c, col in zip(nodes_p.customdata, nodes_p.marker.color):
        assert col == pytest.approx(math.exp(t.logp[int(c)]))
    assert nodes_p.marker.colorbar.title.text == "draft prob"


def test_hover_shows_whitespace_probabilities_and_status(steps):
    fig = viz.tree_figure(steps[1], show_dropped=True)
    nodes = trace_named(fig, "draft nodes")
    hov = dict(zip((int(c) for c in nodes.customdata), nodes.hovertext))
    assert "␣sat" in hov[4] and "draft prob  0.700" in hov[4] and "path value  0.420" in hov[4]
    assert "depth 2 · rank 0" in hov[4] and "target prob 0.700" in hov[4] and "accepted" in hov[4]
    assert "rejected" in hov[5]
    dropped = trace_named(fig, "dropped by rerank")
    hov_d = dict(zip((int(c) for c in dropped.customdata), dropped.text))
    assert "↵" in hov_d[7] and "dropped by rerank" in hov_d[7]


def _random_tree(seed=0, k=10, depth=5, n_keep=60):
    """An EAGLE-2-shaped pool (k + depth*k^2 nodes) with a realistic rerank."""
    rng = random.Random(seed)
    parents, depths, ranks, logp, values, levels = [-1], [0], [0], [0.0], [0.0], [-1]

    def add(par, lv):
        probs = sorted((rng.random() ** 3 for _ in range(k)), reverse=True)
        z = sum(probs) * 1.3
        out = []
        for r, p in enumerate(probs):
            parents.append(par); depths.append(depths[par] + 1); ranks.append(r)
            logp.append(LN(p / z)); values.append(values[par] + LN(p / z)); levels.append(lv)
            out.append(len(parents) - 1)
        return out
    beam = add(0, 0)
    for lv in range(1, depth + 1):
        new = [c for b in beam for c in add(b, lv)]
        beam = sorted(new, key=lambda i: -values[i])[:k]
    n = len(parents)
    keep = set(sorted(range(1, n), key=lambda i: -values[i])[: n_keep - 1])
    for i in list(keep):
        p = parents[i]
        while p > 0:
            keep.add(p); p = parents[p]
    kept = [i == 0 or i in keep for i in range(n)]
    tree = DraftTree(tokens=list(range(n)), parents=parents, depths=depths, ranks=ranks, logp=logp, values=values,
                     levels=levels, kept=kept, order=list(range(n)), target_prob=[None] * n,
                     accepted=[i == 0 for i in range(n)])
    return StepTrace(cycle=1, policy="eagle2", new_tokens=[5], new_texts=["x"], accepted_len=0, bonus=5,
                     timings={}, cumulative={}, tree=tree, tree_texts=[f"tok{i}" for i in range(n)],
                     accepted_path=[])


@pytest.mark.parametrize("show_dropped", [False, True])
def test_layout_labels_never_overlap_at_n60(show_dropped):
    st = _random_tree()
    assert len(st.tree.tokens) == 511
    G = tree_graph(st)
    vis = set(G.nodes) if show_dropped else {v for v in G.nodes if G.nodes[v]["kind"] != "dropped"}
    pos, rows = layout(G, vis)
    labelled = [v for v in vis if G.nodes[v]["kind"] != "dropped"]
    by_depth = {}
    for v in labelled:
        by_depth.setdefault(pos[v][0], []).append(pos[v][1])
    for ys in by_depth.values():
        ys.sort()
        assert all(b - a >= 1.0 - 1e-9 for a, b in zip(ys, ys[1:])), "labels at one depth closer than a row"
    assert all(pos[v][0] == G.nodes[v]["depth"] for v in vis)               # depth along x
    for v in vis:                                                           # parents span their children
        ch = [c for c in G.successors(v) if c in vis]
        if ch:
            assert min(pos[c][1] for c in ch) - 1e-9 <= pos[v][1] <= max(pos[c][1] for c in ch) + 1e-9
    fig = viz.tree_figure(st, show_dropped=show_dropped)
    assert 420 <= fig.layout.height <= 1500
    if show_dropped:
        assert rows < 2.2 * sum(1 for v in labelled if not any(c in labelled for c in G.successors(v)))


def test_figures_serialise(steps, tmp_path):
    figs = [viz.tree_figure(steps[1]), viz.tree_figure(steps[1], show_dropped=True)]
    s = [series("eagle2", steps, "main")]
    figs += [viz.race_chart(s), viz.acceptance_histogram(s), viz.calibration_chart(steps), viz.depth_chart(s),
             viz.speedup_chart(s[0], [dict(s[0], label="plain", role="plain")]),
             viz.whatif_chart(s, [viz.gpu_model_table()])]
    figs += [viz.explain_figure(steps[1], k) for k, _ in viz.phases(steps[1])]
    for fig in figs:
        d = json.loads(fig.to_json())
        assert d["data"], "figure without traces"
    path = tmp_path / "tree.html"
    figs[0].write_html(path, include_plotlyjs="cdn")
    assert "draft nodes" in path.read_text()


# ---------------------------------------------------------------- tokens, tables
def test_token_stream(steps):
    h = viz.token_stream_html(steps)
    spans = re.findall(r'<span class="(tok[^"]*)" data-cycle="(\d+)" data-role="(\w+)"[^>]*title="([^"]*)"', h)
    assert len(spans) == 5                                                   # 1 + 3 + 1 tokens
    assert [s[1] for s in spans] == ["0", "1", "1", "1", "2"]
    assert [s[2] for s in spans] == ["prefill", "accepted", "accepted", "bonus", "bonus"]
    assert sum("bonus" in s[0] for s in spans) == 2
    assert spans[3][3].startswith("cycle 1") and "bonus" in spans[3][3]
    assert "&lt;b&gt;&amp;" in h and "<b>&" not in h                         # token text escaped
    assert "↵" in h                                                          # newline visible
    assert 'background:#fde68a' in h and 'background:#bbf7d0' in h           # colour per cycle
    assert len(re.findall(r'data-cycle=', viz.token_stream_html(steps, upto=2))) == 4
    assert "empty" in viz.token_stream_html([])


def test_cycle_table(steps):
    df = viz.cycle_table(steps)
    assert list(df.columns) == COLUMNS
    assert list(df["cycle"]) == [0, 1, 2]
    assert list(df["accepted"]) == [0, 2, 0] and list(df["emitted"]) == [1, 3, 1]
    assert list(df["drafted"]) == [0, 9, 9] and list(df["verified"]) == [0, 6, 6]
    assert df["bonus"].iloc[1] == "␣<b>&" and df["text"].iloc[2] == "↵"
    assert df["tau"].iloc[-1] == pytest.approx(5 / 3, abs=1e-3)
    assert df["finished"].iloc[-1] == "eos"
    assert df["verify_ms"].iloc[1] == pytest.approx(200.0)


# ---------------------------------------------------------------- run-level charts
def test_series_speedup_and_metrics(steps):
    main = series("eagle2", steps, "main")
    assert main["tokens"] == [1, 4, 5] and main["accepted"] == [2, 0]
    assert main["verified"] == [0, 7, 7] and main["draft_calls"] == [0, 3, 3]       # root + 6 kept nodes
    assert main["verify_s"] == [.5, .2, .2] and main["draft_s"] == [0, .1, .1]
    plain = {"label": "plain", "role": "plain", "policy": "plain", "tokens": [1, 2, 3, 4, 5],
             "wall_s": [.5, 1.0, 1.5, 2.0, 2.5], "forwards": [1, 2, 3, 4, 5], "accepted": []}
    assert wall_at(plain, 2.5) == pytest.approx(1.25)
    xs, ys = speedup_series(main, plain)
    assert xs == [1, 4, 5] and ys == pytest.approx([1.0, 2.0 / .8, 2.5 / 1.1])
    m = viz.metrics(main, [plain])
    assert m["speedups"]["plain"] == pytest.approx(2.5 / 1.1)
    assert m["decoders"][0]["tau"] == pytest.approx(5 / 3)
    assert m["forward_speedups"]["plain"] == pytest.approx(5 / 3)                   # against plain: tau
    assert "2.27×" in viz.metrics_html(m) and "Slower than plain" not in viz.metrics_html(m)
    assert "1.67×" in viz.metrics_html(m) and "Why the two differ" in viz.metrics_html(m)
    # slower than plain after enough tokens: the page says why and what to try
    slow = dict(main, tokens=[1, 20], wall_s=[.5, 20.0], forwards=[1, 8])
    plain20 = dict(plain, tokens=list(range(1, 21)), wall_s=[.5 * i for i in range(1, 21)],
                   forwards=list(range(1, 21)))
    assert "Slower than plain" not in viz.metrics_html(viz.metrics(slow, [plain20]))  # nothing to suggest
    assert "Slower than plain" in viz.metrics_html(viz.metrics(slow, [plain20]), suggest="auto-x")
    assert "<b>auto-x</b>" in viz.metrics_html(viz.metrics(slow, [plain20]), suggest="auto-x")
    assert "Slower than plain" not in viz.metrics_html(viz.metrics(dict(slow, label="auto-x"), [plain20]),
                                                       suggest="auto-x")
    fig = viz.speedup_chart(main, [plain])
    assert list(fig.data[0].y) == pytest.approx(ys)
    race = viz.race_chart([main, plain])
    assert [list(t.y) for t in race.data] == [[0, 1, 4, 5], [0, 1, 2, 3, 4, 5]]


def test_acceptance_histogram_and_depth(steps):
    main = series("eagle2", steps, "main")
    h = viz.acceptance_histogram([main])
    assert list(h.data[0].x) == [0, 1, 2] and list(h.data[0].y) == pytest.approx([.5, 0, .5])
    assert viz.depth_acceptance(main) == pytest.approx([.5, .5])
    d = viz.depth_chart([main])
    assert list(d.data[0].y) == pytest.approx([.5, .5])


def test_calibration_accumulates_over_kept_nodes(steps):
    df = viz.calibration_data(steps)
    pv = df[df["kind"] == "path value"]
    assert pv["count"].sum() == 12                                          # 6 kept nodes x 2 steps
    assert pv["accepted"].sum() == 2                                        # nodes 1 and 4 in step 1
    top = pv[(pv["mean_confidence"] - .6).abs() < 1e-9].iloc[0]             # node 1 (value .6), alone in its bin
    assert (top["count"], top["accepted"], top["rate"]) == (2, 1, .5)
    dp = df[df["kind"] == "draft prob"]
    # conditional on the parent being accepted: step 1 -> kept children of 0, 1, 4; step 2 -> of 0
    assert dp["count"].sum() == 2 + 2 + 1 + 2
    fig = viz.calibration_chart(steps)
    assert {t.name for t in fig.data} == {"perfectly calibrated", "path value", "draft prob"}


# ---------------------------------------------------------------- explain mode
def test_explain_phases(steps):
    st = steps[1]
    keys = [k for k, _ in viz.phases(st)]
    assert keys == ["expand:0", "expand:1", "expand:2", "rerank", "verify", "accept"]
    f0 = viz.explain_figure(st, "expand:0")
    shown = trace_named(f0, "draft nodes")
    assert sorted(int(c) for c in shown.customdata) == [1, 2, 3]            # only level-1 nodes so far
    assert len(trace_named(f0, "selected for expansion").x) == 3
    f1 = viz.explain_figure(st, "expand:1")
    assert len(trace_named(f1, "selected for expansion").x) == 2            # beam[1] = [4, 6]
    fr = viz.explain_figure(st, "rerank")
    assert sorted(int(c) for c in trace_named(fr, "dropped by rerank").customdata) == [3, 7, 9]
    fv = viz.explain_figure(st, "verify")
    nodes = trace_named(fv, "draft nodes")
    assert [c for c in nodes.marker.color] == pytest.approx([TARGET_P[int(c)] for c in nodes.customdata])
    fa = viz.explain_figure(st, "accept")
    assert list(trace_named(fa, "accepted path").x) == [0, 1, 2, 3]
    # nodes keep their vertical order across phases, and the depth axis stays put
    p0 = dict(zip(shown.customdata, shown.y))
    pr = dict(zip(trace_named(fr, "draft nodes").customdata, trace_named(fr, "draft nodes").y))
    common = [c for c in p0 if c in pr]
    assert sorted(common, key=p0.get) == sorted(common, key=pr.get)
    assert f0.layout.xaxis.range == fr.layout.xaxis.range
    assert "2 draft tokens accepted" not in viz.explain_text(st, "accept")
    txt = viz.explain_text(st, "accept")
    assert "Accepted here: 2 draft tokens" in txt and "emits 3 tokens" in txt
    assert "keeps the 6 of highest value" in viz.explain_text(st, "rerank")
    assert "4 new candidates at depth 2" in viz.explain_text(st, "expand:1")
    assert "sampl" not in viz.explain_text(st, "accept") and "probability p(x)" in viz.explain_text(
        st, "accept", greedy=False)


# ---------------------------------------------------------------- shipped traces
def test_shipped_traces_replay():
    files = sorted((ROOT / "assets" / "traces").glob("*.json"))
    assert 2 <= len(files) <= 3, "ship 2-3 recorded traces in assets/traces"
    for f in files:
        assert f.stat().st_size < 3_000_000, f"{f.name} is too big to ship"
        tr = Trace.load(f)
        assert 2 <= len(tr.steps) and tr.steps[-1].cumulative["tokens"] <= 64
        last = [s for s in tr.steps if s.tree is not None][-1]
        fig = viz.tree_figure(last)
        assert trace_named(fig, "bonus token").x[0] >= 1
        extra = tr.meta["viz"]
        assert {s["role"] for s in extra["series"]} == {"compare", "plain"}
        assert extra["previews"], "side-by-side trees recorded"


def test_policy_specific_explanations_and_lossy_label(steps):
    import copy
    st = copy.deepcopy(steps[1])
    st.tree.record = RelaxationRecord(rule="LANTERN++", relaxed_tokens=1, tv_max=0.125)
    lo = viz.lossy_summary([steps[0], st])
    assert lo == {"rule": "LANTERN++", "cycles": 1, "relaxed_tokens": 1, "max_shift": 0.125}
    assert viz.lossy_summary(steps) is None
    html = viz.metrics_html(viz.metrics(series("lantern", [steps[0], st]), []), {"lantern": lo})
    assert "LOSSY" in html and "1 relaxed tokens" in html and "0.125" in html
    assert "**Lossy:**" in viz.explain_text(st, "accept") and "0.125" in viz.explain_text(st, "accept")
    ds = copy.deepcopy(steps[1])
    ds.tree.record, ds.tree.sampled_drafts = DySpecRecord(mode="heap"), True
    assert "DySpec grows the tree greedily" in viz.explain_text(ds, "expand:1")
    assert "min(1, p(x)/q(x))" in viz.explain_text(ds, "accept", greedy=False)
    dd = copy.deepcopy(steps[1])
    dd.tree.record = DDDRecord(threshold=-0.3, checks=[{"level": 2, "beam_mass": -0.9, "stop": True}])
    assert "below the threshold -0.3, so it stops expanding" in viz.explain_text(dd, "expand:1")
