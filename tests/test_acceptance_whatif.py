"""The what-if on acceptance (viz/acceptance_whatif.py): the chain model, its pricing with a price
table, the measured points counted from hand-built trees, and the figure for every shipped trace.
No model, no browser."""
from __future__ import annotations

import math
import re
from dataclasses import replace
from pathlib import Path

import pytest

from eagle2.cycle.trace import StepTrace
from eagle2.cycle.tree import DraftTree
from eagle2.model.verify_times import VerifyTimes
from eagle2.policies.registry import TRACES
from viz.acceptance_whatif import (EMPTY, K_MAX, DepthCounts, acceptance_whatif_chart, best_k, chain_cost,
                                   chain_estimate, chain_speedup, chain_tokens, depth_counts, forwards_table)
from eagle2.cycle.series import series
from viz.charts import depth_acceptance
from viz.whatif import PriceTable, price_table_from_trace

ROOT = Path(__file__).resolve().parent.parent
STEEP = PriceTable("steep", "measured", VerifyTimes({1: 1.0, 8: 8.0}), draft_call_s=0.5)  # t(N) = N


def test_chain_tokens_is_the_geometric_sum():
    assert chain_tokens(0.5, 3) == pytest.approx(1.875)            # 1 + 0.5 + 0.25 + 0.125
    assert chain_tokens(1.0, 4) == 5.0                              # every guess accepted: K + 1
    assert chain_tokens(0.0, 7) == 1.0                              # none: the bonus token alone
    assert chain_tokens(0.9999999, 3) == pytest.approx(4.0, rel=1e-5)   # continuous at a = 1
    for a in (0.3, 0.7, 0.9):
        es = [chain_tokens(a, k) for k in range(0, 13)]
        gains = [b - e for e, b in zip(es, es[1:])]
        assert gains == pytest.approx([a ** k for k in range(1, 13)])  # guess k adds a^k ...
        assert all(g2 < g1 for g1, g2 in zip(gains, gains[1:]))       # ... less each time
        assert max(es) < 1 / (1 - a)                                   # and never past 1 / (1 - a)
    with pytest.raises(ValueError):
        chain_tokens(1.5, 2)


def test_speedup_prices_k_draft_calls_and_verifying_k_plus_1_tokens():
    # t(N) = N, a draft call = 0.5: a 3-token chain costs 3 x 0.5 + t(4) = 5.5 forwards of one token
    assert chain_cost(3, STEEP) == pytest.approx(5.5)
    assert chain_speedup(0.5, 3, STEEP) == pytest.approx(1.875 / 5.5)
    # the unit cancels: the same table in milliseconds gives the same speedup
    ms = replace(STEEP, times=VerifyTimes({1: 20.0, 8: 160.0}), draft_call_s=10.0)
    assert chain_speedup(0.8, 5, ms) == pytest.approx(chain_speedup(0.8, 5, STEEP))
    # a GPU-like table: flat t(N), draft calls at 0.1 t(1): S = E / (1 + 0.1 K)
    flat = PriceTable("flat", "model", VerifyTimes({1: 1.0, 64: 1.0}), draft_call_s=0.1)
    assert chain_speedup(0.7, 4, flat) == pytest.approx(chain_tokens(0.7, 4) / 1.4)
    # forwards only: the speedup is the tokens per cycle, so deeper always pays (a little)
    free = forwards_table()
    assert [chain_speedup(0.6, k, free) for k in (1, 2, 3)] == pytest.approx([1.6, 1.96, 2.176])
    assert best_k(0.6, free) == K_MAX
    # where every verified token costs a whole forward, one guess is best even for a good head ...
    assert best_k(0.5, STEEP) == best_k(0.95, STEEP) == 1
    # ... where it costs a little (a CPU's t(N)), a better head pays for a longer chain
    cpu = PriceTable("cpu", "measured", VerifyTimes({1: 1.0, 2: 1.2, 8: 2.0, 16: 3.0}), draft_call_s=0.1)
    assert [best_k(a, cpu) for a in (0.5, 0.7, 0.9)] == [1, 3, 6]
    k = best_k(0.8, flat)
    assert all(chain_speedup(0.8, k, flat) >= chain_speedup(0.8, j, flat) for j in range(1, K_MAX + 1))


