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
    packed = "|packed" if bundle.packed else ""
    key = f"{bundle.name}|{bundle.device.type}|{str(bundle.dtype)}|{torch.get_num_threads()}t{packed}"
    path = cache_dir() / "verify_times.json"
    table = json.loads(path.read_text()) if path.exists() else {}
    if refresh or key not in table:
        table[key] = {str(k): v for k, v in measure_verify_times(bundle).items()}
        path.write_text(json.dumps(table, indent=1))
    return {int(k): v for k, v in table[key].items()}


def best_rate(values: np.ndarray, spent_s: float, t_of, max_n: int = 1 << 30) -> tuple[int, float]:
    """The N <= max_n (root + N-1 best nodes) maximising expected tokens per second of this
    cycle, (1 + sum of the N-1 largest acceptance estimates) / (spent_s + t(N)), and that rate."""
    vals = np.sort(values)[::-1]
    cum = np.concatenate([[0.0], np.cumsum(vals)])
    best_n, best = 1, 0.0
    for n in range(1, min(len(vals) + 1, max_n) + 1):
        rate = (1.0 + cum[n - 1]) / (spent_s + t_of(n))
        if rate > best:
            best_n, best = n, rate
    return best_n, best


@dataclass
class AutoBudgetPolicy(Eagle2Policy):
    """EAGLE-2 whose total_tokens, and with `adaptive_depth` its depth, are chosen each cycle from
    measured costs and node values (algorithms.md section 9: minimise (d * t_draft + t(N)) /
    expected accepted tokens).

    Depth: before each further draft call, the policy predicts the next level's node values (the
    beam's values times the running mean draft probability of each child rank) and drafts it only
    if that raises the cycle's best expected tokens per second once the call's measured cost is
    paid. Node values fall along every path, so a level that does not pay predicts that deeper
    ones will not either."""
    profile: dict = field(default_factory=dict)
    max_tokens: int = 64
    adaptive_depth: bool = True
    name: str = "eagle2-auto"

    def __post_init__(self):
        self.total_tokens = self.max_tokens
        self.call_s = 0.0          # running mean seconds of one draft call (measured)
        self.rank_prob = None      # running mean draft probability of the child at each rank
        self.stats = {"cycles": 0, "draft_calls": 0, "levels": {}, "n": {}}

    def validate(self) -> None:
        super().validate()
        check(len(self.profile) >= 2, "The auto budget needs a measured verification profile.")

    def t_of(self, n: int) -> float:
        xs = sorted(self.profile)
        return float(np.interp(n, xs, [self.profile[x] for x in xs]))

    def _pool_values(self, tree) -> np.ndarray:
        return np.exp(np.asarray(tree.values[1:], dtype=np.float64))

    def stop_early(self, level, beam_values, info, tree) -> bool:
        if not self.adaptive_depth or self.rank_prob is None or self.call_s == 0.0:
            return False  # the first cycle drafts in full to measure a call and the ranks
        spent = time.perf_counter() - self._t0
        vals = self._pool_values(tree)
        _, now = best_rate(vals, spent, self.t_of, self.max_tokens)
        beam = np.exp(beam_values.double().cpu().numpy())
        predicted = (beam[:, None] * self.rank_prob[None, : self.top_k]).ravel()
        _, nxt = best_rate(np.concatenate([vals, predicted]), spent + self.call_s, self.t_of, self.max_tokens)
        return nxt <= now

    def draft(self, runner, root):
        self._t0 = time.perf_counter()
        calls0 = runner.calls
        self.total_tokens = self.max_tokens
        tree = super().draft(runner, root)
        spent = time.perf_counter() - self._t0
        calls = runner.calls - calls0
        if calls:
            per = spent / calls
            self.call_s = per if self.call_s == 0.0 else 0.8 * self.call_s + 0.2 * per
        self._learn_ranks(tree)
        best_n, rate = best_rate(self._pool_values(tree), spent, self.t_of, self.max_tokens)
        tree.kept = [i == 0 for i in range(len(tree.tokens))]
        self.total_tokens = best_n
        self.rerank(tree)
        self.total_tokens = self.max_tokens  # caches are sized by the maximum
        # calls = levels expanded below the root's children (0: stopped before the first call);
        # the expected tokens are the chosen rate times the cycle's time
        tree.extra.update(auto_n=best_n, auto_levels=calls,
                          auto_expected_tokens=float(rate * (spent + self.t_of(best_n))))
        st = self.stats
        st["cycles"] += 1
        st["draft_calls"] += runner.calls
        st["levels"][str(calls)] = st["levels"].get(str(calls), 0) + 1
        st["n"][str(best_n)] = st["n"].get(str(best_n), 0) + 1
        return tree

    def _learn_ranks(self, tree) -> None:
        """Running mean draft probability of the rank-r child of an expanded node (levels >= 1)."""
        k = self.top_k
        sums, counts = np.zeros(k), np.zeros(k)
        for lp, r, lv in zip(tree.logp[1:], tree.ranks[1:], tree.levels[1:]):
            if lv >= 1 and r < k:
                sums[r] += np.exp(lp)
                counts[r] += 1
        if counts.sum() == 0:
            return
        seen = counts > 0
        cur = np.where(seen, sums / np.maximum(counts, 1), 0.0)
        if self.rank_prob is None:
            self.rank_prob = cur
        else:
            self.rank_prob = np.where(seen, 0.9 * self.rank_prob + 0.1 * cur, self.rank_prob)

    def summary_stats(self) -> dict:
        return dict(self.stats)
