"""viz/ on a hand-built fixture trace (known tree, known accepted path) and on the shipped traces."""
from __future__ import annotations

import html
import json
import math
import random
import re
from pathlib import Path

import pytest

import viz
from eagle2.cycle.trace import StepTrace
from eagle2.cycle.tree import DraftTree
from eagle2.policies.auto import AutoRecord
from eagle2.policies.ddd import DDDRecord
from eagle2.policies.dyspec import DySpecRecord
from eagle2.policies.lantern import RelaxationRecord
from eagle2.policies.registry import TRACES
from eagle2.cycle.series import series
from viz.charts import speedup_series, wall_at
from viz.explain import ACCEPT, RERANK, VERIFY, Phase
from viz.tables import COLUMNS
from viz.tree_graph import BONUS, LABEL_CHARS, MIN_WIDTH_PX, layout, tree_graph

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


def test_a_cycle_that_kept_no_draft_reads_as_a_plain_step(steps):
    """A budget may judge no draft worth its verify cost: the pool is drawn (dropped, when asked
    for), no draft node, and the title says it was a plain step."""
    from dataclasses import replace
    t = steps[2].tree
    none_kept = replace(steps[2], tree=replace(t, kept=[True] + [False] * (len(t.kept) - 1)))
    fig = viz.tree_figure(none_kept)
    assert not [d for d in fig.data if d.name == "draft nodes"]
    assert "0 of 9 drafted tokens verified (none kept: a plain step)" in fig.layout.title.text
    assert len(trace_named(viz.tree_figure(none_kept, show_dropped=True), "dropped by rerank").x) == 9
    assert "plain step" not in viz.tree_figure(steps[2]).layout.title.text


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


TOKENS = [" the", " ocean", "\n", "'s", ",", " reminder", " extraordinarily", " A", "ing", " whispers", " of",
          " sea", ".", " and", " beneath", " silver", " moon", "The", " light", " 42", " wave", " 日本"]


def _random_tree(seed=0, k=10, depth=5, n_keep=60, accept=0):
    """An EAGLE-2-shaped pool (k + depth*k^2 nodes) with a realistic rerank, its beams, token texts
    of real lengths, and `accept` accepted nodes down the best children (then a bonus)."""
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
    beams = [list(beam)]
    for lv in range(1, depth + 1):
        new = [c for b in beam for c in add(b, lv)]
        beam = sorted(new, key=lambda i: -values[i])[:k]
        if lv < depth:
            beams.append(list(beam))
    n = len(parents)
    keep = set(sorted(range(1, n), key=lambda i: -values[i])[: n_keep - 1])
    for i in list(keep):
        p = parents[i]
        while p > 0:
            keep.add(p); p = parents[p]
    kept = [i == 0 or i in keep for i in range(n)]
    path, node = [], 0
    for _ in range(accept):
        ch = [j for j in range(n) if parents[j] == node and kept[j]]
        if not ch:
            break
        node = min(ch, key=lambda j: ranks[j])
        path.append(node)
    texts = [rng.choice(TOKENS) for _ in range(n)]
    tree = DraftTree(tokens=list(range(n)), parents=parents, depths=depths, ranks=ranks, logp=logp, values=values,
                     levels=levels, kept=kept, order=list(range(n)), target_prob=[None] * n,
                     accepted=[i == 0 or i in path for i in range(n)], beam=beams)
    return StepTrace(cycle=1, policy="eagle2", new_tokens=[tree.tokens[i] for i in path] + [5],
                     new_texts=[texts[i] for i in path] + [" shimmering"], accepted_len=len(path), bonus=5,
                     timings={}, cumulative={}, tree=tree, tree_texts=texts, accepted_path=path)


@pytest.mark.parametrize("show_dropped", [False, True])
def test_layout_rows_at_n60(show_dropped):
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


def plot_frame(fig, width: float):
    """(plot width, plot height, x at the left edge, y at the top row, px per x unit, px per y
    unit) of a tree figure drawn `width` px wide (y reversed: the top row first)."""
    lay = fig.layout
    pw, ph = width - lay.margin.l - lay.margin.r, lay.height - lay.margin.t - lay.margin.b
    (x0, x1), (y_bottom, y_top) = lay.xaxis.range, lay.yaxis.range
    return pw, ph, x0, y_top, pw / (x1 - x0), ph / (y_bottom - y_top)


