"""Training-time test (docs/algorithms.md §1): unrolled passes in which a one-layer draft head reads
its own outputs under exactly the attention deeper draft nodes have at decode time. Shared by the
EAGLE-1/2 head (head.py) and the EAGLE-3 head (head3.py), which differ only in how a pair
(hidden input, token) becomes the attention input and the residual."""
from __future__ import annotations

from typing import Callable

import torch
import torch.nn.functional as F

from .llama import apply_rope


def ttt_mask(T: int, s: int, device) -> torch.Tensor:
    """[T, s*T] bool for pass s over the keys [true pairs; pass 2; ...; pass s]: row j sees the true
    pairs up to j-s+1, row j-s+m of pass m (its ancestor, m = 2..s-1) and itself."""
    ones = torch.ones(T, T, dtype=torch.bool, device=device)

    def diag(offset):  # key i visible from query j iff i == j - offset
        return ones.tril(-offset) & ~ones.tril(-offset - 1)

    return torch.cat([ones.tril(-(s - 1))] + [diag(s - m) for m in range(2, s + 1)], dim=1)


def unrolled_passes(layer, cos: torch.Tensor, sin: torch.Tensor, z1: torch.Tensor, g1: torch.Tensor, steps: int,
                    step_inputs: Callable[[torch.Tensor], tuple[torch.Tensor, torch.Tensor]],
                    detach: bool = True) -> list[torch.Tensor]:
    """Passes 2..steps of `layer` (it has self_attn, post_attention_layernorm and mlp). z1 [B,T,Din]:
    the attention input of the true pairs (pass 1, whose output is g1 [B,T,D]). In pass s row j
    reads pass s-1's output at row j-1 (row 0, which no loss reads, its own row 0): step_inputs
    maps those shifted outputs to (attention input, residual). `detach` stops gradients at the
    fed-back outputs (EAGLE-1/2 head) or lets them flow through the chain (EAGLE-3)."""
    B, T, _ = z1.shape
    at = layer.self_attn
    a = at.a
    cos, sin = cos[:T], sin[:T]

    def heads(proj, x, n):
        return proj(x).view(B, T, n, a.head_dim).transpose(1, 2)

    def kv(z):
        return apply_rope(heads(at.k_proj, z, a.n_kv_heads), cos, sin), heads(at.v_proj, z, a.n_kv_heads)

    k1, v1 = kv(z1)
    ks, vs = [k1], [v1]
    outs, prev = [], g1
    for s in range(2, steps + 1):
        own = prev.detach() if detach else prev
        z, x = step_inputs(torch.cat([own[:, :1], own[:, :-1]], dim=1))
        k, v = kv(z)
        ks.append(k)
        vs.append(v)
        q = apply_rope(heads(at.q_proj, z, a.n_heads), cos, sin)
        out = F.scaled_dot_product_attention(q, torch.cat(ks, dim=2), torch.cat(vs, dim=2),
                                             attn_mask=ttt_mask(T, s, z1.device), enable_gqa=True)
        x = x + at.o_proj(out.transpose(1, 2).reshape(B, T, -1))
        prev = x + layer.mlp(layer.post_attention_layernorm(x))
        outs.append(prev)
    return outs
