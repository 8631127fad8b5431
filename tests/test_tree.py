"""Draft-tree invariants of the static (EAGLE-1) and EAGLE-2 policies (docs/algorithms.md §3-4),
and the verification layout built from a tree.

Trees come from real drafting (a random EAGLE head on a tiny random Llama target) and each node's
draft log-probability is re-derived by running the head sequentially along the node's path, so
the tree attention inside drafting is checked too.
"""
from __future__ import annotations

import numpy as np
import pytest
import torch

from eagle2.decoding.decoder import Decoder
from eagle2.cycle.drafting import HeadRunner
from eagle2.errors import UserError
from eagle2.model.loading import load_bundle
from eagle2.policies.eagle2 import Eagle2Policy
from eagle2.policies.registry import make_policy
from eagle2.policies.static import EAGLE1_SHAPE, StaticPolicy
from eagle2.cycle.tree import DraftTree
from trees import builder_of

VOCAB = 97


def children(tree, i: int, kept_only: bool = True) -> list[int]:
    """Node i's children in the pool, by rank (kept ones only, unless told)."""
    ch = [j for j, p in enumerate(tree.parents) if p == i and (tree.kept[j] or not kept_only)]
    return sorted(ch, key=lambda j: tree.ranks[j])


@pytest.fixture(scope="module")
def bundle(tiny_target):
    folder, _ = tiny_target("tree", vocab=VOCAB, lm_std=0.3)
    return load_bundle(target=str(folder), head="random")


def draft_trees(bundle, policy, cycles=3, prompt=(4, 8, 15, 16, 23, 42)):
    """Yield (tree, head cache snapshot, root_g, runner, the tree's columns) for a few real cycles
    (the tree as a trace keeps it, for reading node by node)."""
    dec = Decoder(bundle, policy, max_new_tokens=64, record=False)
    dec.start(input_ids=list(prompt))
    for _ in range(cycles):
        dec.absorb()
        s = dec.state
        hc = s.hcache
        snap = (hc.k.clone(), hc.v.clone(), hc.length)
        runner = HeadRunner(bundle.draft, hc, s.reading.g, base_pos=hc.length - 1, root_logp=s.reading.logp)
        arrays = dec.policy.draft(runner, s.root)
        yield arrays.to_tree(), snap, s.reading.g.clone(), runner, arrays
        dec.step()


def path_of(tree: DraftTree, i: int) -> list[int]:
    p = []
    while i > 0:
        p.append(i)
        i = tree.parents[i]
    return p[::-1]


def sequential_logp(bundle, snap, root_g, tree, i) -> torch.Tensor:
    """The head's next-token log-probs at node i, by running it causally along i's path on a copy
    of the committed head cache (no tree mask involved)."""
    head = bundle.head
    k, v, L = snap
    cache = head.new_cache(k.shape[3])
    cache.k.copy_(k)
    cache.v.copy_(v)
    cache.length = L
    g = root_g
    for j in path_of(tree, i):
        out = head.forward_cached(cache, g[None], torch.tensor([tree.tokens[j]]),
                                  torch.tensor([cache.length]), cache.length)
        cache.advance(1)
        g = out[0]
    return head.draft_logprobs(g)


def check_common(tree: DraftTree, bundle, snap, root_g):
    n = len(tree)
    # structure
    assert tree.parents[0] == -1 and tree.depths[0] == 0 and tree.kept[0]
    for i in range(1, n):
        p = tree.parents[i]
        assert 0 <= p < i
        assert tree.depths[i] == tree.depths[p] + 1
        # values are cumulative log-probabilities
        assert tree.values[i] == pytest.approx(tree.values[p] + tree.logp[i], abs=1e-5)
        assert tree.logp[i] <= 0.0
    # kept set closed under parents
    for i in range(n):
        if tree.kept[i]:
            assert tree.kept[max(tree.parents[i], 0)]
    # siblings: distinct tokens, ranks 0..m-1 ordered by draft probability
    for i in range(n):
        ch = children(tree, i, kept_only=False)
        if not ch:
            continue
        assert [tree.ranks[c] for c in ch] == list(range(len(ch)))
        assert len({tree.tokens[c] for c in ch}) == len(ch)
        lps = [tree.logp[c] for c in ch]
        assert all(a >= b - 1e-6 for a, b in zip(lps, lps[1:]))
        # the children are exactly the head's top-|ch| at node i (re-derived sequentially)
        ref = sequential_logp(bundle, snap, root_g, tree, i)
        top = ref.topk(len(ch))
        assert [tree.tokens[c] for c in ch] == bundle.head.to_target_ids(top.indices).tolist()
        assert np.allclose(lps, top.values.tolist(), atol=1e-4)


