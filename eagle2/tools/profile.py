"""`python -m eagle2 profile`: how close the engine runs to this machine's floor.

Measures memory bandwidth (a large tensor copy, and a read-only sum: the rate a forward can
stream its weights), the one-token target forward against its floor (weight bytes / read
bandwidth), verification cost t(N) relative to one token, a draft-head call on k nodes, and with
the compiled forward attached, t(N) and the draft call eager vs compiled, interleaved, and each
tree size timed eager and through every bucket that holds it, with the option the engine chose.
On the q4_1 forward, one forward at each of T = 1, 2, 4, 8, 16 rows split op by op, each op beside
its memory and compute bounds on this machine (model/roofline.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ..model import routes
from ..model.llama import Linear
from ..model.loading import load_bundle
from ..model.quantized import QuantizedLlama
from ..model.roofline import format_roofline, roofline
from ..model.timing import (interleaved_medians, measure_verify_times, prefilled_cache, streamed_bytes,
                            time_forwards, timer)
from .flags import add_compile_args, add_model_args, apply_compile, apply_threads, costs_first
from .prompt_files import HELDOUT, read_prompts


def best_s(dev, call, repeats: int) -> float:
    """The fastest of `repeats` timed calls (bandwidth: the machine's best, not its mood)."""
    t = timer(call)
    return min(t.timeit(1).times[0] for _ in range(repeats))


def bandwidth_gbs(dev, mb: int = 1024, repeats: int = 5) -> float:
    """Copy bandwidth: bytes read + written per second, best of repeats."""
    a = torch.ones(mb * (1 << 20) // 4, device=dev)
    b = torch.empty_like(a)
    return 2 * a.numel() * 4 / best_s(dev, lambda: b.copy_(a), repeats) / 1e9


def read_bandwidth_gbs(dev, mb: int = 512, repeats: int = 7) -> float:
    """Streaming read bandwidth: bytes summed per second, best of repeats (a forward at batch 1
    reads each weight once and computes little on it, so this is its floor's rate)."""
    a = torch.ones(mb * (1 << 20) // 4, device=dev)
    return a.numel() * 4 / best_s(dev, a.sum, repeats) / 1e9


def eager_vs_compiled(bundle, grid=(1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64), context: int = 256,
                      repeats: int = 7) -> dict:
    """Target forward + logits of N tree tokens on the eager and the compiled path, interleaved
    repeat by repeat in one process (timing.time_forwards): median seconds (sizes between buckets
    run padded)."""
    tgt = bundle.target
    comp = tgt.compiled
    variants = {"eager": lambda: setattr(tgt, "compiled", None), "compiled": lambda: setattr(tgt, "compiled", comp)}
    try:
        times = time_forwards(tgt, grid, lambda n: variants, context, repeats)
    finally:
        tgt.compiled = comp
    return {n: {**med, "eager_over_compiled": med["eager"] / med["compiled"],
                "bucket": comp.target.bucket(n) if comp is not None else None} for n, med in times.items()}


@torch.no_grad()
def draft_calls_s(bundle, grid=(1, 4, 10, 16), context: int = 256, tree: int = 20, repeats: int = 10) -> dict:
    """One draft-head call on k tree nodes (forward + log-probabilities + top-k), after `context`
    committed slots and `tree` earlier tree slots: median seconds, on the eager path and (when
    attached) the compiled one, interleaved repeat by repeat."""
    head, dev = bundle.head, bundle.device
    comp = head.compiled
    # the head's compiled packages, or its layer in the q4_1 kernels (quantized.Head3Kernels)
    name = "compiled" if comp is None or hasattr(comp, "head_set") else "kernels"
    caches = {}
    for v, fwd in (("eager", None), (name, comp)):  # each forward its own cache (the kernels' is fp16)
        head.compiled = fwd
        caches[v] = head.new_cache(context + tree + max(grid) + 1)
        caches[v].length = context
    head.compiled = comp
    cache = caches["eager"]

    def use(v, fwd):
        nonlocal cache
        head.compiled, cache = fwd, caches[v]

    variants = {"eager": lambda: use("eager", None)}
    if comp is not None:
        variants[name] = lambda: use(name, comp)
    out = {}
    try:
        for k in grid:
            g = torch.randn(k, head.args.dim, device=dev, dtype=bundle.dtype)
            toks = torch.randint(0, head.args.vocab_size, (k,), device=dev)
            pos = torch.full((k,), context + 2, device=dev)
            mask = torch.cat([torch.rand(k, tree, device=dev) < 0.2, torch.eye(k, dtype=torch.bool, device=dev)], 1)
            call = lambda: head.forward_logprobs(cache, g, toks, pos, context + tree, mask)[1].topk(min(k, 10), dim=-1)
            med = interleaved_medians(dev, variants, call, repeats)
            if comp is not None:
                med[f"eager_over_{name}"] = med["eager"] / med[name]
                if name == "compiled":
                    med["bucket"] = comp.head_set.bucket(k) if comp.head_set is not None else None
            out[k] = med
    finally:
        head.compiled = comp
    return out


@torch.no_grad()
def packed_vs_plain(bundle, grid=(1, 2, 4, 8, 16, 32, 64), context: int = 256, repeats: int = 7) -> dict:
    """Target forward + logits for N tokens with the prepacked weights and with plain matmuls,
    interleaved repeat by repeat in one process (fair against machine drift): median seconds."""
    tgt, dev = bundle.target, bundle.device
    mods = [m for m in tgt.modules() if isinstance(m, Linear)]
    packs = [m.packed for m in mods]

    def use(packed: bool):
        for m, p in zip(mods, packs):
            m.packed = p if packed else None

    cache = prefilled_cache(tgt, context, max(grid) + 1)
    out = {}
    try:
        for n in grid:
            toks = torch.randint(0, tgt.args.vocab_size, (n,), device=dev)
            pos = torch.arange(context, context + n, device=dev)
            mask = torch.ones(n, n, dtype=torch.bool, device=dev).tril() if n > 1 else None
            med = interleaved_medians(dev, {"packed": lambda: use(True), "plain": lambda: use(False)},
                                      lambda: tgt.logits(tgt.forward_cached(cache, toks, pos, mask)), repeats)
            out[n] = {**med, "plain_over_packed": med["plain"] / med["packed"]}
    finally:
        use(True)
    return out


def cycle_phases(bundle, prompts: Path, limit: int, max_new: int) -> dict:
    """Where a cycle's time goes, decoding `limit` held-out prompts (greedy) with plain decoding and
    the policy that pays on this device: each phase's ms per cycle and share of the time, as the
    bench summarises them (eagle2/phases.py)."""
    from ..cycle.sampling import SamplingParams
    from ..policies.registry import PLAIN, default_policy
    from .bench import aggregate, make_decoder, run_one, spread_over_categories
    qs = spread_over_categories(read_prompts(prompts), limit)
    sp, out = SamplingParams(), {}
    for name in (PLAIN, default_policy(bundle.device.type)):
        costs_first(bundle, name)
        new = lambda: make_decoder(bundle, name, sp, max_new, {}, {})  # noqa: E731
        run_one(bundle, new, {"turns": ["Say hello."]}, sp, 8)     # warm-up
        rows = []
        for q in qs:
            r = run_one(bundle, new, q, sp, max_new)
            rows.append({k: r[k] for k in r if k != "token_ids"})
        agg = aggregate(rows)
        out[name] = {k: agg[k] for k in ("tau", "tokens_per_s", "phase_ms_per_cycle", "phase_share",
                                         "around_forwards_share")}
    return out


def print_phases(phases: dict) -> None:
    for name, r in phases.items():
        ms = r["phase_ms_per_cycle"]
        print(f"{name}: {sum(ms.values()):.2f} ms a cycle, {r['around_forwards_share']:.1%} around the forwards: "
              + ", ".join(f"{p} {v:.2f}" for p, v in ms.items() if v >= 0.005), file=sys.stderr)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle2 profile", description=__doc__)
    add_model_args(ap)
    ap.add_argument("--no-pack", action="store_true",
                    help="plain matmuls, without the prepacked CPU weights (the before of a before/after)")
    ap.add_argument("--compare-pack", action="store_true",
                    help="also time forwards with and without the prepacked weights, interleaved")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--phase-prompts", default=str(HELDOUT), help="prompts decoded for the per-phase split")
    ap.add_argument("--phase-limit", type=int, default=4, help="how many of them (0: no phase split)")
    ap.add_argument("--phase-tokens", type=int, default=64, help="new tokens per prompt for the phase split")
    ap.add_argument("--roofline-rows", default="1,2,4,8,16",
                    help="q4_1: the row counts T whose forward is split op by op against its bounds (empty: none)")
    ap.add_argument("--roofline-context", type=int, default=200, help="q4_1: committed tokens before those rows")
    add_compile_args(ap)
    a = ap.parse_args(argv)
    apply_threads(a)
    b = load_bundle(a.target, a.head, a.device, a.dtype, pack=not a.no_pack)
    forward = apply_compile(a, b)
    weight_bytes = streamed_bytes(b.target)
    bw = bandwidth_gbs(b.device)
    read_bw = read_bandwidth_gbs(b.device)
    t = measure_verify_times(b, grid=(1, 2, 4, 8, 16, 32, 64))
    floor = weight_bytes / (read_bw * 1e9)  # a forward streams every weight once
    res = {
        "device": str(b.device), "threads": torch.get_num_threads(), "dtype": b.precision or str(b.dtype),
        "packed_weights": b.packed, "kernels": getattr(b.target, "isa", None),
        "forward": forward, "command": "python -m eagle2 profile " + " ".join(argv or []),
        "weight_bytes": weight_bytes, "copy_bandwidth_gbs": bw, "read_bandwidth_gbs": read_bw,
        "read_floor_one_token_s": floor,
        "one_token_forward_s": t[1], "forward_over_floor": t[1] / floor,
        "verify_s": t, "verify_over_one_token": {n: v / t[1] for n, v in t.items()},
        "draft_call_s": draft_calls_s(b),
        "draft_vocab": None if b.head.draft_ids is None else int(b.head.draft_ids.numel()),
    }
    if a.compare_pack:
        if not b.packed:
            print("note: no prepacked weights here (not CPU fp32, or --no-pack): nothing to compare")
        else:
            res["packed_vs_plain_s"] = packed_vs_plain(b)
    ct = b.target.compiled
    if ct is not None and ct.runners:
        res["eager_vs_compiled_s"] = eager_vs_compiled(b)
        if ct.complete():  # each tree size eager and through every bucket holding it, and the choice
            res["forward_by_tree_size"] = {
                "target_s": routes.time_target(ct), "target_chosen": dict(ct.target.routes),
                **({"head_s": routes.time_head(ct), "head_chosen": dict(ct.head_set.routes)}
                   if ct.head_set is not None else {})}
    rows = tuple(int(n) for n in a.roofline_rows.split(",") if n.strip())
    if rows and isinstance(b.target, QuantizedLlama):
        res["roofline"] = roofline(b.target, rows, a.roofline_context)
    if a.phase_limit > 0:
        res["cycle_phases"] = cycle_phases(b, Path(a.phase_prompts), a.phase_limit, a.phase_tokens)
    print(json.dumps(res, indent=2))
    if "roofline" in res:
        print(format_roofline(res["roofline"]), file=sys.stderr)
    if "cycle_phases" in res:
        print_phases(res["cycle_phases"])
    if a.out:
        Path(a.out).parent.mkdir(parents=True, exist_ok=True)
        Path(a.out).write_text(json.dumps(res, indent=2))
    return 0
