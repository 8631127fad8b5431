"""The hardware-aware budget (docs/algorithms.md §9): EAGLE-2 whose N, depth and beam width are
chosen every cycle from this machine's measured costs.

t(N), the target's time to verify N tokens, starts from the best table known without measuring
(model/priors.py's `prior_times`: the cached quiet measurement, else an estimate while the
background measurer takes one) and is corrected by every verification the decoder times
(`observe`, into a `LiveVerifyTimes`); the corrections stay in the policy. Each cycle keeps the N
that maximises expected tokens per second, (1 + sum of the N-1 best node values) /
(t_draft + t(N)): node values approximate acceptance probabilities, so their sum estimates the
accepted length, once calibrated to what the target accepts (AcceptanceOdds: this head's values
were measured underconfident, a value of 0.55 accepted 70% of the time). Before each draft call
the budget predicts the values of the children of the beam's w best nodes (their values times the
running mean draft probability of each child rank) and expands the w that makes the best rate
once that call's price is paid, or stops. A call's price by its width is learnt from the calls
made in earlier cycles (before any, what the head took for the root's reading this cycle); the
ranks' probabilities start from the root's own children. So the first cycle drafts what pays as
any other, and no cycle explores the whole tree. A cycle's choices are a function of what it
starts from (t(N), the prices, the ranks' probabilities, the calibration, the root's reading) and
of the head's outputs: the time it counts as spent is the prices' prediction for the calls it has
chosen, not a clock, and what its calls took is learnt once the cycle's tree is drafted; so the
kernels' one-call drafting and the loop in policies/eagle2.py draw the same tree, node for node
(tests/test_native_cycle.py). Every EXPLORE_EVERY cycles the budget verifies one other N (twice
the best, then half of it) and expands at least one level, so that a wrong prior for sizes it
never chooses gets re-measured; any N is lossless, so exploring costs only time.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import numpy as np

from ..cycle.tree import TreeRecord
from ..cycle.tree_builder import TreeBuilder
from ..errors import check
from ..model.measurer import request_measurement
from ..model.priors import prior_times
from ..model.tree_modes import BudgetInputs, Explore, TreeBudget
from ..model.verify_times import LiveVerifyTimes
from ..phases import PhaseClock
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


MAX_WIDTH = 64   # a beam is never wider than top_k's cap


def calibrated(p: np.ndarray, odds: float) -> np.ndarray:
    """Path values' acceptance estimates with their odds multiplied by `odds`: p k / (p k + 1 - p),
    in qt::calibrated's operations and order (the kernels' budget computes the same bits)."""
    pk = p * odds
    return pk / (pk + (1.0 - p))


class AcceptanceOdds:
    """How a draft path value maps to the chance the target accepts its node: one number, the odds'
    multiplier k (p -> p k / (p k + 1 - p), a shift of the logit by log k), fitted by maximum
    likelihood to the last `memory` verified nodes (their values and whether they were accepted)
    under a normal prior on log k (0: the values as they are, EAGLE-2's premise). Measured on the
    60 held-out prompts (eagle2 (60, 5, 10), q4_1): every value bin accepted more often than its
    value said, by about one such shift (0.24 -> 0.34, 0.55 -> 0.70, 0.75 -> 0.86).
    It runs inside a visitor's cycle, where a numpy call costs microseconds: a cycle's few nodes
    are appended to lists, and every `every` cycles the fit takes Newton steps from the last one
    (the log-likelihood is concave in log k) on the nodes kept."""

    def __init__(self, memory: int = 256, prior_sd: float = 1.0, every: int = 8, steps: int = 2):
        self.memory, self.prior_sd, self.every, self.steps = memory, prior_sd, every, steps
        self.p: list[float] = []
        self.y: list[float] = []
        self.cycles = 0
        self.log_odds = 0.0
        self.odds = 1.0

    def observe(self, values, accepted) -> None:
        """One cycle's verified nodes: their path values (probabilities) and acceptance (bools)."""
        self.p += values
        self.y += accepted
        self.cycles += 1
        if self.cycles % self.every == 0:
            self.fit()

    def fit(self) -> None:
        del self.p[: -self.memory], self.y[: -self.memory]
        if not self.p:
            return
        p, y, a = np.array(self.p), np.array(self.y, dtype=np.float64), self.log_odds
        inv_var, hits = 1.0 / self.prior_sd ** 2, float(y.sum())
        for _ in range(self.steps):
            sc = calibrated(p, math.exp(a))
            a += (hits - float(sc.sum()) - a * inv_var) / (float(np.dot(sc, 1.0 - sc)) + inv_var)
        self.log_odds = min(3.0, max(-3.0, a))
        self.odds = math.exp(self.log_odds)


class CallPrices:
    """A draft call's seconds by its width, learnt from the calls made: a running mean per width,
    read between widths linearly and beyond them flat; before any call, `fallback`. One array by
    width (NaN: not seen), which the kernels' drafting reads (qt::Prices, the same reading)."""

    def __init__(self, decay: float = 0.2):
        self.decay = decay
        self.seconds = np.full(MAX_WIDTH + 1, np.nan)

    def observe(self, width: int, seconds: float) -> None:
        old = float(self.seconds[width])   # (a Python float: numpy's scalar calls cost more in a cycle)
        self.seconds[width] = seconds if math.isnan(old) else (1 - self.decay) * old + self.decay * seconds

    def price(self, width: int, fallback: float) -> float:
        seen = np.flatnonzero(~np.isnan(self.seconds))
        if not len(seen):
            return fallback
        return float(np.interp(width, seen, self.seconds[seen]))

    def mean(self) -> float:
        seen = self.seconds[~np.isnan(self.seconds)]
        return float(seen.mean()) if len(seen) else 0.0


@dataclass
class BudgetCycle:
    """What the budget reads and keeps during one cycle's drafting, gone with it (the policy keeps
    only what it learns across cycles)."""
    clock: PhaseClock            # the cycle's (the decoder's time): what each call took, read on it
    tn: np.ndarray               # t(N) for N = 1..total_tokens, read once a cycle
    call_guess: float            # a call's price before any was measured: what the root's reading took
    rank_prob: np.ndarray        # [top_k] a child's predicted draft probability by rank
    explore_depth: bool          # one call at least below the root's children this cycle
    explore: Explore             # verify the best N, twice it or half of it
    odds: float = 1.0            # the acceptance odds' multiplier this cycle reads (AcceptanceOdds)
    spent: float = 0.0           # the prices' seconds for the calls chosen so far: the time the rule reads
    width: int = 0               # the width of the call in flight (0: none)
    level_t0: float = 0.0        # when it was chosen, on the clock
    took: list = field(default_factory=list)   # (width, seconds) of each call made: the prices' lesson


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
    calibrate: bool = True      # calibrate node values to the acceptance the verifications show
    name: ClassVar[str] = "eagle2-auto"
    record_type: ClassVar[type] = AutoRecord
    uses_costs: ClassVar[bool] = True

    def __post_init__(self):
        self.prices = CallPrices()  # a draft call's seconds by width, measured
        self.acceptance = AcceptanceOdds()   # node values calibrated to what the target accepted
        self.rank_prob = None      # running mean draft probability of the child at each rank
        self.stats = {"cycles": 0, "draft_calls": 0, "levels": {}, "n": {}, "explored": 0, "widths": {}}
        self.times: LiveVerifyTimes | None = None   # the prior, corrected by the verifications timed
        self.prior_source = "given"   # where the prior came from (priors.PriorTimes.source)
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

    def observe_acceptance(self, tree, vb, path_pos: list[int]) -> None:
        if self.calibrate:   # a few nodes a cycle: plain Python (a numpy call costs more than their work)
            values, took = tree.values, set(path_pos)
            self.acceptance.observe([math.exp(values[i]) for i in vb.pool_idx[1:]],
                                    [j in took for j in range(1, len(vb.pool_idx))])

    def native_budget(self) -> TreeBudget | None:
        if type(self) not in (AutoBudgetPolicy, AutoBudgetNPolicy):
            return None
        return TreeBudget.AUTO if self.adaptive_depth else TreeBudget.AUTO_N

    @staticmethod
    def _pool_values(tree: TreeBuilder, cyc: BudgetCycle) -> np.ndarray:
        return calibrated(np.exp(np.asarray(tree.values[1:], dtype=np.float64)), cyc.odds)

    def begin(self, runner) -> BudgetCycle:
        check(len(self.prior_times) >= 2, "The auto budget needs a measured t(N) at two N at least (prepare it).")
        # before any call of its own, a call costs what the head took for the root's reading, and
        # a child of rank r is as likely as the root's own
        if self.rank_prob is not None:
            ranks = self.rank_prob
        else:
            root_top = np.exp(runner.topk(runner.root_logp, self.top_k)[0].double().cpu().numpy())
            ranks = np.pad(root_top, (0, self.top_k - len(root_top)))
        k = self.stats["cycles"] % EXPLORE_EVERY
        explore = (Explore.BEST if not self.learn_costs else Explore.DOUBLE if k == 1
                   else Explore.HALF if k == 1 + EXPLORE_EVERY // 2 else Explore.BEST)
        return BudgetCycle(clock=runner.clock, tn=self.times.table(self.total_tokens), call_guess=runner.root_seconds,
                           rank_prob=ranks, explore_depth=self.learn_costs and k == EXPLORE_EVERY // 4,
                           explore=explore, odds=self.acceptance.odds)

    @staticmethod
    def _level_done(cyc: BudgetCycle) -> None:
        """The call just made and its candidates: what a call of that width took (learnt at keep)."""
        now = cyc.clock.now()
        if cyc.width:
            cyc.took.append((cyc.width, now - cyc.level_t0))
        cyc.level_t0, cyc.width = now, 0

    def expand_width(self, level, beam_values, tree, cyc=None) -> int:
        self._level_done(cyc)
        if not self.adaptive_depth:
            cyc.width = len(beam_values)
            return cyc.width
        beam = np.exp(beam_values.double().cpu().numpy())
        children = calibrated(beam[:, None] * cyc.rank_prob[None, : self.top_k], cyc.odds)  # each beam node's, predicted
        widths = [0] + sorted({min(w, len(beam)) for w in WIDTHS})
        spent_s = np.array([cyc.spent] + [cyc.spent + self.prices.price(w, cyc.call_guess) for w in widths[1:]])
        rates = best_rates(self._pool_values(tree, cyc), children, widths, spent_s, cyc.tn, self.total_tokens)
        cyc.width = widths[int(np.argmax(rates))]  # the first of equal rates: the narrowest, or no call
        if cyc.width == 0 and cyc.explore_depth and level == 1:
            cyc.width = 1  # every EXPLORE_EVERY cycles one call at least: its price and ranks, re-measured
        if cyc.width:
            cyc.spent += self.prices.price(cyc.width, cyc.call_guess)
        return cyc.width

    def keep(self, tree: TreeBuilder, cyc=None) -> None:
        self._level_done(cyc)
        spent = cyc.spent
        best_n, rate = best_rate(self._pool_values(tree, cyc), spent, cyc.tn, self.total_tokens)
        n = self._explore(best_n, len(tree.tokens), cyc.explore)
        self.rerank(tree, n)
        calls = tree.draft_calls - 1  # levels expanded below the root's children (0: stopped at once)
        ranks, levels = np.asarray(tree.ranks), np.asarray(tree.levels)
        sel = (levels >= 1) & (ranks < self.top_k)   # the children of expanded nodes, by rank
        sums = np.bincount(ranks[sel], weights=np.exp(np.asarray(tree.logp, dtype=np.float64)[sel]),
                           minlength=self.top_k)
        tree.record = self._learn(cyc, sums, np.bincount(ranks[sel], minlength=self.top_k),
                                  [len(b) for b in tree.beam[:calls]], n, best_n,
                                  float(rate * (spent + cyc.tn[best_n - 1])), tree.draft_calls, cyc.took)

    def native_inputs(self, cyc: BudgetCycle) -> BudgetInputs:
        """The same rule in the kernels' one call: they read this cycle's tables and the prices,
        and return what each call took, learnt in native_learn as keep learns it."""
        return BudgetInputs(mode=self.native_budget(), tn=cyc.tn, rank_prob=cyc.rank_prob, prices=self.prices.seconds,
                            call_guess=cyc.call_guess, odds=cyc.odds, explore_depth=cyc.explore_depth,
                            explore=cyc.explore)

    def native_learn(self, tree, counts, cyc: BudgetCycle) -> None:
        c, calls = tree.cols, tree.draft_calls - 1
        widths = c["beam_len"][:calls].tolist()
        tree.record = self._learn(cyc, c["rank_sum"], c["rank_count"], widths, counts.n_verify, counts.best_n,
                                  counts.expected, tree.draft_calls, list(zip(widths, c["level_s"][:calls].tolist())))

    def _explore(self, best_n: int, pool: int, explore: Explore) -> int:
        """The N to verify this cycle: the best one, except every EXPLORE_EVERY cycles twice it
        (and, half-way between, half of it), to re-measure sizes the budget would not choose."""
        if explore == Explore.DOUBLE:
            return min(self.total_tokens, pool, max(2, 2 * best_n))
        if explore == Explore.HALF:
            return max(1, best_n // 2)
        return best_n

    def _learn(self, cyc: BudgetCycle, rank_sum: np.ndarray, rank_count: np.ndarray, widths: list[int],
               n: int, best_n: int, expected: float, draft_calls: int, took: list) -> AutoRecord:
        """What the cycle teaches (the ranks' probabilities, from the draft probabilities of the
        expanded nodes' children summed by rank; the prices, from what each call took: `took`,
        (width, seconds) a call) and reports (its record, the stats)."""
        self._learn_ranks(cyc, rank_sum, rank_count)
        for width, seconds in took:
            self.prices.observe(int(width), float(seconds))
        st = self.stats
        st["explored"] += n != best_n
        st["cycles"] += 1
        st["draft_calls"] += draft_calls
        calls = len(widths)
        st["levels"][str(calls)] = st["levels"].get(str(calls), 0) + 1
        st["n"][str(n)] = st["n"].get(str(n), 0) + 1
        for w in widths:
            st["widths"][str(w)] = st["widths"].get(str(w), 0) + 1
        return AutoRecord(n=n, levels=calls, expected_tokens=expected, best_n=best_n, widths=widths)

    def _learn_ranks(self, cyc: BudgetCycle, sums: np.ndarray, counts: np.ndarray) -> None:
        """Running mean draft probability of the rank-r child of an expanded node (levels >= 1)."""
        # (ten ranks: plain Python over lists, numpy's calls cost more than their work in a cycle)
        sums, counts = sums.tolist(), counts.tolist()
        if not any(counts):
            return
        if self.rank_prob is None:   # the first cycle takes the ranks it saw as they are
            old = cyc.rank_prob.tolist()
            self.rank_prob = np.array([s / c if c > 0 else o for s, c, o in zip(sums, counts, old)])
        else:
            old = self.rank_prob.tolist()
            self.rank_prob = np.array([0.9 * o + 0.1 * (s / c) if c > 0 else o for s, c, o in zip(sums, counts, old)])

    def summary_stats(self) -> dict:
        # "prior": where the prior came from, under the key the recorded stats already use
        return {**self.stats, "verify_s": self.times.estimates() if self.times else {}, "prior": self.prior_source,
                "draft_call_s": self.prices.mean(), "acceptance_odds": self.acceptance.odds}


@dataclass
class AutoBudgetNPolicy(AutoBudgetPolicy):
    """The auto budget choosing N only, at a fixed depth and the whole beam (to compare against
    adaptive depth and width)."""
    adaptive_depth: bool = False
    name: ClassVar[str] = "eagle2-auto-n"
