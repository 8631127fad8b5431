"""The q4_1 forward op by op against its bounds (`python -m eagle2 profile` on a q4_1 target).

One forward over T new rows after a committed context is split by the kernels themselves
(qforward.cpp's Op: each thread's seconds in each op, the time it waits at the barriers
included) into the matmuls by kind, the LM head, attention, activation quantisation and the
float parts (norms, RoPE, SiLU). Beside each op, what it must at least take on this machine:
its bytes over the measured read bandwidth (the weights it streams; attention's K/V cache) and
its arithmetic over the measured peak of the instructions that do it (int8 multiply-adds of the
chosen dot product for the matmuls, fp32 FMAs for attention), each measured by a micro-kernel
in qprobe.h.
"""
from __future__ import annotations

import statistics
import time

import torch

from .qlib import ISAS, OPS
from .quantized import KernelTarget
from .stopwatch import prefilled_cache

MATMULS = {"qkv": ("q", "k", "v"), "o": ("o",), "gate_up": ("gate", "up"), "down": ("down",)}


def machine(target: KernelTarget, threads: int) -> dict:
    """The rates the bounds divide by, measured now: streaming reads (a 512 MB buffer), the int8
    multiply-adds of the dot product the kernels run, and fp32 FMAs."""
    lib = target.lib
    return {"read_gbs": lib.qf_read_gbs(512 << 20, threads, 5), "kernels": ISAS[lib.qf_isa()],
            "int8_gmacs": lib.qf_int8_peak(lib.qf_isa(), threads), "fma_gflops": lib.qf_fma_peak(threads),
            "threads": threads}


def op_work(target: KernelTarget, T: int, context: int) -> dict[str, dict]:
    """Each op's bytes to read and arithmetic (int8 MACs for the matmuls, fp32 FMAs for
    attention) in one forward of T rows after `context` committed tokens."""
    a = target.args
    work = {}
    for op, names in {**MATMULS, "lm_head": ("lm_head",)}.items():
        mats = [m for n in names for m in target.sizes[n]]
        work[op] = {"bytes": sum(b for _, _, b in mats), "macs": T * sum(N * K for N, K, _ in mats)}
    keys = context + (T + 1) / 2  # a causal chain's mean keys a row
    work["attention"] = {"bytes": a.n_layers * 2 * a.n_kv_heads * (context + T) * a.head_dim * 2,
                         "fmas": int(a.n_layers * T * a.n_heads * keys * a.head_dim * 2)}
    return work


@torch.no_grad()
def op_split(target: KernelTarget, T: int, context: int, repeats: int) -> dict:
    """One forward (+ logits) of T causal rows after `context` random tokens: its median wall
    seconds, and each op's seconds (the threads' mean, so that the ops add up to the wall time)."""
    threads = torch.get_num_threads()
    cache = prefilled_cache(target, context, T + 1)
    toks = torch.randint(0, target.args.vocab_size, (T,))
    pos = torch.arange(context, context + T)
    mask = torch.ones(T, T, dtype=torch.bool).tril() if T > 1 else None
    call = lambda prof=None: target.verify(cache, toks, pos, mask, prof=prof)  # noqa: E731
    for _ in range(3):
        call()
    walls = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        call()
        walls.append(time.perf_counter() - t0)
    prof = torch.zeros(threads, len(OPS), dtype=torch.float64)
    for _ in range(repeats):
        call(prof)
    per_op = (prof / repeats).mean(0)
    return {"wall_s": statistics.median(walls), "ops_s": {op: float(v) for op, v in zip(OPS, per_op)}}


def roofline(target: KernelTarget, grid=(1, 2, 4, 8, 16), context: int = 200, repeats: int = 20) -> dict:
    """The split at each T of `grid`, with each op's memory and compute bounds (seconds) and the
    machine's rates they come from."""
    m = machine(target, torch.get_num_threads())
    out = {"machine": m, "context": context, "by_rows": {}}
    for T in grid:
        split = op_split(target, T, context, repeats)
        work = op_work(target, T, context)
        ops = {}
        for op, seconds in split["ops_s"].items():
            row = {"s": seconds}
            w = work.get(op)
            if w is not None:
                row["bytes"] = w["bytes"]
                row["memory_bound_s"] = w["bytes"] / (m["read_gbs"] * 1e9)
                if "macs" in w:
                    row["macs"] = w["macs"]
                    row["compute_bound_s"] = w["macs"] / (m["int8_gmacs"] * 1e9)
                else:
                    row["fmas"] = w["fmas"]
                    row["compute_bound_s"] = w["fmas"] / (m["fma_gflops"] * 1e9)
                row["bound_s"] = max(row["memory_bound_s"], row["compute_bound_s"])
                row["over_bound"] = seconds / row["bound_s"]
            ops[op] = row
        out["by_rows"][T] = {"wall_s": split["wall_s"], "ops": ops}
    return out


def format_roofline(r: dict) -> str:
    """The split as a table a person reads: one block per T, one line per op."""
    m = r["machine"]
    lines = [f"roofline: {m['threads']} threads, context {r['context']}; read {m['read_gbs']:.1f} GB/s, "
             f"int8 {m['int8_gmacs']:.0f} GMAC/s ({m['kernels']}), fp32 FMA {m['fma_gflops']:.0f} G/s"]
    for T, row in r["by_rows"].items():
        total = sum(o["s"] for o in row["ops"].values())
        lines.append(f"T={T}: {row['wall_s'] * 1e3:.2f} ms a forward (ops add to {total * 1e3:.2f} ms)")
        lines.append(f"  {'op':15s} {'ms':>7s} {'share':>6s} {'mem ms':>7s} {'cmp ms':>7s} {'x bound':>7s}")
        for op, o in row["ops"].items():
            bound = (f" {o['memory_bound_s'] * 1e3:7.3f} {o['compute_bound_s'] * 1e3:7.3f} {o['over_bound']:7.2f}"
                     if "bound_s" in o else "")
            lines.append(f"  {op:15s} {o['s'] * 1e3:7.3f} {o['s'] / total:6.1%}{bound}")
    return "\n".join(lines)
