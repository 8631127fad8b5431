"""What attention scores in int8 would cost in agreement (a candidate for a long prompt's prefill,
measured before any kernel is written): the fp32 target over a long prompt, its attention computed
three ways, and how often each row's next-token argmax and distribution match the first:
  fp16-keys: q . k with the keys and values rounded to fp16, as the q4_1 kernels' cache holds them;
  int8: q and k each quantised per block of 32 values to int8 (scale amax / 127, Q8_0's rule);
  int8-smooth: the same after subtracting the keys' mean per channel (SageAttention's smoothing;
  each query's scores shift by one constant, which the softmax ignores).

    python scripts/int8_scores_agreement.py --chars 6000 --out benchmarks/long-prompts/int8-scores.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))


def blocks_int8(x: torch.Tensor, block: int = 32) -> torch.Tensor:
    """x with each block of `block` values along the last axis quantised to int8 and back."""
    xb = x.reshape(*x.shape[:-1], x.shape[-1] // block, block)
    d = xb.abs().amax(-1, keepdim=True) / 127
    safe = torch.where(d > 0, d, torch.ones_like(d))
    return (torch.round(xb / safe) * d).reshape(x.shape)


def attention(mode: str):
    """A stand-in for scaled_dot_product_attention (causal, grouped kv heads) computing its scores
    as `mode` says."""
    def sdpa(q, k, v, is_causal=True, enable_gqa=True):
        rep = q.shape[1] // k.shape[1]
        k, v = k.repeat_interleave(rep, 1).half().float(), v.repeat_interleave(rep, 1).half().float()
        if mode == "int8":
            q, k = blocks_int8(q), blocks_int8(k)
        elif mode == "int8-smooth":
            mu = k.mean(-2, keepdim=True)
            q, k = blocks_int8(q), blocks_int8(k - mu) + mu
        s = (q @ k.transpose(-1, -2)) / math.sqrt(q.shape[-1])
        T = s.shape[-1]
        s = s.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        return torch.softmax(s, -1) @ v
    return sdpa


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--chars", type=int, default=6000, help="the long prompt's characters (long_prompt.py's text)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path)
    a = ap.parse_args(argv)
    from long_prompt import long_prompt
    from eagle2.machine import describe_cpu
    from eagle2.model import llama
    from eagle2.model.loading import load_bundle
    torch.set_num_threads(a.threads)
    b = load_bundle(None, None, "cpu", "float32")
    ids = b.tokenizer(long_prompt(a.chars))["input_ids"]
    logits = {}
    real = llama.F.scaled_dot_product_attention
    try:
        for mode in ("fp16-keys", "int8", "int8-smooth"):
            llama.F.scaled_dot_product_attention = attention(mode)
            with torch.no_grad():
                logits[mode] = b.target.logits(b.target.forward_full(torch.tensor([ids])))[0]
    finally:
        llama.F.scaled_dot_product_attention = real
    ref = logits["fp16-keys"]
    out = {"command": "python scripts/int8_scores_agreement.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "cpu": describe_cpu(a.threads), "prompt_tokens": len(ids), "against": "fp16-keys", "modes": {}}
    for mode in ("int8", "int8-smooth"):
        x = logits[mode]
        kl = (torch.softmax(ref, -1) * (torch.log_softmax(ref, -1) - torch.log_softmax(x, -1))).sum(-1)
        r = {"argmax_agreement": (x.argmax(-1) == ref.argmax(-1)).float().mean().item(),
             "last_row_agrees": bool(x[-1].argmax() == ref[-1].argmax()),
             "kl_mean": kl.mean().item(), "kl_max": kl.max().item()}
        out["modes"][mode] = r
        print(f"{len(ids)} tokens, {mode}: each row's next-token argmax agrees on {100 * r['argmax_agreement']:.2f}% "
              f"of rows (the last row: {r['last_row_agrees']}); KL mean {r['kl_mean']:.2e}, max {r['kl_max']:.2e}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
