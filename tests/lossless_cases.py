"""What the losslessness tests share (test_lossless, test_budget, test_quantized, test_native_cycle):
the real model's prompts, a greedy decode's tokens, the tiny sampling model's prompt and vocabulary
(its fixture, `sampling_setup`, is in conftest.py), the exact joint distribution of its first
three tokens, and the chi-square test."""
from __future__ import annotations

from collections import Counter

import numpy as np

from eagle2.cycle.sampling import SamplingParams, probs_from_logits

ALPHA = 1e-3  # false-alarm rate of each chi-square test

# (a) greedy, real model
PROMPTS = [
    dict(prompt="Write a short story about a robot who learns to paint."),
    dict(prompt="List ten prime numbers and explain why each one is prime."),
    dict(prompt='def fibonacci(n):\n    """Return the n-th Fibonacci number."""\n', raw=True),
    dict(prompt="Explain in detail how the gears of a bicycle work."),
    dict(prompt="Traduis en français : The weather is nice today and we are going to the beach."),
]
EAGLE2_COMPACT = dict(total_tokens=16, depth=4, top_k=4)  # pool 69 nodes; keeps the CPU suite short

# (b) sampling, tiny model
SV = 12
SPROMPT = [3, 7, 1, 9]


def greedy_tokens(bundle, policy, max_new_tokens: int, **start) -> list[int]:
    """The tokens a greedy decoder with `policy` ("plain" or a tree policy) generates from `start`
    (input_ids=..., messages=... or prompt=...), run to its end."""
    from eagle2.decoding.decoder import Decoder
    d = Decoder(bundle, policy, SamplingParams(), max_new_tokens=max_new_tokens, record=False)
    d.start(**start)
    d.generate()
    return d.generated


def exact_joint(logits, sp: SamplingParams) -> np.ndarray:
    """P(x1, x2, x3) under plain sampling with `sp`: [V, V, V]."""
    p1 = probs_from_logits(logits[0, -3], sp).double()                          # [V]
    p2 = probs_from_logits(logits[::SV, -2], sp).double()                       # [V(x1), V]
    p3 = probs_from_logits(logits[:, -1], sp).double().view(SV, SV, SV)         # [x1, x2, V]
    return (p1[:, None, None] * p2[:, :, None] * p3).numpy()


def chi_square(counts: Counter, probs: dict, n: int) -> tuple[float, int]:
    """Pearson chi-square over cells with expected count >= 5; the rest pooled into one bin."""
    obs, exp = [], []
    pooled_o = pooled_e = 0.0
    for cell, p in probs.items():
        e = n * p
        if e >= 5:
            obs.append(counts.get(cell, 0))
            exp.append(e)
        else:
            pooled_o += counts.get(cell, 0)
            pooled_e += e
    if pooled_e > 0:
        obs.append(pooled_o)
        exp.append(pooled_e)
    from scipy import stats   # here: the prompts above are read where scipy is not installed (test_cuda on a GPU)
    obs, exp = np.array(obs, float), np.array(exp, float)
    stat = float(((obs - exp) ** 2 / exp).sum())
    return float(stats.chi2.sf(stat, len(obs) - 1)), len(obs)
