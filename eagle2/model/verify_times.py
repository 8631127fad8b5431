"""t(N), the time of one target forward over N tokens (a cycle verifying N tree tokens): a table
measured at a few N, and the one rule that reads it at any N.

Torch-free (numpy only), so the budget (policies/auto.py) and the page's what-if figures
(viz/whatif.py, viz/acceptance_whatif.py) read t(N) through the same class and price a tree the
same way. `LiveVerifyTimes` is the budget's in-cycle cost model: a prior table corrected by the
verifications timed, read once a cycle; measuring and caching tables is model/calibration.py's, the prior a budget starts from model/priors.py's.
"""
from __future__ import annotations

import bisect
import math
import statistics
from collections import deque
from collections.abc import Mapping

import numpy as np

# The key a trace's meta and a bench summary record t(N) under, {N: seconds} (JSON makes N a
# string). The name is older than this module and stays: the recorded files carry it.
RECORD_KEY = "verify_profile_s"


class VerifyTimes:
    """t(N) at the table's N, in seconds (or in any one unit: a what-if needs only ratios).

    Read at any N by `t`: linear between two points; below the smallest N, that point's time;
    beyond the largest N, the last segment's slope extended (never falling). Why extend: a forward
    over more tokens does more arithmetic, so past the last measured N its time keeps growing as
    it did; held flat, verifying 256 tokens would cost what 128 do and a big tree would look free
    (a GPU's t(N) is flat only while reading the weights dominates, then grows linearly). The
    budget never reads past its table (policies/auto.py caps N at the largest N); the what-ifs do."""

    __slots__ = ("ns", "ts", "_slope")

    def __init__(self, points: Mapping):
        pts = {int(n): float(t) for n, t in points.items()}   # JSON's string keys become numbers
        if not pts:
            raise ValueError("a t(N) table needs at least one N")
        ns = sorted(pts)
        self.ns = np.array(ns, dtype=np.float64)
        self.ts = np.array([pts[n] for n in ns], dtype=np.float64)
        self._slope = self.slope_of(self.ns, self.ts)

    @classmethod
    def read(cls, raw) -> VerifyTimes | None:
        """A table as recorded (RECORD_KEY's value), keeping the points that read as N >= 1 and a
        positive, finite time; None when none does (absent, or not a table)."""
        out = {}
        if isinstance(raw, Mapping):
            for k, v in raw.items():
                try:
                    n, t = int(k), float(v)
                except (TypeError, ValueError):
                    continue
                if n >= 1 and math.isfinite(t) and t > 0:
                    out[n] = t
        return cls(out) if out else None

    @property
    def points(self) -> dict[int, float]:
        """The table as measured, {N: seconds}, N ascending."""
        return {int(n): float(t) for n, t in zip(self.ns, self.ts)}

    def t(self, n):
        """t(n): a float for one n, an array for an array of them (the budget reads every N of a
        cycle in one call, inside the cycle's time)."""
        y = np.interp(n, self.ns, self.ts)
        if self._slope:
            y = y + self._slope * np.maximum(0.0, np.asarray(n, dtype=np.float64) - self.ns[-1])
        return float(y) if np.ndim(y) == 0 else y

    @staticmethod
    def slope_of(ns, ts) -> float:
        """The last segment's slope beyond the largest N, never falling (0 for a single point);
        `ns` and `ts` ascending by N (arrays or lists)."""
        return max(0.0, float((ts[-1] - ts[-2]) / (ns[-1] - ns[-2]))) if len(ns) > 1 else 0.0

    def __len__(self) -> int:
        return len(self.ns)

    def __eq__(self, other) -> bool:
        return isinstance(other, VerifyTimes) and self.points == other.points

    def __repr__(self) -> str:
        return f"VerifyTimes({self.points})"


# How far (relative) an observed N's median may move before the live table is rebuilt
SETTLE = 0.01