EAGLE2_CONFIGS = [dict(total_tokens=60, depth=5, top_k=10), dict(total_tokens=12, depth=3, top_k=4),
                  dict(total_tokens=200, depth=2, top_k=3), dict(total_tokens=1, depth=1, top_k=2),
                  dict(total_tokens=9, depth=4, top_k=1)]


@pytest.mark.parametrize("cfg", EAGLE2_CONFIGS, ids=lambda c: "N{total_tokens}-d{depth}-k{top_k}".format(**c))
def test_eagle2_tree_invariants(bundle, cfg):
    N, d, k = cfg["total_tokens"], cfg["depth"], cfg["top_k"]
    pol = Eagle2Policy(**cfg)
    for tree, snap, root_g, runner, arrays in draft_trees(bundle, pol, cycles=2):
        check_common(tree, bundle, snap, root_g)
        # pool size = 1 + k + d*k^2 (root included); N tokens verified (or the whole pool)
        assert len(tree) == len(arrays) == 1 + k + d * k * k
        assert arrays.n_kept == sum(tree.kept) == min(N, len(tree))
        assert max(tree.depths) == d + 1
        assert runner.calls == 1 + d
        # expansion: depth-1 nodes are the root's top-k; at each deeper level the expanded nodes are
        # the k highest-value nodes of that level (global across the level)
        for depth in range(1, d + 1):
            level = [i for i in range(len(tree)) if tree.depths[i] == depth]
            expanded = sorted({tree.parents[i] for i in range(len(tree)) if tree.depths[i] == depth + 1})
            best = sorted(sorted(level, key=lambda i: -tree.values[i])[:k])
            assert expanded == best
        # rerank: the kept non-root nodes are the N-1 of highest value (ties -> shallower, earlier)
        order = sorted(range(1, len(tree)), key=lambda i: (-tree.values[i], tree.depths[i], i))
        want = {0} | set(order[: max(N - 1, 0)])
        kept = {i for i in range(len(tree)) if tree.kept[i]}
        assert want <= kept
        extra = kept - want
        assert all(any(e in path_of(tree, j) for j in want) for e in extra)  # only missing ancestors
        if kept != set(range(len(tree))):
            kv = min(tree.values[i] for i in kept if i > 0) if len(kept) > 1 else 0.0
            dropped = max(tree.values[i] for i in range(len(tree)) if i not in kept)
            assert kv >= dropped


def test_static_tree_shape(bundle):
    pol = StaticPolicy()
    assert pol.total_tokens == 26
    for tree, snap, root_g, runner, arrays in draft_trees(bundle, pol, cycles=2):
        check_common(tree, bundle, snap, root_g)
        assert len(tree) == 26 and arrays.n_kept == 26
        per_depth = [sum(1 for x in tree.depths if x == dd) for dd in range(1, 6)]
        assert per_depth == [4, 8, 8, 3, 2]
        rank_paths = {tuple(tree.ranks[j] for j in path_of(tree, i)) for i in range(1, 26)}
        assert rank_paths == {tuple(p) for p in EAGLE1_SHAPE}
        # D runs once per level on the non-leaf nodes only: root call + 4 levels
        assert tree.draft_calls == 5
        assert runner.used == 4 + 4 + 1 + 1


