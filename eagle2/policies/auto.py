"""The hardware-aware budget (docs/algorithms.md §9): EAGLE-2 whose N, depth and beam width are
chosen every cycle from this machine's measured costs.

t(N), the target's time to verify N tokens, starts from the best table known without measuring
(model/timing.py's `prior_times`: the cached quiet measurement, else an estimate while the
background measurer takes one) and is corrected by every verification the decoder times
(`observe`, into a `LiveVerifyTimes`); the corrections stay in the policy. Each cycle keeps the N
that maximises expected tokens per second, (1 + sum of the N-1 best node values) /
(t_draft + t(N)): node values approximate acceptance probabilities, so their sum estimates the
accepted length. Before each draft call the budget predicts the values of the children of the
beam's w best nodes (their values times the running mean draft probability of each child rank)
and expands the w that makes the best rate once that call's measured price is paid, or stops.
A call's price by its width is learnt from the calls it makes, starting from what the head took
for the root's reading this cycle; the ranks' probabilities start from the root's own children.
So the first cycle drafts what pays as any other, and no cycle explores the whole tree. Every
EXPLORE_EVERY cycles the budget verifies one other N (twice the best, then half of it) and
expands at least one level, so that a wrong prior for sizes it never chooses gets re-measured;
any N is lossless, so exploring costs only time.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np

from ..cycle.tree import DraftTree, TreeRecord
from ..errors import check
from ..model.measurer import request_measurement
from ..model.timing import LiveVerifyTimes, prior_times
from .eagle2 import Eagle2Policy

EXPLORE_EVERY = 16
WIDTHS = (1, 2, 4, 8, 16)   # beam widths the budget weighs (those up to top_k, and top_k itself)


def best_rate(values: np.ndarray, spent_s: float, t, max_n: int = 1 << 30) -> tuple[int, float]:
    """The N <= max_n (root + N-1 best nodes) maximising expected tokens per second of this
    cycle, (1 + sum of the N-1 largest acceptance estimates) / (spent_s + t(N)), and that rate.
    `t` takes an array of N (LiveVerifyTimes.t does), or is that array for N = 1, 2, ... (the
    policy reads the cycle's table once)."""
    vals = np.sort(values)[::-1]
    m = min(len(vals) + 1, max_n)
    cum = np.concatenate([[0.0], np.cumsum(vals[: m - 1])])
    tn = t[:m] if isinstance(t, np.ndarray) else np.asarray(t(np.arange(1, m + 1)), dtype=np.float64)
    rate = (1.0 + cum) / (spent_s + tn)
    best = int(np.argmax(rate))  # the first of equal rates: the smallest N
    return best + 1, float(rate[best])


def best_rates(pool: np.ndarray, children: np.ndarray, widths: list[int], spent_s: np.ndarray, tn: np.ndarray,
               max_n: int) -> np.ndarray:
    """best_rate's rate for each width w of `widths` at once: the candidates are the pool's values
    and the children [beam, k] of the w best beam nodes (w = 0: none), the time spent_s[i] (each
    width's call priced in). One sort for every width: the budget weighs them inside the cycle."""
    k = children.shape[1] if children.ndim == 2 else 0
    cols = len(pool) + max(widths) * k
    cand = np.zeros((len(widths), cols))  # a zero adds no token and only time: never chosen over fewer
    cand[:, : len(pool)] = pool
    for i, w in enumerate(widths):
        cand[i, len(pool): len(pool) + w * k] = children[:w].ravel()
    cand = -np.sort(-cand, axis=1)
    m = min(cols + 1, max_n)
    cum = np.concatenate([np.zeros((len(widths), 1)), np.cumsum(cand[:, : m - 1], axis=1)], axis=1)
    return ((1.0 + cum) / (spent_s[:, None] + tn[None, :m])).max(axis=1)


class CallPrices:
    """A draft call's seconds by its width (rows), learnt from the calls made: a running mean per
    width, read between widths linearly and beyond them flat; before any call, `fallback`."""

    def __init__(self, decay: float = 0.2):
        self.decay = decay
        self.by_width: dict[int, float] = {}
        self._table = None   # (widths, seconds) sorted, for reading

    def observe(self, width: int, seconds: float) -> None:
        old = self.by_width.get(width)
        self.by_width[width] = seconds if old is None else (1 - self.decay) * old + self.decay * seconds
        self._table = None

    def price(self, width: int, fallback: float) -> float:
        if not self.by_width:
            return fallback
        if self._table is None:
            ws = sorted(self.by_width)
            self._table = (ws, [self.by_width[w] for w in ws])
        return float(np.interp(width, *self._table))

    def mean(self) -> float:
        return float(np.mean(list(self.by_width.values()))) if self.by_width else 0.0


@dataclass
class AutoRecord(TreeRecord):
    """The hardware-aware budget's choice this cycle."""
    kind: Literal["budget"] = "budget"
    n: int = 1                      # tokens verified, root included
    levels: int = 0                 # draft calls past the root's children
    expected_tokens: float = 1.0    # at the best N
    best_n: int | None = None       # the best N; differs from n when this cycle re-measures another size
    widths: list[int] = field(default_factory=list)   # the beam width of each draft call past the root's


@dataclass
class AutoBudgetPolicy(Eagle2Policy):
    """EAGLE-2 whose N (total_tokens is its cap), beam width (top_k is its cap and each expanded
    node's children) and, with `adaptive_depth`, depth (`depth` is its cap) are chosen each cycle
    to minimise (t_draft + t(N)) / expected accepted tokens.

    Width and depth: before each further draft call, the policy predicts the next level's node
    values for each width w (the w best beam values times the running mean draft probability of
    each child rank) and makes the call at the width that most raises the cycle's best expected
    tokens per second once the call's price is paid, or stops where none does. Node values fall
    along every path, so a level that does not pay predicts that deeper ones will not either."""
    total_tokens: int = 64
    prior_times: dict = field(default_factory=dict)   # t(N) in seconds to start from; prepare() finds one if empty
    adaptive_depth: bool = True
    learn_costs: bool = True    # correct t(N) from the verifications it times (and explore to do so)
    name: ClassVar[str] = "eagle2-auto"
    record_type: ClassVar[type] = AutoRecord
    uses_costs: ClassVar[bool] = True

    def __post_init__(self):
        self.prices = CallPrices()  # a draft call's seconds by width, measured
        self.rank_prob = None      # running mean draft probability of the child at each rank
        self.stats = {"cycles": 0, "draft_calls": 0, "levels": {}, "n": {}, "explored": 0, "widths": {}}
        self.times: LiveVerifyTimes | None = None   # the prior, corrected by the verifications timed
        self.prior_source = "given"   # where the prior came from (timing.PriorTimes.source)
        self._use(self.prior_times)

    def _use(self, prior: dict) -> None:
        self.prior_times = {int(n): float(v) for n, v in prior.items()}
        if self.prior_times:  # N stays within the measured table: no N is chosen on an extrapolation
            self.total_tokens = min(self.total_tokens, max(self.prior_times))
            self.times = LiveVerifyTimes(self.prior_times)

    def prepare(self, bundle) -> None:
        """Start from the best t(N) known without measuring: this runs inside a visitor's first
        Step, which must not wait seconds for a measurement on a CPU that other sessions share.
        Without a plausible cached table the background measurer is asked for one (the next
        sessions start from it); this one's live corrections fix its start within a few cycles.
        A table given by the caller is used as it is."""
        if self.times is None:
            prior = prior_times(bundle)
            if not prior.cached:
                request_measurement(bundle)
            self.prior_source = prior.source
            self._use(prior.times)
        check(len(self.prior_times) >= 2, "The auto budget needs a measured t(N) at two N at least.")

    def observe(self, n_verified: int, verify_s: float) -> None:
        if self.learn_costs:
            self.times.observe(n_verified, verify_s)

    @staticmethod
    def _pool_values(tree: DraftTree) -> np.ndarray:
        return np.exp(np.asarray(tree.values[1:], dtype=np.float64))

    def expand_width(self, level, beam_values, tree) -> int:
        now = self._clock.now()
        if self._width:  # the call just made and its candidates: what a call of that width costs
            self.prices.observe(self._width, now - self._level_t0)
        self._level_t0, self._width = now, 0
        if not self.adaptive_depth:
            self._width = len(beam_values)
            return self._width
        spent = now - self._t0
        beam = np.exp(beam_values.double().cpu().numpy())
        ranks = self.rank_prob if self.rank_prob is not None else self._root_ranks
        children = beam[:, None] * ranks[None, : self.top_k]   # each beam node's children, predicted
        widths = [0] + sorted({min(w, len(beam)) for w in WIDTHS})
        spent_s = np.array([spent] + [spent + self.prices.price(w, self._call_guess) for w in widths[1:]])
        rates = best_rates(self._pool_values(tree), children, widths, spent_s, self._tn, self.total_tokens)
        self._width = widths[int(np.argmax(rates))]  # the first of equal rates: the narrowest, or no call
        if self._width == 0 and self._explore_depth and level == 1:
            self._width = 1  # every EXPLORE_EVERY cycles one call at least: its price and ranks, re-measured
        return self._width

    def draft(self, runner, root):
        check(len(self.prior_times) >= 2, "The auto budget needs a measured t(N) at two N at least (prepare it).")
        # the cycle's clock (the decoder's time): the prices and the time spent are read on it
        self._clock = runner.clock
        self._t0 = self._clock.now()
        self._width, self._widths = 0, []
        self._tn = np.asarray(self.times.t(np.arange(1, self.total_tokens + 1)), dtype=np.float64)
        # before any call of its own, a call costs what the head took for the root's reading, and
        # a child of rank r is as likely as the root's own
        self._call_guess = runner.root_seconds
        root_top = np.exp(runner.topk(runner.root_logp, self.top_k)[0].double().cpu().numpy())
        self._root_ranks = np.pad(root_top, (0, self.top_k - len(root_top)))
        self._explore_depth = self.learn_costs and self.stats["cycles"] % EXPLORE_EVERY == EXPLORE_EVERY // 4
        try:
            return super().draft(runner, root)
        finally:
            # the clock reads the decoder's time: a cycle's, never kept past it (a fork of this
            # policy, the page's preview, copies what it learnt, not a decoder)
            self._clock = None

    def keep(self, tree: DraftTree) -> None:
        now = self._clock.now()
        if self._width:
            self.prices.observe(self._width, now - self._level_t0)
        spent = now - self._t0
        calls = tree.draft_calls - 1  # levels expanded below the root's children (0: stopped at once)
        widths = [len(b) for b in tree.beam[:calls]]
        self._learn_ranks(tree)
        best_n, rate = best_rate(self._pool_values(tree), spent, self._tn, self.total_tokens)
        n = self._explore(best_n, len(tree.tokens))
        self.rerank(tree, n)
        # the expected tokens are the chosen rate times the cycle's time
        tree.record = AutoRecord(n=n, levels=calls, expected_tokens=float(rate * (spent + self._tn[best_n - 1])),
                                 best_n=best_n, widths=widths)
        st = self.stats
        st["explored"] += n != best_n
        st["cycles"] += 1
        st["draft_calls"] += tree.draft_calls
        st["levels"][str(calls)] = st["levels"].get(str(calls), 0) + 1
        st["n"][str(n)] = st["n"].get(str(n), 0) + 1
        for w in widths:
            st["widths"][str(w)] = st["widths"].get(str(w), 0) + 1

    def _explore(self, best_n: int, pool: int) -> int:
        """The N to verify this cycle: the best one, except every EXPLORE_EVERY cycles twice it
        (and, half-way between, half of it), to re-measure sizes the budget would not choose."""
        k = self.stats["cycles"] % EXPLORE_EVERY
        if not self.learn_costs:
            return best_n
        if k == 1:
            return min(self.total_tokens, pool, max(2, 2 * best_n))
        if k == 1 + EXPLORE_EVERY // 2:
            return max(1, best_n // 2)
        return best_n

    def _learn_ranks(self, tree: DraftTree) -> None:
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
            self.rank_prob = np.where(seen, cur, self._root_ranks)
        else:
            self.rank_prob = np.where(seen, 0.9 * self.rank_prob + 0.1 * cur, self.rank_prob)

    def summary_stats(self) -> dict:
        # "prior": where the prior came from, under the key the recorded stats already use
        return {**self.stats, "verify_s": self.times.estimates() if self.times else {}, "prior": self.prior_source,
                "draft_call_s": self.prices.mean()}


@dataclass
class AutoBudgetNPolicy(AutoBudgetPolicy):
    """The auto budget choosing N only, at a fixed depth and the whole beam (to compare against
    adaptive depth and width)."""
    adaptive_depth: bool = False
    name: ClassVar[str] = "eagle2-auto-n"
