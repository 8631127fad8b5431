"""Measured costs of the target on this machine: t(N), the time to verify N tree tokens.

t(N) is measured once per device, model, dtype, thread count and weight layout and cached as
JSON under cache_dir(); the hardware-aware budget (policies/auto.py) and the profile read it.
"""
from __future__ import annotations

import json
import time

import numpy as np
import torch

from .weights import cache_dir

GRID = (1, 2, 4, 8, 12, 16, 24, 32, 48, 64, 96, 128)


def sync(dev: torch.device) -> None:
    """Wait for the device, so a wall-clock reading covers the work (CUDA runs asynchronously)."""
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
            sync(dev)
            t0 = time.perf_counter()
            tgt.logits(tgt.forward_cached(cache, toks, pos, mask))
            sync(dev)
            if r:  # the first run warms up
                times.append(time.perf_counter() - t0)
        out[n] = float(np.median(times))
    return out


def verify_profile(bundle, refresh: bool = False, measure: bool = True) -> dict[int, float] | None:
    """t(N) for this bundle on this machine: from the cache, or measured now (seconds) and cached
    (with measure=False: None when nothing is cached)."""
    packed = "|packed" if bundle.packed else ""
    key = f"{bundle.name}|{bundle.device.type}|{str(bundle.dtype)}|{torch.get_num_threads()}t{packed}"
    path = cache_dir() / "verify_times.json"
    table = json.loads(path.read_text()) if path.exists() else {}
    if not measure and key not in table:
        return None
    if refresh or key not in table:
        table[key] = {str(k): v for k, v in measure_verify_times(bundle).items()}
        path.write_text(json.dumps(table, indent=1))
    return {int(k): v for k, v in table[key].items()}