def node_tree(parents: list[int], ranks: list[int], kept=None) -> DraftTree:
    n = len(parents)
    depths = [0] * n
    for i in range(1, n):
        depths[i] = depths[parents[i]] + 1
    return DraftTree(tokens=list(range(n)), parents=parents, depths=depths, ranks=ranks, logp=[0.0] * n,
                     values=[0.0] * n, levels=[d - 1 for d in depths], kept=kept or [True] * n, draft_calls=2)


def steps_of(trees_paths: list[tuple[DraftTree, list[int]]]) -> list[StepTrace]:
    """A prefill, then one drafted step per (tree, accepted path)."""
    def step(c, tree=None, path=()):
        k = len(path) + 1
        return StepTrace(cycle=c, policy="pol", new_tokens=list(range(k)), new_texts=["x"] * k,
                         accepted_len=len(path), bonus=1 if tree is not None else None,
                         timings={"draft_s": 0.01, "verify_s": 0.02, "commit_s": 0.0, "total_s": 0.03},
                         cumulative={"tokens": c * 2 + 1, "target_forwards": c + 1, "wall_s": 0.03 * (c + 1),
                                     "draft_calls": 2 * c},
                         tree=tree, accepted_path=list(path))
    return [step(0)] + [step(c, t, p) for c, (t, p) in enumerate(trees_paths, 1)]


# root 0; depth 1: 1 (the top guess), 2; depth 2: 3 (top guess under 1), 4 (top guess under 2)
FORK = [-1, 0, 0, 1, 2], [0, 0, 1, 0, 0]


def test_depth_counts_top_guess_and_any_guess():
    t = node_tree(*FORK)
    steps = steps_of([(t, [1, 3]),   # the top guesses all the way: the tree ends at depth 2, nothing refused
                      (t, [2, 4]),   # the second guess at depth 1: a chain stops there, the tree goes on
                      (t, []),       # nothing accepted
                      (t, [1])])     # refused at depth 2
    top, any_ = depth_counts(steps)
    assert (top.tried, top.accepted) == ([4, 2], [2, 1])
    assert (any_.tried, any_.accepted) == ([4, 3], [3, 2])
    assert top.pooled() == pytest.approx(3 / 6) and any_.pooled() == pytest.approx(5 / 7)
    assert top.rates(min_tried=2) == [0.5, 0.5] and top.rates(min_tried=3) == [0.5]
    # a top guess the rerank dropped: a chain is not observed at that depth (nor deeper)
    dropped = node_tree(*FORK, kept=[True, False, True, False, True])
    top, any_ = depth_counts(steps_of([(dropped, [2, 4])]))
    assert top.tried == [] and (any_.tried, any_.accepted) == ([1, 1], [1, 1])
    assert depth_counts(steps_of([]))[0].pooled() is None


def test_any_guess_rates_are_depth_acceptance_when_every_cycle_ends_refused():
    """depth_acceptance (the tree's share of cycles reaching depth d) is the product of the
    conditional rates when no cycle's path ran out of tree."""
    chain = node_tree([-1, 0, 1, 2, 3], [0] * 5)      # 4 deep: every path below ends refused
    acc = [0, 1, 2, 3, 1, 2]
    steps = steps_of([(chain, list(range(1, n + 1))) for n in acc])
    _, any_ = depth_counts(steps)
    rates = any_.rates(min_tried=1)
    reach = [math.prod(rates[:d]) for d in range(1, len(rates) + 1)]
    assert reach[:3] == pytest.approx(depth_acceptance(series("pol", steps)))
    assert chain_estimate(rates[:3]) == pytest.approx([1 + sum(reach[:k]) for k in (1, 2, 3)])


def test_chain_estimate():
    assert chain_estimate([0.8, 0.5, 1.0]) == pytest.approx([1.8, 2.2, 2.6])
    assert chain_estimate([]) == []
    assert chain_estimate([0.6] * 4) == pytest.approx([chain_tokens(0.6, k) for k in range(1, 5)])
    c = DepthCounts()
    for d, ok in ((1, True), (1, False), (2, True)):
        c.add(d, ok)
    assert (c.tried, c.accepted) == ([2, 1], [1, 1])


def names(fig) -> list[str]:
    return [d.name for d in fig.data]


def caption(fig) -> str:
    """The figure's text (its caption, or an empty figure's sentence), line breaks and tags removed."""
    return re.sub(r"<[^>]+>", "", " ".join(a.text for a in fig.layout.annotations).replace("<br>", " "))


