"""The hardware-aware budget (eagle2/policies/auto.py, docs/algorithms.md §9).

1. best_rate picks the N that maximises (1 + sum of the N-1 best values) / (spent + t(N)).
2. Adaptive depth follows the costs: when verification dwarfs a draft call it drafts every
   level; when a draft call costs far more than verification it makes no calls after the
   first (measuring) cycle.
3. Lossless: greedy output equals plain greedy on the real model, and under sampling the first
   three tokens follow the target's exact distribution (chi-square, as tests/test_lossless.py).
"""
from __future__ import annotations

import itertools
from collections import Counter

import numpy as np

from eagle2.policies.auto import AutoBudgetPolicy, best_rate
from eagle2.cycle.decoder import Decoder
from eagle2.cycle.sampling import SamplingParams

from test_lossless import ALPHA, SPROMPT, SV, chi_square, exact_joint, sampling_setup  # noqa: F401 (fixture)


def test_best_rate_is_the_argmax_of_expected_tokens_per_second():
    t = {1: 1.0, 2: 1.1, 3: 1.2, 4: 3.0}.get
    vals = np.array([0.9, 0.5, 0.1])
    n, rate = best_rate(vals, 0.2, t)
    # n=1: 1/1.2; n=2: 1.9/1.3; n=3: 2.4/1.4 (best); n=4: 2.5/3.2
    assert n == 3 and abs(rate - 2.4 / 1.4) < 1e-12
    assert best_rate(np.array([]), 0.0, t)[0] == 1
    assert best_rate(vals, 0.2, t, max_n=2)[0] == 2


def auto(profile: dict, **kw) -> AutoBudgetPolicy:
    p = AutoBudgetPolicy(profile=profile, depth=kw.pop("depth", 3), top_k=kw.pop("top_k", 3),
                         total_tokens=kw.pop("total_tokens", 8), **kw)
    p.validate()
    return p


def test_adaptive_depth_follows_costs(tiny_target):
    from eagle2.model.loading import load_bundle
    folder, _ = tiny_target("sampling", vocab=SV, hidden=32, heads=4, kv_heads=2, inter=64, lm_std=0.5, seed=3)
    bundle = load_bundle(target=str(folder), head="random", seed_random_head=1)
    # total_tokens 64 > the whole pool (30 nodes), so every drafted node can be verified
    slow_verify = auto({1: 10.0, 64: 10.0}, total_tokens=64)   # a draft call is nothing next to a verification
    cheap_verify = auto({1: 1e-7, 64: 1e-7}, total_tokens=64)  # a draft call costs far more than it returns
    for pol in (slow_verify, cheap_verify):
        dec = Decoder(bundle, pol, max_new_tokens=24, record=False)
        dec.start(input_ids=SPROMPT)
        dec.generate()
    assert set(slow_verify.stats["levels"]) == {"3"}   # every level of depth 3, every cycle
    levels = cheap_verify.stats["levels"]             # the first cycle measures, then no calls
    assert levels.get("3", 0) == 1 and levels.get("0", 0) == cheap_verify.stats["cycles"] - 1


def test_greedy_identity_real_model(real_bundle):
    from test_lossless import PROMPTS
    from eagle2.model.timing import verify_profile
    prof = verify_profile(real_bundle)
    for p in PROMPTS[:2]:
        ref = Decoder(real_bundle, "plain", max_new_tokens=48, record=False)
        ref.start(p["prompt"], raw=p.get("raw", False))
        ref.generate()
        dec = Decoder(real_bundle, auto(prof, depth=5, top_k=10, total_tokens=32), max_new_tokens=48, record=False)
        dec.start(p["prompt"], raw=p.get("raw", False))
        dec.generate()
        assert dec.generated == ref.generated


def test_sampling_first_tokens_match_target(sampling_setup):
    bundle, logits = sampling_setup
    sp = SamplingParams(temperature=1.0, top_p=1.0, seed=0)
    P = exact_joint(logits, sp)
    # verification is cheap next to nothing here, so the budget keeps several nodes per cycle
    pol = auto({1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}, depth=2, total_tokens=6)
    dec = Decoder(bundle, pol, sampling=sp, max_new_tokens=3, record=False)
    runs, counts, accepted = 1500, Counter(), 0
    for seed in range(runs):
        dec.sampling.seed = 20_000 + seed
        dec.start(input_ids=SPROMPT)
        accepted += dec.step().accepted_len
        while dec.finished is None:
            dec.step()
        counts[tuple(dec.generated)] += 1
    assert accepted / runs > 0.3
    probs = {c: float(P[c]) for c in itertools.product(range(SV), repeat=3) if P[c] > 0}
    assert all(c in probs for c in counts)
    pval, bins = chi_square(counts, probs, runs)
    assert bins >= 6 and pval > ALPHA, f"chi-square p = {pval:.2e} over {bins} bins"