def test_static_custom_shape_and_validation(bundle):
    shape = [[0], [1], [0, 0], [0, 1], [0, 0, 0]]
    pol = make_policy("static", shape=shape)
    for tree, snap, root_g, *_ in draft_trees(bundle, pol, cycles=1):
        check_common(tree, bundle, snap, root_g)
        assert len(tree) == 6
        assert {tuple(tree.ranks[j] for j in path_of(tree, i)) for i in range(1, 6)} == {tuple(p) for p in shape}
    with pytest.raises(UserError):
        make_policy("static", shape=[[0], [1, 0, 0]])  # no parent path
    with pytest.raises(UserError):
        make_policy("static", shape=[[0], [-1]])


@pytest.mark.parametrize("policy", [StaticPolicy(), Eagle2Policy(total_tokens=20, depth=4, top_k=4)],
                         ids=["static", "eagle2"])
def test_layout_mask_and_positions(bundle, policy):
    for tree, *_, arrays in draft_trees(bundle, policy, cycles=1):
        committed = 37
        vb = arrays.layout(committed, torch.device("cpu"))
        kept = [i for i in range(len(tree)) if tree.kept[i]]
        assert sorted(vb.pool_idx) == kept and vb.pool_idx[0] == 0
        T = len(kept)
        pos_of = {p: j for j, p in enumerate(vb.pool_idx)}
        assert vb.tokens.tolist() == [tree.tokens[p] for p in vb.pool_idx]
        assert vb.positions.tolist() == [committed + tree.depths[p] for p in vb.pool_idx]
        mask = vb.mask.numpy()
        assert mask.shape == (T, T) and mask.dtype == np.uint8 and set(np.unique(mask)) <= {0, 1}
        for j, p in enumerate(vb.pool_idx):
            anc = {pos_of[a] for a in [0] + path_of(tree, p)}  # root, ancestors and self
            assert set(np.flatnonzero(mask[j]).tolist()) == anc
            want_parent = -1 if p == 0 else pos_of[tree.parents[p]]
            assert vb.parent_pos[j] == want_parent
            assert want_parent < j  # parents are laid out before children
            kids = [pos_of[c] for c in children(tree, p)]
            assert vb.children[j] == kids


def test_rerank_synthetic():
    """Rerank keeps the N-1 highest values, breaks ties towards shallower then earlier nodes, and
    adds missing ancestors (values need not be monotone in a synthetic tree)."""
    #            0     1     2     3     4     5     6     7
    parents = [-1,    0,    0,    1,    1,    2,    3,    5]
    depths = [0,     1,    1,    2,    2,    2,    3,    3]
    values = [0.0, -1.0, -3.0, -1.5, -2.0, -2.0, -0.5, -2.0]
    n = len(parents)
    t = builder_of(list(range(n)), parents, depths, values=values, kept=[True] + [False] * (n - 1))
    Eagle2Policy(total_tokens=4).keep(t)
    # best 3: node 6 (-0.5), node 1 (-1.0), node 3 (-1.5); closure adds nothing (3's parent is 1)
    assert [i for i in range(n) if t.kept[i]] == [0, 1, 3, 6]
    t.kept = [True] + [False] * (n - 1)
    Eagle2Policy.rerank(t, 5)
    # 4th: value -2.0 tie among nodes 4 (depth 2), 5 (depth 2), 7 (depth 3) -> node 4
    assert [i for i in range(n) if t.kept[i]] == [0, 1, 3, 4, 6]
    t.kept = [True] + [False] * (n - 1)
    t.values[7] = -0.1  # a deep node better than its ancestors: closure must add 5 and 2
    Eagle2Policy(total_tokens=2).keep(t)
    assert [i for i in range(n) if t.kept[i]] == [0, 2, 5, 7]


@pytest.mark.parametrize("kw", [dict(total_tokens=0), dict(depth=0), dict(top_k=0), dict(total_tokens=2000),
                                dict(top_k=1.5)])
def test_eagle2_validation(kw):
    with pytest.raises(UserError):
        make_policy("eagle2", **kw)
    with pytest.raises(UserError):
        make_policy("no-such-policy")
