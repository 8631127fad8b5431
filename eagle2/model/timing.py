"""Measured costs of the target on this machine: t(N), the time to verify N tree tokens.

t(N) is measured at start-up once per device, model, dtype, torch version, thread count and
weight layout, and cached as JSON (profile_path(): cache_dir()/verify_times.json unless
$EAGLE2_TIMING_CACHE names another file). A cached table is only a starting point: it
is sanity-checked when read (`plausible`), and `CostTable` corrects it from every verification
the decoder times, writing the corrected table back when the live figures disagree (a table
measured while the machine was busy must not steer the hardware-aware budget forever).
"""
from __future__ import annotations

import math
import os
import statistics
import threading
from collections import deque
from pathlib import Path

import numpy as np
import torch
from torch.utils.benchmark import Timer

from ..devices import is_cuda
from ..files import locked_update, read_json
from .weights import cache_dir

GRID = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def sync(dev: torch.device) -> None:
    """Wait for the device, so a wall-clock reading covers the work (CUDA runs asynchronously)."""
    if is_cuda(dev):
        torch.cuda.synchronize(dev)


@torch.no_grad()
def prefilled_cache(target, context: int, room: int):
    """A KV cache holding `context` committed random tokens, with `room` free slots after them."""
    dev = target.lm_head.weight.device
    cache = target.new_cache(context + room)
    target.forward_cached(cache, torch.randint(0, target.args.vocab_size, (context,), device=dev),
                          torch.arange(context, device=dev))
    cache.advance(context)
    return cache


def timer(call) -> Timer:
    """torch's benchmark timer for `call()`, at this process's thread count (its default is one
    thread) and synchronising CUDA around each timing."""
    return Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads())


def interleaved_medians(dev: torch.device, variants: dict, call, repeats: int) -> dict[str, float]:
    """Median seconds of `call()` under each variant (`variants[name]()` switches to it), the
    variants taken in turn within every repeat (fair against machine drift); one warm-up round."""
    times = {name: [] for name in variants}
    t = timer(call)
    for r in range(repeats + 1):
        for name, switch in variants.items():
            switch()
            seconds = t.timeit(1).times[0]
            if r:
                times[name].append(seconds)
    return {name: float(np.median(v)) for name, v in times.items()}


@torch.no_grad()
def measure_verify_times(bundle, context: int = 256, repeats: int = 5, grid=GRID) -> dict[int, float]:
    """Median seconds of one target forward of N tree tokens (plus their logits) after `context`
    committed tokens, for N in grid."""
    tgt, dev = bundle.target, bundle.device
    cache = prefilled_cache(tgt, context, max(grid) + 1)
    out = {}
    for n in grid:
        toks = torch.randint(0, tgt.args.vocab_size, (n,), device=dev)
        pos = torch.arange(context, context + n, device=dev)
        mask = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
        out[n] = interleaved_medians(dev, {"": lambda: None}, lambda: tgt.forward_logits(cache, toks, pos, mask),
                                     repeats)[""]
    return out


def plausible(t: dict[int, float]) -> bool:
    """A t(N) table a budget may start from: N = 1 and another point, every time positive and
    finite, non-decreasing within noise (30%) from N = 2 on, and no N costing less than half of
    one token or more than 1.5 N tokens' forwards (one forward of N tokens never beats one token
    by much, nor costs more than N forwards). One token may cost more than two: the one-row
    forward runs other kernels, and on some CPUs it is the slower (measured: 37 ms against 26 ms);
    rejecting such a table made every new session measure it again, seconds inside its first Step."""
    if 1 not in t or len(t) < 2 or not all(isinstance(v, (int, float)) and math.isfinite(v) and v > 0
                                           for v in t.values()):
        return False
    top = 0.0
    for n in sorted(t):
        if t[n] < 0.7 * top or not 0.5 * t[1] <= t[n] <= 1.5 * n * t[1]:
            return False
        if n > 1:
            top = max(top, t[n])
    return True


def _cache_key(bundle, full: bool | None = None) -> str:
    packed = "|packed" if bundle.packed else ""
    comp = bundle.target.compiled
    # the complete compiled state only: packages landing one by one (a first start's background
    # compile) must not each start a new table; the live timings correct the estimates meanwhile
    if comp is None:
        full = False
    elif full is None:
        full = len(comp.runners) == len(comp.buckets)
    compiled = f"|compiled {','.join(map(str, comp.buckets))}" if full else ""
    if full and bundle.target.aux_layers:  # EAGLE-3's packages: their own timings
        compiled += f"|aux {','.join(map(str, bundle.target.aux_layers))}"
    return (f"{bundle.name}|{bundle.device.type}|{str(bundle.dtype)}|torch {torch.__version__}|"
            f"{torch.get_num_threads()}t{packed}{compiled}")