def per_point(value, n: int) -> list:
    """A Plotly per-point attribute as a list (it is a scalar when every point shares it)."""
    return list(value) if isinstance(value, (list, tuple)) else [value] * n


def label_boxes(fig, width: float) -> list[tuple]:
    """(trace, node, text, box) of every label of a tree figure drawn `width` px wide, box =
    (x0, y0, x1, y1) in px from the plot's top left, worked out from the figure alone: the axis
    ranges and margins, each point's position, marker size, text position, font size and text
    width (Plotly offsets a text by the marker's radius / 0.8 + 1; a line is ~1.17 em tall, its
    baseline 0.25 em under the centre for "middle")."""
    _, _, x0, y_top, sx, sy = plot_frame(fig, width)
    out = []
    for t in fig.data:
        if not t.mode or "text" not in t.mode:
            continue
        n = len(t.x)
        font, bold = t.textfont.size, t.textfont.weight == "bold"
        for c, x, y, text, where, size in zip(t.customdata, t.x, t.y, per_point(t.text, n),
                                              per_point(t.textposition, n), per_point(t.marker.size, n)):
            if not text:
                continue
            w = viz.common.text_px(html.unescape(text), font, bold)
            off = size / 2 / 0.8 + 1
            px, py = (x - x0) * sx, (y - y_top) * sy
            vert, side = where.split()
            base = py + {"middle": 0.25 * font, "top": -0.25 * font - off, "bottom": 0.75 * font + off}[vert]
            left = px + off if side == "right" else px - off - w
            out.append((t.name, c, html.unescape(text), (left, base - 0.93 * font, left + w, base + 0.24 * font)))
    return out


def marker_boxes(fig, width: float) -> list[tuple]:
    """(node, box) of every drawn marker, rings included, in the same px frame as label_boxes."""
    _, _, x0, y_top, sx, sy = plot_frame(fig, width)
    out = []
    for t in fig.data:
        if not t.mode or "markers" not in t.mode:
            continue
        ring = 3 if t.marker.symbol == "circle-open" else 0
        for c, x, y, size in zip(t.customdata, t.x, t.y, per_point(t.marker.size, len(t.x))):
            r = size / 2 + ring / 2
            px, py = (x - x0) * sx, (y - y_top) * sy
            out.append((c, (px - r, py - r, px + r, py + r)))
    return out


def _meet(a, b, tol=0.5) -> bool:
    return a[0] < b[2] - tol and b[0] < a[2] - tol and a[1] < b[3] - tol and b[1] < a[3] - tol


def assert_readable(fig, G, width: float, must=(), clear_of_nodes=True) -> list:
    """No two labels meet, every label lies inside the plot and shows its token's text (cut with an
    ellipsis at most), every node of `must` has a label; with clear_of_nodes, no label covers
    another node. Returns the labels."""
    labels = label_boxes(fig, width)
    pw, ph = plot_frame(fig, width)[:2]
    for i, (_, ci, ti, a) in enumerate(labels):
        for _, cj, tj, b in labels[i + 1:]:
            assert not _meet(a, b), f"labels {ti!r} (node {ci}) and {tj!r} (node {cj}) overlap at {width} px"
        assert a[0] >= -0.5 and a[2] <= pw + 0.5 and a[1] >= -3 and a[3] <= ph + 3, f"{ti!r} spills off the plot"
        node = BONUS if ci == BONUS else int(ci)
        full = viz.common.show_ws(G.nodes[node]["text"])
        assert ti == full[:len(ti)] or (ti.endswith("…") and full.startswith(ti[:-1]) and len(ti) <= LABEL_CHARS), ti
    if clear_of_nodes:
        marks = marker_boxes(fig, width)
        for _, c, text, a in labels:
            hit = [m for m, b in marks if m != c and _meet(a, b)]
            assert not hit, f"label {text!r} of node {c} covers node(s) {hit} at {width} px"
    by_node = {c: text for _, c, text, _ in labels}
    for v in must:
        shown = by_node.get(str(v), "")
        assert len(shown.rstrip("…")) >= min(2, len(viz.common.show_ws(G.nodes[v]["text"]))), \
            f"node {v} ({G.nodes[v]['kind']}) is not labelled"
    return labels


