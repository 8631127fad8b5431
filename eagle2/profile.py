"""`python -m eagle2 profile`: how close the engine runs to this machine's floor.

Measures memory bandwidth (a large tensor copy), the one-token target forward against its floor
(weight bytes / bandwidth), verification cost t(N) relative to one token, and one draft-head call.
"""
from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch

from .budget import _sync, measure_verify_times
from .loading import load_bundle


def bandwidth_gbs(dev, mb: int = 1024, repeats: int = 5) -> float:
    """Copy bandwidth: bytes read + written per second, best of repeats."""
    n = mb * (1 << 20) // 4
    a = torch.ones(n, device=dev)
    b = torch.empty_like(a)
    best = float("inf")
    for _ in range(repeats):
        _sync(dev)
        t0 = time.perf_counter()
        b.copy_(a)
        _sync(dev)
        best = min(best, time.perf_counter() - t0)
    return 2 * a.numel() * 4 / best / 1e9


@torch.no_grad()
def draft_call_s(bundle, k: int = 10, context: int = 256, repeats: int = 10) -> float:
    head, dev = bundle.head, bundle.device
    cache = head.new_cache(context + k + 1)
    cache.length = context
    g = torch.randn(k, head.args.dim, device=dev, dtype=bundle.dtype)
    toks = torch.randint(0, head.args.vocab_size, (k,), device=dev)
    pos = torch.full((k,), context, device=dev)
    mask = torch.eye(k, dtype=torch.bool, device=dev)
    times = []
    for r in range(repeats + 1):
        _sync(dev)
        t0 = time.perf_counter()
        out = head.forward_cached(cache, g, toks, pos, context, mask)
        head.draft_logprobs(out).topk(k, dim=-1)
        _sync(dev)
        if r:
            times.append(time.perf_counter() - t0)
    return float(np.median(times))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle2 profile", description=__doc__)
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--head", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    a = ap.parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    b = load_bundle(a.target, a.head, a.device, a.dtype)
    weight_bytes = sum(p.numel() * p.element_size() for p in b.target.parameters())
    bw = bandwidth_gbs(b.device)
    t = measure_verify_times(b, grid=(1, 2, 4, 8, 16, 32, 64))
    floor = weight_bytes / (bw / 2 * 1e9)  # a forward reads every weight once: read bandwidth = copy/2
    res = {
        "device": str(b.device), "threads": torch.get_num_threads(), "dtype": str(b.dtype),
        "weight_bytes": weight_bytes, "copy_bandwidth_gbs": bw, "read_floor_one_token_s": floor,
        "one_token_forward_s": t[1], "forward_over_floor": t[1] / floor,
        "verify_s": t, "verify_over_one_token": {n: v / t[1] for n, v in t.items()},
        "draft_call_k10_s": draft_call_s(b),
        "draft_vocab": None if b.head.draft_ids is None else int(b.head.draft_ids.numel()),
    }
    print(json.dumps(res, indent=2))
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=2))
    return 0