def profile_path() -> Path:
    """The file holding every cached t(N) table: $EAGLE2_TIMING_CACHE, else verify_times.json in
    cache_dir() (the tests point it at a temporary file, so the tiny models they time stay out of
    the user's cache)."""
    env = os.environ.get("EAGLE2_TIMING_CACHE")
    return Path(env) if env else cache_dir() / "verify_times.json"


def _read_cache() -> dict:
    table = read_json(profile_path(), {})
    return table if isinstance(table, dict) else {}  # a corrupt cache: measure again


def store_table(key: str, t: dict[int, float]) -> None:
    """Write one t(N) table under `key`, keeping every other key, even one another process writes
    at the same moment (a read-modify-write under the cache's lock)."""
    entry = {str(k): float(v) for k, v in sorted(t.items())}
    locked_update(profile_path(), lambda table: {**table, key: entry})


def store_profile(bundle, t: dict[int, float]) -> None:
    """Write t(N) for this bundle on this machine to the cache (the next start begins from it)."""
    store_table(_cache_key(bundle), t)


def cached_profile(bundle, full: bool | None = None) -> dict[int, float] | None:
    """The t(N) table cached for this bundle as stored: the last one measured or corrected by live
    timings (CostTable), plausible or not. `full` False: the table of the forward before every
    compiled package had landed."""
    cached = _read_cache().get(_cache_key(bundle, full))
    return {int(k): float(v) for k, v in cached.items()} if isinstance(cached, dict) else None


_measuring = threading.Lock()   # one measurement at a time: sessions starting together measure once


def verify_profile(bundle, refresh: bool = False, measure: bool = True) -> dict[int, float] | None:
    """t(N) for this bundle on this machine: from the cache if it is plausible, else measured now
    (seconds) and cached (with measure=False: None when no plausible table is cached). While
    another thread measures (the app does when the compiled packages land), a caller does not wait
    seconds for it: it starts from the table of the forward before them, which its live timings
    correct."""
    t = cached_profile(bundle)
    if not refresh and t is not None and plausible(t):
        return t
    if not measure:
        return None
    if not _measuring.acquire(blocking=False):
        before = cached_profile(bundle, full=False)
        if not refresh and before is not None and plausible(before):
            return before
        _measuring.acquire()
    try:
        t = cached_profile(bundle)
        if refresh or t is None or not plausible(t):
            t = measure_verify_times(bundle)
            store_profile(bundle, t)
        return t
    finally:
        _measuring.release()


class CostTable:
    """t(N) for the budget: a prior table (start-up or cached) corrected by live verifications.

    Each observed N keeps the median of its last `window` timings. A prior point nobody has
    observed is scaled by live/prior at the nearest observed N below it, so one verification at
    N = 2 that took a third of the prior's figure corrects the whole table above it, not only that
    point (points below every observation keep the prior: the budget explores both ways). When the live figures disagree with the prior by more than `tolerance` (3 or more
    timings at an N), `on_change` receives the corrected table (the cache is rewritten), at most
    once per `window` * 8 observations."""

    def __init__(self, prior: dict[int, float], window: int = 5, tolerance: float = 1.5, on_change=None):
        self.prior = {int(n): float(v) for n, v in prior.items()}
        self.window, self.tolerance, self.on_change = window, tolerance, on_change
        self.live: dict[int, deque] = {}
        self.observed = 0
        self._last_saved = -10 ** 9
        self._curve = None    # (xs, ys) of estimates(), rebuilt after an observation: t() is called per N

    def _prior_at(self, n: float) -> float:
        xs = sorted(self.prior)
        return float(np.interp(n, xs, [self.prior[x] for x in xs]))

    def observe(self, n: int, seconds: float) -> None:
        if n < 1 or not seconds > 0:
            return
        self.live.setdefault(int(n), deque(maxlen=self.window)).append(float(seconds))
        self.observed += 1
        self._curve = None
        if self.on_change is not None and self.observed - self._last_saved >= 8 * self.window and self.disagrees():
            self._last_saved = self.observed
            self.on_change(self.estimates())

    def disagrees(self) -> bool:
        for n, d in self.live.items():
            if len(d) >= 3:
                r = statistics.median(d) / self._prior_at(n)
                if not 1 / self.tolerance <= r <= self.tolerance:
                    return True
        return False

    def estimates(self) -> dict[int, float]:
        live = {n: statistics.median(d) for n, d in self.live.items() if d}
        if not live:
            return dict(self.prior)
        out = dict(live)
        for g, v in self.prior.items():
            below = [n for n in live if n < g]
            if g not in live:
                out[g] = v * live[max(below)] / self._prior_at(max(below)) if below else v
        return dict(sorted(out.items()))

    def t(self, n: float) -> float:
        if self._curve is None:
            est = self.estimates()
            self._curve = (list(est), list(est.values()))
        return float(np.interp(n, *self._curve))