@pytest.mark.parametrize("show_dropped", [False, True])
def test_tree_at_n60_labels_what_matters_without_overlap(show_dropped):
    """EAGLE-2's default tree (60 kept of 510 drafted, depth 6, top-k 10) with 3 accepted tokens:
    root, accepted path and bonus labelled, as many others as fit, none overlapping, at the
    narrowest panel (a phone) and wider; the rest on hover."""
    st = _random_tree(accept=3)
    assert len(st.tree.tokens) == 511 and sum(st.tree.kept) == 60 and max(st.tree.depths) == 6
    G = tree_graph(st)
    must = viz.path_nodes(G)
    assert len(must) == 5                                                   # root, 3 accepted, bonus
    fig = viz.tree_figure(st, show_dropped=show_dropped)
    for width in (MIN_WIDTH_PX, 480, 1000):                                 # the plan holds at any width from a phone's up
        labels = assert_readable(fig, G, width, must)
    assert len(labels) >= 30, f"only {len(labels)} of 61 nodes labelled"
    # every node, labelled or not, has hover text
    nodes = trace_named(fig, "draft nodes")
    assert len(nodes.customdata) == 59 and all(h and "path value" in h for h in nodes.hovertext)
    if show_dropped:
        dropped = trace_named(fig, "dropped by rerank")
        assert len(dropped.customdata) == 511 - 60 and all("dropped by rerank" in h for h in dropped.text)
    for name in ("root", "bonus token"):
        assert "(id " in trace_named(fig, name).hovertext[0]


def test_label_budget_follows_the_figure_height():
    """A shorter figure has fewer px per row: labels still never overlap, and fewer fit."""
    st = _random_tree(accept=2)
    G = tree_graph(st)
    tall, short = viz.tree_figure(st), viz.tree_figure(st, height=460)
    rows = short.layout.yaxis.range[0] - 0.5
    assert (short.layout.height - short.layout.margin.t - short.layout.margin.b) / (rows + 1) < 10  # < a text line
    n_tall = len(assert_readable(tall, G, MIN_WIDTH_PX, viz.path_nodes(G)))
    n_short = len(assert_readable(short, G, MIN_WIDTH_PX, viz.path_nodes(G), clear_of_nodes=False))
    assert n_short < n_tall


@pytest.mark.slow   # the full suite's: every shipped tree drawn and measured (the fast tier stays under two minutes)
def test_shipped_trees_readable_at_phone_width():
    """Every tree of the shipped traces (60-node eagle2 trees and their static comparisons): no two
    labels overlap at phone width, and the root, accepted path and bonus are labelled."""
    from ui.view import View
    for f in sorted((ROOT / "assets" / "traces").glob("*.json")):
        tr = TRACES.load(f)
        previews = View.from_trace(tr, f.name).previews
        for st in (s for s in tr.steps if s.tree is not None):
            for s in [st] + ([previews[st.cycle]] if st.cycle in previews else []):
                G = tree_graph(s)
                assert_readable(viz.tree_figure(s), G, MIN_WIDTH_PX, viz.path_nodes(G), clear_of_nodes=False)


def test_long_titles_wrap_onto_short_lines():
    st = _random_tree(accept=3)
    fig = viz.tree_figure(st)
    lines = fig.layout.title.text.split("<br>")
    assert lines[0] == "Cycle 1 · eagle2"
    plain = [re.sub(r"<[^>]+>", "", ln) for ln in lines]
    assert plain[1:] == ["59 of 510 drafted tokens verified", "accepted 3 + bonus = 4 tokens"]
    assert all("font-size:12px" in ln for ln in lines[1:])                  # details smaller than the 16 px title
    assert fig.layout.margin.t >= 16 + 21 * len(lines)                      # room for every line
    # the comparison title the page builds: "<policy> on the same context: ..."
    cmp = viz.tree_figure(st, title="static on the same context: accepted 3 (eagle2: 2)")
    assert [re.sub(r"<[^>]+>", "", ln) for ln in cmp.layout.title.text.split("<br>")] == [
        "static on the same context", "accepted 3 (eagle2: 2)"]
    # any long title: a first line of at most TITLE_CHARS, the rest of at most DETAIL_CHARS
    long = "Cycle 12 · eagle2-auto: 3 of 10 drafted tokens verified · accepted 1 + bonus = 2 tokens · N 64 d 7"
    wrapped = viz.common.wrap_title(long)
    assert wrapped[0] == "Cycle 12 · eagle2-auto" and len(wrapped) >= 2
    assert len(wrapped[0]) <= viz.common.TITLE_CHARS and all(len(ln) <= viz.common.DETAIL_CHARS for ln in wrapped[1:])
    assert " · ".join(wrapped[1:]) == long.split(": ", 1)[1]               # nothing lost
    # a title that fits stays one line, with the top margin still reserved for two
    short = viz.tree_figure(st, title="Cycle 1 · eagle2 · Verify")
    assert "<br>" not in short.layout.title.text and short.layout.margin.t >= 16 + 2 * 21


