"""The t(N) a budget starts from without measuring (a visitor's Step never waits for one): the
cached quiet measurement (calibration.py), else the last plausible table this process has seen,
else an estimate from one token's forward. Live corrections then follow the machine
(verify_times.LiveVerifyTimes).
"""
from __future__ import annotations

import math
from dataclasses import dataclass

from .calibration import GRID, cached_times, known_times, plausible_cached


# The shape of an estimated table: each token after the first adds 1/32 of one token's forward.
# Measured tables: about 1/20 on fp32 CPUs, 1/110 with bf16 on an AMX Xeon, about 0 on a GPU up to
# 64 tokens; live corrections fix the rest within a few cycles.
ESTIMATE_SLOPE = 1 / 32
# With no t(1) anywhere, one token's forward is guessed from the weights' bytes read at this rate
# (GB/s; a CPU's streaming read is 10-40, a GPU's hundreds): only the scale of a first cycle.
GUESSED_READ_GBS = 10.0


def estimated_table(t1: float, grid=GRID) -> dict[int, float]:
    """A plausible t(N) from one token's forward: t(1) (1 + (N - 1) ESTIMATE_SLOPE)."""
    return {n: t1 * (1 + (n - 1) * ESTIMATE_SLOPE) for n in grid}


def _usable_t1(t: dict | None) -> float | None:
    v = (t or {}).get(1)
    return float(v) if isinstance(v, (int, float)) and math.isfinite(v) and v > 0 else None


@dataclass(frozen=True)
class PriorTimes:
    """A budget's t(N) before any live correction (`LiveVerifyTimes` corrects it) and where it
    came from (`source`, for the record)."""
    times: dict[int, float]
    source: str

    @property
    def cached(self) -> bool:
        """Whether the cache holds it: else the measurer is asked for one."""
        return self.source == MEASURED


MEASURED = "measured (cached)"
KNOWN = "measured earlier in this process"
ESTIMATE = "estimate from t(1)"


def prior_times(bundle) -> PriorTimes:
    """The best t(N) to start a budget from without measuring (a Step never waits for one): the
    cached table if plausible; else the last plausible one this process has seen for this key;
    else an estimate from t(1) (the stale table's, else guessed from the weights' size)."""
    t = plausible_cached(bundle)
    if t is not None:
        return PriorTimes(t, MEASURED)
    t = known_times(bundle)
    if t is not None:
        return PriorTimes(t, KNOWN)
    t1 = _usable_t1(cached_times(bundle))
    if t1 is None:
        t1 = bundle.forward.streamed_bytes() / (GUESSED_READ_GBS * 1e9)
    return PriorTimes(estimated_table(t1), ESTIMATE)