def test_figure_points_are_the_measured_chain_priced_like_the_model():
    t = node_tree(*FORK)
    steps = steps_of([(t, [1, 3])] * 3 + [(t, [1])] * 3 + [(t, [])] * 2)
    fig = acceptance_whatif_chart(steps, STEEP, a=0.6, label="pol")
    model, run_model, measured, best = fig.data
    assert model.name == "model, a = 0.60 (slider)" and model.line.dash == "solid" and model.mode == "lines"
    assert model.y == pytest.approx([chain_speedup(0.6, k, STEEP) for k in range(1, K_MAX + 1)])
    top, _ = depth_counts(steps)        # depth 1: 6 of 8, depth 2: 3 of 6
    assert run_model.name == "model, this run's a = 0.64" and run_model.line.dash == "dot"   # 9 of 14
    assert measured.name == "measured, this run" and measured.mode == "markers"
    assert list(measured.x) == [1, 2]
    assert measured.y == pytest.approx([1.75 / chain_cost(1, STEEP), (1.75 + 0.375) / chain_cost(2, STEEP)])
    k = best_k(0.6, STEEP)
    assert (best.x[0], best.y[0]) == (k, pytest.approx(chain_speedup(0.6, k, STEEP)))
    assert best.name == f"best K at a = 0.60: {k}" and best.marker.symbol == "star"
    text = caption(fig)
    assert "Model: K guesses, each accepted with chance a, give (1 − aK+1) / (1 − a) tokens a cycle." in text
    assert "At a = 0.60 guess 1 adds 0.60 tokens, guess 5 only 0.08: at most 2.5 tokens, however long" in text
    assert "Measured (pol): its top guess was accepted 9 of 14 times (a = 0.64)." in text
    assert "Cost: K draft calls (0.50·t(1) each) + t(K+1), measured here." in text
    assert "Its trees" not in text       # they accepted nothing but top guesses: no better than the chain
    assert any("model" in n for n in names(fig)) and any("measured" in n for n in names(fig))


def test_empty_plain_and_unpriced_runs_still_draw():
    for steps in ([], None, steps_of([])):             # nothing drafted (a prefill, plain decoding)
        fig = acceptance_whatif_chart(steps, STEEP)
        assert not fig.data and caption(fig) == EMPTY
    t = node_tree(*FORK)
    fig = acceptance_whatif_chart(steps_of([(t, [1, 3])] * 4), None)   # no price table: forwards only
    assert "No measured costs in this run" in caption(fig)
    assert fig.data[0].y == pytest.approx([chain_tokens(0.7, k) for k in range(1, K_MAX + 1)])
    fig = acceptance_whatif_chart(steps_of([(t, [2])] * 4), STEEP)     # no top guess ever accepted
    assert names(fig)[1] == "model, this run's a = 0.00" and fig.data[2].y == pytest.approx([1 / chain_cost(1, STEEP)])
    assert "top guess was accepted 0 of 4" in caption(fig)
    fig = acceptance_whatif_chart(steps_of([(t, [1, 3])] * 2), STEEP)     # too few cycles for a point
    assert not any("measured" in n for n in names(fig)) and "Dots once a depth has been tried 3 times." in caption(fig)
    fig = acceptance_whatif_chart(steps_of([(t, [1, 3])] * 4), STEEP, a=1.0)   # the slider's ends
    assert fig.data[0].y[0] == pytest.approx(2 / chain_cost(1, STEEP))


@pytest.mark.parametrize("path", sorted((ROOT / "assets" / "traces").glob("*.json")), ids=lambda p: p.stem)
def test_every_shipped_trace_draws_model_and_measured(path):
    tr = TRACES.load(path)
    table = price_table_from_trace(tr.steps, tr.meta)
    assert table is not None
    fig = acceptance_whatif_chart(tr.steps, table, 0.8, tr.steps[0].policy)
    got = names(fig)
    assert got[0] == "model, a = 0.80 (slider)" and got[1].startswith("model, this run's a = ")
    assert "measured, this run" in got and any(n.startswith("best K") for n in got)
    top, any_ = depth_counts(tr.steps)
    assert 0 < top.pooled() < any_.pooled() <= 1           # several guesses a depth are accepted more often
    assert f"Its trees, with more guesses a depth, got {any_.pooled():.2f}: like a better head." in caption(fig)
    assert all(y > 0 for d in fig.data for y in d.y)
    fig.to_json()