def test_colour_bar_and_legend_stay_off_the_nodes():
    fig = viz.tree_figure(_random_tree(accept=3), show_dropped=True)
    bar = trace_named(fig, "draft nodes").marker.colorbar
    assert bar.orientation == "h" and bar.yref == "paper" and bar.y < 0 and bar.yanchor == "top"   # under the plot
    assert fig.layout.legend.y < bar.y                                                             # and under the bar
    ph = fig.layout.height - fig.layout.margin.t - fig.layout.margin.b
    assert -fig.layout.legend.y * ph + 2 * 20 <= fig.layout.margin.b                              # two legend lines fit


def node_positions(fig) -> dict:
    """{node: (x, y)} of every node a figure draws (a ring sits on its node's point)."""
    return {c: (x, y) for t in fig.data if t.customdata is not None for c, x, y in zip(t.customdata, t.x, t.y)}


def assert_order_kept(before: dict, after: dict, what) -> None:
    """The nodes placed in both {node: (x, y)} keep their top-to-bottom order in every depth
    column, none level with another."""
    common = [c for c in before if c in after]
    for depth in {before[c][0] for c in common}:
        col = [c for c in common if before[c][0] == depth]
        for where in (before, after):
            assert len({where[c][1] for c in col}) == len(col), f"{what}: two nodes level at depth {depth}"
        assert sorted(col, key=lambda c: before[c][1]) == sorted(col, key=lambda c: after[c][1]), \
            f"{what}: a node passes another at depth {depth}"


def test_explain_keeps_node_order_and_the_frame_across_phases():
    """Each phase lays the tree out as it stands then, in one frame (height, depth axis and y range):
    nodes move as the tree grows but keep their order in every depth column; from the rerank on the
    tree no longer changes, and neither does any node's place."""
    st = _random_tree(accept=3)
    figs = {k: viz.explain_figure(st, k) for k, _ in viz.phases(st)}
    assert len(figs) == 6 + 3                                               # six expansion levels, rerank, verify, accept
    for k, f in figs.items():
        assert f.layout.height == figs[ACCEPT].layout.height and f.layout.xaxis.range == figs[ACCEPT].layout.xaxis.range
        assert f.layout.yaxis.range == figs[ACCEPT].layout.yaxis.range
    pos = {k: node_positions(f) for k, f in figs.items()}
    keys = list(figs)
    for a, b in zip(keys, keys[1:]):
        assert_order_kept(pos[a], pos[b], b)
    where = {}
    for k in (RERANK, VERIFY, ACCEPT):
        for c, xy in pos[k].items():
            assert where.setdefault(c, xy) == xy, f"node {c} moves in phase {k}"
    G = tree_graph(st)
    deepest = max(st.tree.depths)
    for k, f in figs.items():
        if k != ACCEPT:    # the bonus (one deeper) is laid out in every phase but drawn, edge and all, only at the end
            assert all(x is None or x <= deepest for t in f.data for x in t.x), k
        must = viz.path_nodes(G) if k == ACCEPT else [0]
        rings = [t for t in f.data if t.name == "selected for expansion"]
        must += [int(c) for t in rings for c in t.customdata]
        assert_readable(f, G, MIN_WIDTH_PX, must, clear_of_nodes=False)


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
    assert keys == [Phase.expand(0), Phase.expand(1), Phase.expand(2), RERANK, VERIFY, ACCEPT]
    assert [lab for _, lab in viz.phases(st)] == ["Expand level 1", "Expand level 2", "Expand level 3", "Rerank",
                                                  "Verify", "Accept"]
    f0 = viz.explain_figure(st, Phase.expand(0))
    shown = trace_named(f0, "draft nodes")
    assert sorted(int(c) for c in shown.customdata) == [1, 2, 3]            # only level-1 nodes so far
    assert len(trace_named(f0, "selected for expansion").x) == 3
    f1 = viz.explain_figure(st, Phase.expand(1))
    assert len(trace_named(f1, "selected for expansion").x) == 2            # beam[1] = [4, 6]
    fr = viz.explain_figure(st, RERANK)
    assert sorted(int(c) for c in trace_named(fr, "dropped by rerank").customdata) == [3, 7, 9]
    fv = viz.explain_figure(st, VERIFY)
    nodes = trace_named(fv, "draft nodes")
    assert [c for c in nodes.marker.color] == pytest.approx([TARGET_P[int(c)] for c in nodes.customdata])
    fa = viz.explain_figure(st, ACCEPT)
    assert list(trace_named(fa, "accepted path").x) == [0, 1, 2, 3]
    # nodes keep their vertical order across phases, and the depth axis stays put
    p0 = dict(zip(shown.customdata, shown.y))
    pr = dict(zip(trace_named(fr, "draft nodes").customdata, trace_named(fr, "draft nodes").y))
    common = [c for c in p0 if c in pr]
    assert sorted(common, key=p0.get) == sorted(common, key=pr.get)
    assert f0.layout.xaxis.range == fr.layout.xaxis.range
    assert "2 draft tokens accepted" not in viz.explain_text(st, ACCEPT)
    txt = viz.explain_text(st, ACCEPT)
    assert "Accepted here: 2 draft tokens" in txt and "emits 3 tokens" in txt
    assert "keeps the 6 of highest value" in viz.explain_text(st, RERANK)
    assert "4 new candidates at depth 2" in viz.explain_text(st, Phase.expand(1))
    assert "sampl" not in viz.explain_text(st, ACCEPT) and "probability p(x)" in viz.explain_text(
        st, ACCEPT, greedy=False)


