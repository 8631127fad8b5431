"""`python -m eagle2 profile`: how close the engine runs to this machine's floor.

Measures memory bandwidth (a large tensor copy, and a read-only sum: the rate a forward can
stream its weights), the one-token target forward against its floor (weight bytes / read
bandwidth), verification cost t(N) relative to one token, a draft-head call on k nodes, where a
cycle's time goes, and with --compare-pack the fp32 forward with and without its prepacked weights
(two bundles, interleaved). On the q4_1 forward, one forward at each of T = 1, 2, 4, 8, 16 rows
split op by op, each op beside its memory and compute bounds on this machine (model/roofline.py).
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from ..model.loading import load_bundle
from ..model.quantized import KernelTarget
from ..model.roofline import format_roofline, roofline
from ..model.calibration import measure_verify_times
from ..model.stopwatch import interleaved_medians, time_forwards, timer
from .flags import add_model_args, apply_threads, costs_first
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


@torch.no_grad()
def draft_calls_s(bundle, grid=(1, 4, 10, 16), context: int = 256, tree: int = 20, repeats: int = 10) -> dict:
    """One draft-head call on k tree nodes (forward + log-probabilities + top 10), after `context`
    committed slots and `tree` earlier tree slots: median seconds."""
    draft, dev, a = bundle.draft, bundle.device, bundle.args
    cache = draft.new_cache(context + tree + max(grid) + 1)
    cache.length = context
    out = {}
    for k in grid:
        g = torch.randn(k, a.dim, device=dev, dtype=bundle.dtype)
        toks = torch.randint(0, a.vocab_size, (k,), device=dev)
        pos = torch.full((k,), context + 2, device=dev)
        mask = torch.cat([torch.rand(k, tree, device=dev) < 0.2, torch.eye(k, dtype=torch.bool, device=dev)], 1)
        out[k] = interleaved_medians({"": lambda: None},
                                     lambda: draft.step(cache, g, toks, pos, context + tree, mask, 10), repeats)[""]
    return out


def packed_vs_plain(bundle, a, grid=(1, 2, 4, 8, 16, 32, 64), repeats: int = 7) -> dict:
    """The target's verification with the prepacked weights (`bundle`) and with plain matmuls (a
    second bundle loaded without them), interleaved repeat by repeat in one process (fair against
    machine drift): median seconds."""
    plain = load_bundle(a.target, a.head, a.device, a.dtype, pack=False)
    times = time_forwards({"packed": bundle.forward, "plain": plain.forward}, grid, repeats=repeats)
    return {n: {**med, "plain_over_packed": med["plain"] / med["packed"]} for n, med in times.items()}


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
                    help="also time the fp32 forward with and without its prepacked weights (a second bundle), interleaved")
    ap.add_argument("--out", default=None, help="write the figures as JSON here")
    ap.add_argument("--phase-prompts", default=str(HELDOUT), help="prompts decoded for the per-phase split")
    ap.add_argument("--phase-limit", type=int, default=4, help="how many of them (0: no phase split)")
    ap.add_argument("--phase-tokens", type=int, default=64, help="new tokens per prompt for the phase split")
    ap.add_argument("--roofline-rows", default="1,2,4,8,16",
                    help="q4_1: the row counts T whose forward is split op by op against its bounds (empty: none)")
    ap.add_argument("--roofline-context", type=int, default=200, help="q4_1: committed tokens before those rows")
    a = ap.parse_args(argv)
    apply_threads(a)
    b = load_bundle(a.target, a.head, a.device, a.dtype, pack=not a.no_pack)
    weight_bytes = b.forward.streamed_bytes()
    bw = bandwidth_gbs(b.device)
    read_bw = read_bandwidth_gbs(b.device)
    t = measure_verify_times(b, grid=(1, 2, 4, 8, 16, 32, 64))
    floor = weight_bytes / (read_bw * 1e9)  # a forward streams every weight once
    res = {
        "device": str(b.device), "threads": torch.get_num_threads(), "dtype": b.precision or str(b.dtype),
        "forward": b.description, "forward_id": b.forward.timing_id, "command": "python -m eagle2 profile " + " ".join(argv or []),
        "weight_bytes": weight_bytes, "copy_bandwidth_gbs": bw, "read_bandwidth_gbs": read_bw,
        "read_floor_one_token_s": floor,
        "one_token_forward_s": t[1], "forward_over_floor": t[1] / floor,
        "verify_s": t, "verify_over_one_token": {n: v / t[1] for n, v in t.items()},
        "draft_call_s": draft_calls_s(b),
    }
    if a.compare_pack:
        if "packed" not in b.forward.timing_id:
            print("note: no prepacked weights here (not CPU fp32, or --no-pack): nothing to compare")
        else:
            res["packed_vs_plain_s"] = packed_vs_plain(b, a)
    rows = tuple(int(n) for n in a.roofline_rows.split(",") if n.strip())
    if rows and isinstance(b.forward, KernelTarget):
        res["roofline"] = roofline(b.forward, rows, a.roofline_context)
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
