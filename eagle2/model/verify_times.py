"""t(N), the time of one target forward over N tokens (a cycle verifying N tree tokens): a table
measured at a few N, and the one rule that reads it at any N.

Torch-free (numpy only), so the budget (model/timing.py, policies/auto.py) and the page's what-if
figures (viz/whatif.py, viz/acceptance_whatif.py) read t(N) through the same class and price a
tree the same way.
"""
from __future__ import annotations

import math
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
        y = self.at(self.ns, self.ts, n, self._slope)
        return float(y) if np.ndim(y) == 0 else y

    @staticmethod
    def slope_of(ns: np.ndarray, ts: np.ndarray) -> float:
        """The last segment's slope, never falling (0 for a single point)."""
        return max(0.0, float((ts[-1] - ts[-2]) / (ns[-1] - ns[-2]))) if len(ns) > 1 else 0.0

    @staticmethod
    def at(ns: np.ndarray, ts: np.ndarray, n, slope: float | None = None):
        """The rule itself, on a table's arrays (N ascending): linear between points, the first
        point's time below it, the last segment's slope (never falling) beyond the last."""
        slope = VerifyTimes.slope_of(ns, ts) if slope is None else slope
        y = np.interp(n, ns, ts)
        if slope:
            y = y + slope * np.maximum(0.0, np.asarray(n, dtype=np.float64) - ns[-1])
        return y

    def __len__(self) -> int:
        return len(self.ns)

    def __eq__(self, other) -> bool:
        return isinstance(other, VerifyTimes) and self.points == other.points

    def __repr__(self) -> str:
        return f"VerifyTimes({self.points})"