# ---------------------------------------------------------------- shipped traces
def test_shipped_traces_replay():
    files = sorted((ROOT / "assets" / "traces").glob("*.json"))
    assert 2 <= len(files) <= 5, "ship 2-5 recorded traces in assets/traces (three on a CPU, two on a GPU)"
    for f in files:
        assert f.stat().st_size < 3_000_000, f"{f.name} is too big to ship"
        tr = TRACES.load(f)
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
    assert "**Lossy:**" in viz.explain_text(st, ACCEPT) and "0.125" in viz.explain_text(st, ACCEPT)
    ds = copy.deepcopy(steps[1])
    ds.tree.record, ds.tree.sampled_drafts = DySpecRecord(mode="heap"), True
    assert "DySpec grows the tree greedily" in viz.explain_text(ds, Phase.expand(1))
    assert "min(1, p(x)/q(x))" in viz.explain_text(ds, ACCEPT, greedy=False)
    dd = copy.deepcopy(steps[1])
    dd.tree.record = DDDRecord(threshold=-0.3, checks=[{"level": 2, "beam_mass": -0.9, "stop": True}])
    assert "below the threshold -0.3, so it stops expanding" in viz.explain_text(dd, Phase.expand(1))
    au = copy.deepcopy(steps[1])
    au.tree.record = AutoRecord(n=5, levels=2, expected_tokens=2.5)
    assert "**Hardware-aware budget:**" in viz.explain_text(au, RERANK) and "N = 5" in viz.explain_text(au, RERANK)


def test_record_notes_speak_only_where_their_record_has_something_to_say():
    from viz import record_notes as notes
    assert "stops expanding" in notes.expand_note(
        DDDRecord(threshold=-0.3, checks=[{"level": 2, "beam_mass": -0.9, "stop": True}]), 1)
    assert notes.expand_note(DDDRecord(), 1) == "" and notes.expand_note(None, 1) == ""
    assert "re-measure" in notes.rerank_note(AutoRecord(n=8, best_n=4)) and "re-measure" not in notes.rerank_note(
        AutoRecord(n=4))
    assert notes.rerank_note(DDDRecord()) == notes.accept_note(AutoRecord()) == ""
    assert notes.expand_text(AutoRecord(), 0, 3, [1], "") is None
    assert RelaxationRecord(relaxed_tokens=2, tv_max=0.1).departure() == {"rule": "lantern++", "relaxed_tokens": 2,
                                                                           "max_shift": 0.1}
    assert AutoRecord().departure() is None
