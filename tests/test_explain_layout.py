"""Explain a cycle, phase by phase, on the shipped traces: each phase's tree fills the plot's height,
nodes keep their order from phase to phase, and the candidates left in the pool are drawn small,
faded and unlabelled while the selected ones are labelled. Measured on the figures' own node
coordinates, as the page draws them."""
from __future__ import annotations

import statistics

import pytest

import viz
from eagle2.policies.registry import TRACES
from test_viz import ROOT, assert_order_kept, assert_readable, node_positions, trace_named
from viz.explain import Phase, Stage
from viz.explain_layout import phase_layouts
from viz.tree_graph import FADED_SIZE, MIN_WIDTH_PX, tree_graph

TRACE_FILES = sorted((ROOT / "assets" / "traces").glob("*.json"))
# an fp32 EAGLE-2 (60, 5, 10) race on a CPU, as the page shipped before it opened on eagle2-auto:
# its cycle 14 is the wide tree these layout checks were written on
WRITING = ROOT / "tests" / "data" / "fp32-eagle2-writing-greedy.json"
CANDIDATES = "candidates, not selected"


def drafted_steps(path):
    return [s for s in TRACES.load(path).steps if s.tree is not None]


def cycle_14():
    """The fp32 writing trace's cycle 14: the step whose `cycle` is 14 (steps[14]; steps[0] is the
    prefill), as the page's Cycle slider numbers it, and the cycle the tab opens on."""
    return next(s for s in drafted_steps(WRITING) if s.cycle == 14)


def y_share(fig, a: float, b: float) -> float:
    """The distance from y = a to y = b as a share of the figure's y axis range."""
    lo, hi = sorted(fig.layout.yaxis.range)
    return abs(b - a) / (hi - lo)


def test_first_expansion_spreads_the_roots_children_over_the_plot():
    """Laid out as the final tree, the ten children spanned 55% of the y axis, nine of them crammed
    at the bottom (median gap 1.6%)."""
    st = cycle_14()
    fig = viz.explain_figure(st, Phase.expand(0))
    pos = node_positions(fig)
    t = st.tree
    ys = sorted(pos[str(i)][1] for i in range(1, len(t.tokens)) if t.levels[i] == 0)
    assert len(ys) == 10
    assert y_share(fig, ys[0], ys[-1]) >= 0.60
    assert statistics.median(y_share(fig, a, b) for a, b in zip(ys, ys[1:])) >= 0.04


def test_every_phase_of_cycle_14_covers_the_plot():
    st = cycle_14()
    for key, label in viz.phases(st):
        fig = viz.explain_figure(st, key)
        ys = [y for _, y in node_positions(fig).values()]
        assert y_share(fig, min(ys), max(ys)) >= 0.75, label


@pytest.mark.parametrize("path", TRACE_FILES, ids=lambda p: p.name)
def test_nodes_keep_their_order_from_phase_to_phase(path):
    """Every cycle of the shipped trace: between consecutive phases no node passes another in its
    depth column, checked on the layouts each phase draws (all cycles) and on the figures
    themselves (the last cycle)."""
    steps = drafted_steps(path)
    for st in steps:
        lays = phase_layouts(tree_graph(st), [list(b) for b in st.tree.beam])
        keys = [k.level for k, _ in viz.phases(st)]
        for a, b in zip(keys, keys[1:]):
            assert_order_kept(lays[a].pos, lays[b].pos, f"cycle {st.cycle}, after level {a}")
    st = steps[-1]
    pos = [(label, node_positions(viz.explain_figure(st, key))) for key, label in viz.phases(st)]
    for (_, a), (label, b) in zip(pos, pos[1:]):
        assert_order_kept(a, b, f"cycle {st.cycle}, {label}")


def test_pool_candidates_are_small_faded_and_unlabelled_the_selected_labelled():
    st = cycle_14()
    G = tree_graph(st)
    beams = [list(b) for b in st.tree.beam]
    for key, label in viz.phases(st):
        if key.stage is not Stage.EXPAND:
            continue
        fig = viz.explain_figure(st, key)
        shown = {int(c) for c in node_positions(fig) if c != "bonus"}
        selected = {0} | {v for b in beams[:key.level + 1] for v in b}   # the root, and by this call or earlier
        pool = shown - selected
        if pool:
            small = trace_named(fig, CANDIDATES)
            assert {int(c) for c in small.customdata} == pool, label
            assert "text" not in small.mode and small.marker.size == FADED_SIZE and small.marker.opacity < 1, label
        else:
            assert not [t for t in fig.data if t.name == CANDIDATES], label
        drawn = trace_named(fig, "draft nodes")
        assert all(s > FADED_SIZE for s in drawn.marker.size), label
        rings = [int(c) for t in fig.data if t.name == "selected for expansion" for c in t.customdata]
        assert rings == (beams[key.level] if key.level < len(beams) else []), label   # the last call selects none
        for width in (MIN_WIDTH_PX, 1000):
            assert_readable(fig, G, width, [0] + rings, clear_of_nodes=False)
