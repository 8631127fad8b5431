"""Prepacked CPU weights (llama.PackedWeight): same products as F.linear, never stale, never in autograd.

1. For 1..64 rows (with and without bias) `linear` with a packed weight equals F.linear.
2. Changing the weight in place, or replacing it, makes the packed copy invalid: results follow the
   new weight.
3. With gradients on, the plain path runs and gradients reach the weight.
4. load_bundle packs the target and head on CPU fp32, and tree-verification logits and draft
   log-probabilities equal those of an unpacked copy.
"""
from __future__ import annotations

import json

import pytest
import torch
import torch.nn.functional as F

from eagle2.model.llama import Linear, PackedWeight, linear
from eagle2.model.loading import load_bundle


def test_packed_equals_plain_for_all_row_counts():
    g = torch.Generator().manual_seed(0)
    w = torch.randn(300, 96, generator=g)
    b = torch.randn(300, generator=g)
    pw = PackedWeight.build(w)
    assert pw is not None, "this torch build has oneDNN: the packed path must be available on CPU"
    for rows in (1, 2, 3, 7, 16, 33, 64):
        x = torch.randn(rows, 96, generator=g)
        for bias in (None, b):
            torch.testing.assert_close(linear(x, w, bias, pw), F.linear(x, w, bias), rtol=1e-5, atol=1e-4)
    x3 = torch.randn(2, 5, 96, generator=g)  # batched [B, T, D] inputs keep their shape
    torch.testing.assert_close(linear(x3, w, b, pw), F.linear(x3, w, b), rtol=1e-5, atol=1e-4)


def test_packed_copy_never_goes_stale():
    m = Linear(64, 32, bias=False)
    with torch.no_grad():
        m.pack()
        assert m.packed is not None
        x = torch.randn(8, 64)
        m.weight.mul_(2.0)  # in place: the version counter moves
        torch.testing.assert_close(m(x), F.linear(x, m.weight), rtol=1e-5, atol=1e-4)
        m.weight = torch.nn.Parameter(torch.randn(32, 64))  # replaced: another tensor
        torch.testing.assert_close(m(x), F.linear(x, m.weight), rtol=1e-5, atol=1e-4)


def test_autograd_takes_the_plain_path():
    m = Linear(16, 8)
    m.pack()
    x = torch.randn(4, 16)
    m(x).sum().backward()
    assert m.weight.grad is not None and m.weight.grad.abs().sum() > 0


def test_bundle_is_packed_and_matches_unpacked(tiny_target):
    folder, _ = tiny_target("packed", vocab=64, lm_std=0.4)
    packed = load_bundle(target=str(folder), head="random")
    plain = load_bundle(target=str(folder), head="random", pack=False)  # another bundle, never a swap
    assert plain.target.lm_head.packed is None and plain.head.lm_packed is None
    assert packed.target.lm_head.packed is not None and packed.head.fc.packed is not None
    assert packed.head.lm_packed is not None
    ids = torch.tensor([3, 1, 4, 1, 5, 9, 2, 6, 5, 3])
    n = 6
    tree_mask = torch.ones(n, n, dtype=torch.bool).tril()
    tree_mask[3, 1:3] = False  # a branch: node 3 sees the root and itself only
    outs = []
    for b in (packed, plain):
        c = b.target.new_cache(32)
        b.target.forward_cached(c, ids, torch.arange(len(ids)))
        c.advance(len(ids))
        toks = torch.tensor([7, 8, 9, 10, 11, 12])
        f = b.target.forward_cached(c, toks, torch.tensor([10, 11, 12, 11, 12, 13]), tree_mask)
        outs.append((b.target.logits(f), b.head.draft_logprobs(f)))
    torch.testing.assert_close(outs[0][0], outs[1][0], rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(outs[0][1], outs[1][1], rtol=1e-5, atol=1e-4)


@pytest.mark.slow
def test_profile_cli_compares_packed_and_plain(tiny_target, tmp_path):
    from eagle2.tools.profile import main as profile_main
    folder, _ = tiny_target("packed", vocab=64, lm_std=0.4)
    out = tmp_path / "profile.json"
    assert profile_main(["--target", str(folder), "--head", "random", "--threads", "1", "--compare-pack",
                         "--out", str(out)]) == 0
    res = json.loads(out.read_text())
    assert "packed" in res["forward_id"] and "prepacked" in res["forward"]
    ab = res["packed_vs_plain_s"]
    assert set(ab) == {"1", "2", "4", "8", "16", "32", "64"}
    assert all(v["packed"] > 0 and v["plain"] > 0 for v in ab.values())
