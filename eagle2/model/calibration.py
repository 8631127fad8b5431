"""t(N), the time to verify N tree tokens on this machine, measured and kept.

The cache (times_path(): cache_dir()/verify_times.json unless $EAGLE2_TIMING_CACHE names another
file) holds one t(N) table per device, model, torch version, thread count and forward (its
`timing_id`: dtype and weight layout, the q4_1 kernels' build), and only quiet measurements: a
table timed while nothing else decoded in this process (`measure_quietly`). It is written when a
table is measured: at start-up, when the table is missing or not plausible, and on --recalibrate
(model/measurer.py in the app, `verify_profile` in the command-line tools). It never changes from
a visitor's Step: a budget starts from priors.prior_times without measuring, and its live
corrections (verify_times.LiveVerifyTimes, the in-cycle cost model) stay in the policy that made
them (timings taken while other sessions decode are that moment's load, not the machine's cost;
written back, they made the next session measure again inside its first Step). The timing
harness is stopwatch.py's.
"""
from __future__ import annotations

import logging
import math
import threading
import time
from pathlib import Path

import torch

from .. import config
from ..files import locked_update, read_json
from .activity import DECODING
from .stopwatch import time_forwards
from .weights import cache_dir

GRID = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)
log = logging.getLogger(__name__)


def measure_verify_times(bundle, context: int = 256, repeats: int = 5, grid=GRID, stop=None) -> dict[int, float]:
    """t(N): median seconds of one target forward of N tree tokens (plus their logits) after
    `context` committed tokens, for N in grid, on the forward in use (time_forwards)."""
    times = time_forwards({"": bundle.forward}, grid, context=context, repeats=repeats, stop=stop)
    return {n: t[""] for n, t in times.items()}


def implausibility(t: dict[int, float]) -> str | None:
    """Why a t(N) table is not one a budget may start from, or None when it is: N = 1 and another
    point, every time positive and finite, non-decreasing within noise (30%) from N = 2 on, and no
    N costing less than half of one token or more than 1.5 N tokens' forwards (one forward of N
    tokens never beats one token by much, nor costs more than N forwards). One token may cost more
    than two: the one-row forward runs other kernels, and on some CPUs it is the slower (measured:
    37 ms against 26 ms); rejecting such a table made every new session measure it again, seconds
    inside its first Step."""
    if 1 not in t or len(t) < 2:
        return "fewer than two sizes, or no N = 1"
    if not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0 for v in t.values()):
        return "a time not positive and finite"
    top, top_n = 0.0, None
    for n in sorted(t):
        if t[n] < 0.7 * top:
            return f"t({n}) = {t[n] * 1e3:.3g} ms < 0.7 t({top_n}) = {top * 1e3:.3g} ms"
        if not 0.5 * t[1] <= t[n] <= 1.5 * n * t[1]:
            return f"t({n}) = {t[n] * 1e3:.3g} ms outside [0.5, 1.5 N] t(1), t(1) = {t[1] * 1e3:.3g} ms"
        if n > 1 and t[n] > top:
            top, top_n = t[n], n
    return None


def plausible(t: dict[int, float]) -> bool:
    """A t(N) table a budget may start from (implausibility says why not)."""
    return implausibility(t) is None


def cache_key(bundle) -> str:
    """What a table is kept under: the model, the device, the forward, torch and the thread count."""
    return (f"{bundle.name}|{bundle.device.type}|{bundle.forward.timing_id}|torch {torch.__version__}|"
            f"{torch.get_num_threads()}t")


def times_path() -> Path:
    """The file holding every cached t(N) table: $EAGLE2_TIMING_CACHE, else verify_times.json in
    cache_dir() (each test has a cache folder of its own, so the tiny models they time stay out of
    the user's cache)."""
    path = config.current().timing_cache
    return path if path is not None else cache_dir() / "verify_times.json"


def _read_cache() -> dict:
    table = read_json(times_path(), {})
    return table if isinstance(table, dict) else {}  # a corrupt cache: measure again


def store_table(key: str, t: dict[int, float]) -> None:
    """Write one t(N) table under `key`, keeping every other key, even one another process writes
    at the same moment (a read-modify-write under the cache's lock)."""
    entry = {str(k): float(v) for k, v in sorted(t.items())}
    locked_update(times_path(), lambda table: {**table, key: entry})


def store_times(bundle, t: dict[int, float]) -> None:
    """Write t(N) for this bundle on this machine to the cache (the next start begins from it).
    Only quiet measurements belong there (`measure_quietly`)."""
    store_table(cache_key(bundle), t)


def cached_times(bundle) -> dict[int, float] | None:
    """The t(N) table cached for this bundle as stored: the last quiet measurement, plausible or
    not."""
    cached = _read_cache().get(cache_key(bundle))
    return {int(k): float(v) for k, v in cached.items()} if isinstance(cached, dict) else None


# The last plausible table this process has read or measured, per cache key: a start keeps it if
# the file loses it (an older version, or another process, rewrote that key with a bad table).
_known: dict[str, dict[int, float]] = {}


def plausible_cached(bundle) -> dict[int, float] | None:
    """The cached table if it is plausible (then also remembered in this process), else None."""
    t = cached_times(bundle)
    if t is None or not plausible(t):
        return None
    _known[cache_key(bundle)] = t
    return t


def known_times(bundle) -> dict[int, float] | None:
    """The last plausible table this process has read or measured for this bundle's key, or None."""
    return _known.get(cache_key(bundle))


_measuring = threading.Lock()   # one measurement at a time (the background measurer, a tool's own)


def measure_quietly(bundle, give_way: bool = False) -> tuple[dict[int, float], bool]:
    """t(N) measured now in this thread, and whether it was quiet: no decode in flight when it
    began, none started before it ended. Only a quiet table is cached. `give_way`: stop at the next
    size once a decode starts (the background measurer: a visitor's Step does not share the CPU with
    it for long) or the main thread has ended (the process is exiting: the measurer's daemon worker is
    not waited for, and a table cut short is not cached). One line in the log says which thread
    measured and what became of the table."""
    with _measuring:
        key, mark, t0 = cache_key(bundle), DECODING.mark(), time.perf_counter()
        t = measure_verify_times(bundle, stop=(lambda: not DECODING.quiet_since(mark)
                                               or not threading.main_thread().is_alive()) if give_way else None)
        quiet = DECODING.quiet_since(mark) and len(t) == len(GRID)
        if quiet:
            store_times(bundle, t)
            if plausible(t):
                _known[key] = t
        why = implausibility(t)
        what = ("quiet: cached" + ("" if why is None else f", but not plausible: {why}") if quiet
                else "not kept: a decode ran meanwhile")
        log.info("t(N) measured in thread %s (%.1f s, %s) for %s", threading.current_thread().name,
                 time.perf_counter() - t0, what, key)
        return t, quiet


def verify_profile(bundle, refresh: bool = False, measure: bool = True) -> dict[int, float] | None:
    """t(N) for this bundle on this machine: the cached table if it is plausible, else (`measure`)
    measured now in this thread (seconds) and cached if quiet; with measure=False, None when no
    plausible table is cached. For the callers that run no visitor's Step: the command-line tools
    before their timed work (they decode nothing meanwhile), the background measurer, the tests.
    A budget never calls it: it starts from `prior_times`."""
    t = plausible_cached(bundle)
    if not refresh and t is not None:
        return t
    if not measure:
        return None
    return measure_quietly(bundle)[0]