class LiveVerifyTimes:
    """t(N) for the budget: its prior (`PriorTimes`: cached, or an estimate) corrected by live
    verifications, read at any N by `VerifyTimes`' one rule.

    Each observed N keeps the median of its last `window` timings (taken into the table when it
    moves by more than SETTLE of the value the table holds). A prior point nobody has
    observed is scaled by live/prior at the nearest observed N below it, so one verification at
    N = 2 that took a third of the prior's figure corrects the whole table above it, not only that
    point (points below every observation keep the prior: the budget explores both ways). The
    corrections stay here: they are timings under whatever else runs, which the cache never holds."""

    def __init__(self, prior: dict[int, float], window: int = 5):
        self.prior = VerifyTimes(prior)
        self.window = window
        self.live: dict[int, deque] = {}
        self._median: dict[int, float] = {}    # each observed N's median as the table holds it (observe)
        self.observed = 0
        self._now: VerifyTimes | None = None   # estimates() as a table, rebuilt after an observation
        self._table: np.ndarray | None = None  # t(1..n) read from it, the budget's once a cycle
        self._prior_ns, self._prior_ts = [int(n) for n in self.prior.ns], [float(t) for t in self.prior.ts]
        self._prior_t: dict[int, float] = {}   # the prior read at observed N

    def observe(self, n: int, seconds: float) -> None:
        if n < 1 or not seconds > 0:
            return
        n = int(n)
        d = self.live.setdefault(n, deque(maxlen=self.window))
        d.append(float(seconds))
        self.observed += 1
        # A median moving by less than SETTLE keeps the table as it is: the budget's choices do not
        # turn on it, and rebuilding the table after every forward cost a cycle about 0.08 ms of
        # Python in caches the forward had just flushed. A new N, or a larger move, is read at once.
        median, was = statistics.median(d), self._median.get(n)
        if was is None or abs(median - was) > SETTLE * was:
            self._median[n] = median
            self._now = self._table = None

    def estimates(self) -> dict[int, float]:
        """The table as it stands: each observed N's median as last taken in, and every prior point
        scaled by live/prior at the nearest observed N below it (none: as it is), by N."""
        if not self._median:
            return self.prior.points
        observed = sorted(self._median)
        points = {}
        for n, t in zip(self._prior_ns, self._prior_ts):
            i = bisect.bisect_left(observed, n) - 1
            points[n] = t * (self._median[observed[i]] / self._prior_at(observed[i]) if i >= 0 else 1.0)
        points.update(self._median)
        return dict(sorted(points.items()))

    def t(self, n):
        """t(n) in seconds: a float for one n, an array for an array of them."""
        if self._now is None:
            self._now = VerifyTimes(self.estimates())
        return self._now.t(n)

    def table(self, max_n: int) -> np.ndarray:
        """t(N) for N = 1..max_n as one float64 array (what the budget reads once a cycle): t's
        values, read off the few points in plain Python. A cycle calls this right after a forward
        has streamed the weights through the caches, where each numpy call costs tens of
        microseconds (the arrays' way took 0.14 ms a cycle there, against 27 us in a warm loop)."""
        if self._table is None or len(self._table) < max_n:
            points = self.estimates()
            ns, ts = list(points), list(points.values())
            slope = VerifyTimes.slope_of(ns, ts)
            out, j = [], 0
            for n in range(1, max_n + 1):   # VerifyTimes.t's rule, point by point
                while j + 1 < len(ns) and ns[j + 1] <= n:
                    j += 1
                if n <= ns[0]:
                    out.append(ts[0])
                elif j + 1 < len(ns):
                    out.append(ts[j] + (ts[j + 1] - ts[j]) * (n - ns[j]) / (ns[j + 1] - ns[j]))
                else:
                    out.append(ts[-1] + slope * (n - ns[-1]))
            self._table = np.array(out)
        return self._table[:max_n]

    def _prior_at(self, n: int) -> float:
        t = self._prior_t.get(n)
        if t is None:
            t = self._prior_t[n] = self.prior.t(n)
        return t
