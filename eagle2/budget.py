"""Hardware-aware tree budget (algorithms.md section 9): choose N per cycle from measured costs.

t(N), the target's time to verify N tokens after a context, is measured once per device and model
(cached as JSON). Each cycle drafts the full EAGLE-2 pool, then keeps the N that maximises
expected tokens per second, (1 + sum of the N-1 best node values) / (t_draft + t(N)): node values
approximate acceptance probabilities, so their sum estimates the accepted length.
"""
from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import numpy as np
import torch

from .errors import check
from .policies import Eagle2Policy
from .weights import cache_dir

GRID = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


@torch.no_grad()
def measure_verify_times(bundle, context: int = 256, repeats: int = 5, grid=GRID) -> dict[int, float]:
    """Median seconds of one target forward of N tree tokens (plus their logits) after `context`
    committed tokens, for N in grid."""
    tgt, dev = bundle.target, bundle.device
    cache = tgt.new_cache(context + max(grid) + 1)
    ids = torch.randint(0, tgt.args.vocab_size, (context,), device=dev)
    tgt.forward_cached(cache, ids, torch.arange(context, device=dev))
    cache.advance(context)
    out = {}
    for n in grid:
        toks = torch.randint(0, tgt.args.vocab_size, (n,), device=dev)
        pos = torch.arange(context, context + n, device=dev)
        mask = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
        times = []
        for r in range(repeats + 1):
            _sync(dev)
            t0 = time.perf_counter()
            tgt.logits(tgt.forward_cached(cache, toks, pos, mask))
            _sync(dev)
            if r:  # the first run warms up
                times.append(time.perf_counter() - t0)
        out[n] = float(np.median(times))
    return out


def verify_profile(bundle, refresh: bool = False) -> dict[int, float]:
    key = f"{bundle.name}|{bundle.device.type}|{str(bundle.dtype)}|{torch.get_num_threads()}t"
    path = cache_dir() / "verify_times.json"
    table = json.loads(path.read_text()) if path.exists() else {}
    if refresh or key not in table:
        table[key] = {str(k): v for k, v in measure_verify_times(bundle).items()}
        path.write_text(json.dumps(table, indent=1))
    return {int(k): v for k, v in table[key].items()}


@dataclass
class AutoBudgetPolicy(Eagle2Policy):
    """EAGLE-2 whose total_tokens is chosen each cycle from measured t(N) and node values."""
    profile: dict = field(default_factory=dict)
    max_tokens: int = 64
    name: str = "eagle2-auto"

    def __post_init__(self):
        self.total_tokens = self.max_tokens
        self.draft_time = 0.0  # running estimate, set by the decoder-independent timer below

    def validate(self) -> None:
        super().validate()
        check(len(self.profile) >= 2, "The auto budget needs a measured verification profile.")

    def t_of(self, n: int) -> float:
        xs = sorted(self.profile)
        return float(np.interp(n, xs, [self.profile[x] for x in xs]))

    def draft(self, runner, root):
        t0 = time.perf_counter()
        self.total_tokens = self.max_tokens
        tree = super().draft(runner, root)
        dt = time.perf_counter() - t0
        self.draft_time = dt if self.draft_time == 0 else 0.8 * self.draft_time + 0.2 * dt
        vals = np.sort(np.exp(np.asarray(tree.values[1:])))[::-1]
        cum = np.concatenate([[0.0], np.cumsum(vals)])
        best_n, best_rate = 1, 0.0
        for n in range(1, min(self.max_tokens, len(vals) + 1) + 1):
            rate = (1.0 + cum[n - 1]) / (self.draft_time + self.t_of(n))
            if rate > best_rate:
                best_n, best_rate = n, rate
        tree.kept = [i == 0 for i in range(len(tree.tokens))]
        self.total_tokens = best_n
        self.rerank(tree)
        self.total_tokens = self.max_tokens  # caches are sized by the maximum
        tree.extra["auto_n"] = best_n
        tree.extra["auto_expected_tokens"] = float(1.0 + cum[best_n - 1])
        return tree
