"""Losslessness (docs/algorithms.md §7).

(a) Greedy: static and EAGLE-2 decoding emit exactly plain greedy decoding's token ids on the real
    default model, 5 varied prompts x 64 new tokens, with the bundle's default head (whatever it
    is) and once with a random head.
(b) Sampling: on a tiny random Llama (vocab 12) with a random head, the joint distribution of the
    first 3 generated tokens (prefill token + one speculative cycle) over many fresh runs matches
    the exact target distribution (enumerated with transformers), by a chi-square test. Each
    chi-square test has a false-alarm rate of 1e-3 (a correct sampler fails it 0.1% of the time
    over random seeds); the seeds are fixed, so the suite is deterministic.
(c) The verification rules alone (top-k drafts and SpecInfer sampled drafts), with many samples.
"""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np
import pytest
import torch

from eagle2.decoding.decoder import Decoder
from eagle2.model.loading import load_bundle
from eagle2.cycle.sampling import SamplingParams, probs_from_logits
from eagle2.cycle import verify as V
from lossless_cases import ALPHA, EAGLE2_COMPACT, PROMPTS, SPROMPT, SV, chi_square, exact_joint

# ------------------------------------------------------------------ (a) greedy, real model

NEW_TOKENS = 64


def run(bundle, policy, p, **kw):
    dec = Decoder(bundle, policy, max_new_tokens=NEW_TOKENS, record=False, **kw)
    dec.start(p["prompt"], raw=p.get("raw", False))
    dec.generate()
    return dec


@pytest.fixture(scope="module")
def plain_refs(real_bundle):
    return [run(real_bundle, "plain", p).generated for p in PROMPTS]


@pytest.mark.parametrize("policy,kw", [("static", {}), ("eagle2", EAGLE2_COMPACT)], ids=["static", "eagle2"])
@pytest.mark.slow
def test_greedy_identity_default_head(real_bundle, plain_refs, policy, kw):
    for p, ref in zip(PROMPTS, plain_refs):
        dec = run(real_bundle, policy, p, **kw)
        assert dec.generated == ref, f"{policy} diverged from plain greedy on {p['prompt'][:30]!r}"
        assert dec.target_forwards <= len(ref)  # every cycle emits >= 1 token
        assert len(ref) == NEW_TOKENS or dec.finished == "eos"


@pytest.mark.slow
def test_greedy_identity_random_head(real_bundle, plain_refs):
    """A random head (drafts nearly always rejected) with the paper's EAGLE-2 settings (N=60, d=5,
    k=10); 32 tokens, as every cycle of a random head costs a 60-token verification."""
    b = real_bundle if real_bundle.head_name.startswith("random") else load_bundle(head="random", dtype="float32")
    assert b.head_name.startswith("random")
    dec = Decoder(b, "eagle2", max_new_tokens=32, record=False, total_tokens=60, depth=5, top_k=10)
    dec.start(PROMPTS[0]["prompt"])
    dec.generate()
    assert dec.generated == plain_refs[0][:32]


# ------------------------------------------------------------------ (b) sampling, tiny model
# (the tiny model and its exact logits: conftest.py's sampling_setup)

SAMPLING_CASES = [
    # (policy, policy kwargs, temperature, top_p, runs)
    ("eagle2", dict(total_tokens=6, depth=2, top_k=3), 1.0, 1.0, 1500),
    ("eagle2", dict(total_tokens=6, depth=2, top_k=3), 0.7, 0.9, 1000),
    ("static", {}, 1.0, 1.0, 1000),
    ("static", {}, 0.7, 0.9, 1000),
]


@pytest.mark.parametrize("policy,kw,temp,top_p,runs", SAMPLING_CASES,
                         ids=[f"{c[0]}-T{c[2]}-p{c[3]}" for c in SAMPLING_CASES])
@pytest.mark.slow
def test_sampling_first_tokens_match_target(sampling_setup, policy, kw, temp, top_p, runs):
    bundle, logits = sampling_setup
    sp = SamplingParams(temperature=temp, top_p=top_p, seed=0)
    P = exact_joint(logits, sp)
    assert abs(P.sum() - 1) < 1e-6
    dec = Decoder(bundle, policy, sampling=sp, max_new_tokens=3, record=False, **kw)
    counts: Counter = Counter()
    accepted = 0
    for seed in range(runs):
        dec.sampling.seed = 10_000 + seed
        dec.start(input_ids=SPROMPT)
        st = dec.step()
        accepted += st.accepted_len
        while dec.finished is None:
            dec.step()
        counts[tuple(dec.generated)] += 1
    # the tree matters: speculative cycles accept draft tokens a fair share of the time
    assert accepted / runs > 0.3
    for cell in counts:
        assert len(cell) == 3 and P[cell] > 0, f"sampled impossible sequence {cell}"
    probs = {c: float(P[c]) for c in itertools.product(range(SV), repeat=3) if P[c] > 0}
    pval, bins = chi_square(counts, probs, runs)
    assert bins >= 6  # a non-degenerate test (many more cells are pooled)
    assert pval > ALPHA, f"chi-square p = {pval:.2e} over {bins} bins"


# ------------------------------------------------------------------ (c) verification rules alone

def _tree_two_levels(rng: np.random.Generator, V: int, n_root_children: int, n_grand: int):
    """Root with children (verify positions 1..a), the first child with grandchildren."""
    tokens = [0]
    children = [[]]
    kids = rng.choice(V, size=n_root_children, replace=False).tolist()
    for t in kids:
        children[0].append(len(tokens))
        tokens.append(int(t))
        children.append([])
    first = children[0][0]
    for t in rng.choice(V, size=n_grand, replace=False).tolist():
        children[first].append(len(tokens))
        tokens.append(int(t))
        children.append([])
    return tokens, children


def _joint_test(sample_fn, P_first: np.ndarray, P_second: dict, n: int) -> float:
    """Sequences (first, second-or--1): P(first=a) = P_first[a]; if a is a tree child with its own
    distribution P_second[a], the second token follows it, else the cycle ends (-1)."""
    counts = Counter(sample_fn(i) for i in range(n))
    probs = {}
    for a in range(len(P_first)):
        if a in P_second:
            for b in range(len(P_first)):
                if P_first[a] * P_second[a][b] > 0:
                    probs[(a, b)] = P_first[a] * P_second[a][b]
        elif P_first[a] > 0:
            probs[(a, -1)] = P_first[a]
    assert set(counts) <= set(probs), set(counts) - set(probs)
    return chi_square(counts, probs, n)[0]


@pytest.mark.parametrize("temp,top_p,top_k", [(1.0, 1.0, 0), (0.6, 0.8, 3)])
def test_topk_sampling_rule(temp, top_p, top_k):
    rng = np.random.default_rng(5)
    V_ = 10
    tokens, children = _tree_two_levels(rng, V_, 3, 3)
    logits = torch.tensor(rng.normal(0, 1.5, size=(len(tokens), V_)), dtype=torch.float32)
    sp = SamplingParams(temperature=temp, top_p=top_p, top_k=top_k)
    p = probs_from_logits(logits, sp).double().numpy()
    first_child_tok = tokens[children[0][0]]
    P_second = {first_child_tok: p[children[0][0]]}
    for c in children[0][1:]:  # leaves: their own row gives the bonus after acceptance
        P_second[tokens[c]] = p[c]
    gen = torch.Generator().manual_seed(123)

    def sample(_):
        path, bonus = V.topk_sampling(tokens, children, logits, sp, gen)
        out = [tokens[j] for j in path] + [bonus]
        return (out[0], out[1] if len(out) > 1 else -1)

    assert _joint_test(sample, p[0], P_second, 8000) > ALPHA


def test_specinfer_rule_with_sampled_drafts():
    """Children sampled from q without replacement, then the SpecInfer rule: output ~ p."""
    rng = np.random.default_rng(9)
    V_ = 8
    p_logits = torch.tensor(rng.normal(0, 1.5, size=(1, V_)), dtype=torch.float32)
    q = torch.softmax(torch.tensor(rng.normal(0, 1.5, size=V_), dtype=torch.float32), -1)
    sp = SamplingParams(temperature=1.0)
    p = probs_from_logits(p_logits, sp).double().numpy()[0]
    gen = torch.Generator().manual_seed(7)
    logits = p_logits.expand(4, V_)  # root + up to 3 children, each a leaf

    def sample(_):
        kids = torch.multinomial(q, 3, replacement=False, generator=gen).tolist()
        tokens = [0] + kids
        children = [[1, 2, 3], [], [], []]
        path, bonus = V.specinfer(tokens, children, logits, [q, None, None, None], sp, gen)
        return ([tokens[j] for j in path] + [bonus])[0]

    n = 8000
    counts = Counter(sample(i) for i in range(n))
    pval, _ = chi_square({(a,): c for a, c in counts.items()}, {(a,): p[a] for a in range(V_)}, n)
    assert pval > ALPHA


def _ref_probs(logits: np.ndarray, temp: float, top_p: float, top_k: int) -> np.ndarray:
    """Independent numpy reference of temperature -> top-k -> top-p (smallest prefix reaching top_p)."""
    z = logits / temp
    if top_k:
        kth = np.sort(z)[::-1][top_k - 1]
        z = np.where(z < kth, -np.inf, z)
    pr = np.exp(z - z.max())
    pr /= pr.sum()
    order = np.argsort(-pr, kind="stable")
    keep = np.zeros_like(pr, dtype=bool)
    acc = 0.0
    for i in order:
        if acc >= top_p:
            break
        keep[i] = True
        acc += pr[i]
    pr = np.where(keep, pr, 0.0)
    return pr / pr.sum()


@pytest.mark.parametrize("temp,top_p,top_k", [(1.0, 1.0, 0), (0.7, 0.9, 0), (1.5, 0.5, 0), (0.8, 1.0, 3),
                                              (1.0, 0.75, 5), (2.0, 0.3, 0)])
def test_probs_from_logits_reference(temp, top_p, top_k):
    rng = np.random.default_rng(2)
    for _ in range(20):
        lg = rng.normal(0, 2.0, size=16)
        ours = probs_from_logits(torch.tensor(lg, dtype=torch.float32), SamplingParams(temp, top_p, top_k))
        assert np.allclose(ours.numpy(), _ref_probs(lg, temp, top_p, top_k), atol=1e-6)
