"""The functions that are compiled ahead of time (compiled.py packages and loads them).

Each is pure and static in its row count T (one package per tree-size bucket):
- `TreeForward`, the target: (tokens, cos, sin, k_cache, v_cache, start, tree_mask[T, T])
      -> (features [T, D], logits [T, V], new K [L, 1, kv, T, d], new V); for a target whose
      `aux_layers` are set (an EAGLE-3 head reads them) the first output is those layers' input
      states side by side [T, k*D] instead, what `forward_draft` gives the head;
- `HeadForward`, the EAGLE-1/2 draft head: (embeddings [T, D], features [T, D], cos, sin,
      k_cache, v_cache, committed, start, tree_mask [T, start - committed + T])
      -> (g [T, D], draft log-probs [T, V_draft], new K [1, kv, T, d], new V);
- `Head3Forward`, the EAGLE-3 draft head, the same signature with `features` its layer's D-wide
      hidden input (fc of the target's fused states, or a parent's g: `hidden_input`).
Attention over the cache is one opaque custom op that runs eagerly over the live length, so the
graphs' only shapes are T (and the head's mask width) and the cache may be any size. It does not
write the cache (a mutating op came out of AOTInductor with wrong logits): the caller writes the
returned K/V. The head takes token embeddings, not ids, so its package does not bake in the
target's 113 MB embedding table.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from ..files import atomic_path
from .llama import apply_rope


@torch.library.custom_op("eagle2::cached_tree_attention", mutates_args=())
def cached_tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, committed: torch.Tensor, start: torch.Tensor,
                          tree_mask: torch.Tensor) -> torch.Tensor:
    """Attention of T new queries over cache slots [0, start) and the T new keys. Committed slots
    [0, committed) are always visible; tree slots [committed, start) and the new keys follow
    `tree_mask` [T, start - committed + T]. q [1, H, T, d]; k, v [1, kv, T, d]; caches
    [1, kv, C, d]. One softmax over all parts: it equals SDPA over the concatenation without
    copying the cache."""
    c, s = int(committed), int(start)
    _, H, T, d = q.shape
    kv = k.shape[1]
    g = H // kv
    qq = q[0].reshape(kv, g * T, d) * d ** -0.5  # query heads grouped under their K/V head
    scores_new = (qq @ k[0].transpose(1, 2)).view(kv, g, T, T).masked_fill(~tree_mask[:, s - c:], float("-inf"))
    scores_new = scores_new.view(kv, g * T, T)
    if s == 0:
        return (torch.softmax(scores_new, -1) @ v[0]).reshape(1, H, T, d)
    scores_old = qq @ k_cache[0, :, :s].transpose(1, 2)
    if s > c:
        tree = scores_old[:, :, c:].view(kv, g, T, s - c).masked_fill(~tree_mask[:, : s - c], float("-inf"))
        scores_old = torch.cat([scores_old[:, :, :c], tree.view(kv, g * T, s - c)], -1)
    p = torch.softmax(torch.cat([scores_old, scores_new], -1), -1)
    out = p[..., :s] @ v_cache[0, :, :s] + p[..., s:] @ v[0]
    return out.reshape(1, H, T, d)


@cached_tree_attention.register_fake
def _(q, k, v, k_cache, v_cache, committed, start, tree_mask):
    # contiguous, as the op returns it: empty_like(q) would keep q's transposed strides, and the
    # compiled graph would then read every T > 1 output scrambled
    return q.new_empty(q.shape)


def _attend(at, a, h, cos, sin, k_cache, v_cache, committed, start, tree_mask):
    """One attention sub-layer through the custom op: (output [1, T, D], new K, new V)."""
    T = h.shape[1]
    q = F.linear(h, at.q_proj.weight, at.q_proj.bias).view(1, T, a.n_heads, a.head_dim).transpose(1, 2)
    k = F.linear(h, at.k_proj.weight, at.k_proj.bias).view(1, T, a.n_kv_heads, a.head_dim).transpose(1, 2)
    v = F.linear(h, at.v_proj.weight, at.v_proj.bias).view(1, T, a.n_kv_heads, a.head_dim).transpose(1, 2)
    q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
    o = torch.ops.eagle2.cached_tree_attention(q, k, v, k_cache, v_cache, committed, start, tree_mask)
    return F.linear(o.transpose(1, 2).reshape(1, T, -1), at.o_proj.weight), k, v


def _mlp(mlp, h):
    return F.linear(F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight), mlp.down_proj.weight)


class TreeForward(nn.Module):
    """The target's blocks with the custom attention op (all cache slots before `start` committed)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens, cos, sin, k_cache, v_cache, start, tree_mask):
        m = self.model
        taps = m.aux_layers  # EAGLE-3: the states entering these layers are what its head reads
        x = m.embed_tokens(tokens)[None]
        new_k, new_v, aux = [], [], []
        for i, blk in enumerate(m.layers):
            if i in taps:
                aux.append(x)
            o, k, v = _attend(blk.self_attn, m.args, blk.input_layernorm(x), cos, sin, k_cache[i], v_cache[i],
                              start, start, tree_mask)
            x = x + o
            x = x + _mlp(blk.mlp, blk.post_attention_layernorm(x))
            new_k.append(k)
            new_v.append(v)
        if len(m.layers) in taps:
            aux.append(x)
        feats = m.norm(x)[0]
        head_in = torch.cat(aux, -1)[0] if taps else feats
        return head_in, F.linear(feats, m.lm_head.weight), torch.stack(new_k), torch.stack(new_v)


class HeadForward(nn.Module):
    """The EAGLE-1/2 head's cached forward and its draft log-probabilities in one graph."""

    def __init__(self, head):
        super().__init__()
        self.head = head
        self.lm_weight = nn.Parameter(head.lm_weight.detach(), requires_grad=False)  # draft-vocabulary rows

    def forward(self, emb, features, cos, sin, k_cache, v_cache, committed, start, tree_mask):
        h = self.head
        blk = h.layers[0]
        x = F.linear(torch.cat([emb, features], -1), h.fc.weight, h.fc.bias)[None]
        o, k, v = _attend(blk.self_attn, h.args, x, cos, sin, k_cache, v_cache, committed, start, tree_mask)
        x = x + o
        g = (x + _mlp(blk.mlp, blk.post_attention_layernorm(x)))[0]
        return g, torch.log_softmax(F.linear(g, self.lm_weight), -1), k, v


class Head3Forward(nn.Module):
    """The EAGLE-3 head's cached forward (its midlayer over [input_layernorm(e); hidden_norm(u)],
    2D wide) and its draft log-probabilities (`norm`, its own LM head) in one graph; `fc` stays
    outside (head3.hidden_input), so one graph serves fused states and fed-back outputs."""

    def __init__(self, head):
        super().__init__()
        self.head = head
        self.lm_weight = nn.Parameter(head.lm_weight.detach(), requires_grad=False)

    def forward(self, emb, features, cos, sin, k_cache, v_cache, committed, start, tree_mask):
        h = self.head  # features: the layer's hidden input u [T, D]
        m = h.midlayer
        hn = m.hidden_norm(features)
        x = (hn if m.norm_before_residual else features)[None]
        o, k, v = _attend(m.self_attn, h.args, torch.cat([m.input_layernorm(emb), hn], -1)[None], cos, sin,
                          k_cache, v_cache, committed, start, tree_mask)
        x = x + o
        g = (x + _mlp(m.mlp, m.post_attention_layernorm(x)))[0]
        return g, torch.log_softmax(F.linear(h.norm(g), self.lm_weight), -1), k, v


def head_function(head) -> nn.Module:
    """The compiled function of a draft head of either kind."""
    return Head3Forward(head) if hasattr(head, "midlayer") else HeadForward(head)


def target_example(model, T: int, context: int = 8):
    a = model.args
    w = model.lm_head.weight
    cos, sin = model.rope(context + T + 1)
    pos = torch.arange(context, context + T, device=w.device)
    cache = torch.zeros(a.n_layers, 1, a.n_kv_heads, context + T + 64, a.head_dim, dtype=w.dtype, device=w.device)
    return (torch.zeros(T, dtype=torch.long, device=w.device), cos[pos], sin[pos], cache, cache.clone(),
            torch.tensor(context), torch.ones(T, T, dtype=torch.bool, device=w.device).tril())


def head_example(head, T: int, context: int = 8, tree: int = 3):
    a = head.args
    w = head.fc.weight
    cos, sin = head.rope(context + tree + T + 1)
    pos = torch.arange(context, context + T, device=w.device)
    cache = torch.zeros(1, a.n_kv_heads, context + tree + T + 64, a.head_dim, dtype=w.dtype, device=w.device)
    x = torch.zeros(T, a.dim, dtype=w.dtype, device=w.device)
    return (x, x.clone(), cos[pos], sin[pos], cache, cache.clone(), torch.tensor(context),
            torch.tensor(context + tree), torch.ones(T, tree + T, dtype=torch.bool, device=w.device))


def build_package(kind: str, module, T: int, path: Path, autotune: bool = True) -> float:
    """Export the T-row function of `kind` ("target": a LlamaModel, "head": a draft head) and
    compile it with AOTInductor into `path` (atomically). Returns the seconds it took."""
    t0 = time.perf_counter()
    C = torch.export.Dim("C", min=16, max=1 << 20)  # any cache capacity
    if kind == "target":
        fn, example = TreeForward(module), target_example(module, T)
        shapes = {"tokens": None, "cos": None, "sin": None, "k_cache": {3: C}, "v_cache": {3: C},
                  "start": None, "tree_mask": None}
    else:
        W = torch.export.Dim("W", min=1, max=1 << 16)  # tree slots so far + T
        fn, example = head_function(module), head_example(module, T)
        shapes = {"emb": None, "features": None, "cos": None, "sin": None, "k_cache": {2: C}, "v_cache": {2: C},
                  "committed": None, "start": None, "tree_mask": {1: W}}
    with torch.no_grad():
        ep = torch.export.export(fn.eval(), example, dynamic_shapes=shapes)
    with atomic_path(path, suffix=".part.pt2") as tmp:  # renamed when whole (AOTInductor wants .pt2)
        torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp), inductor_configs={
            "freezing": True, "max_autotune": autotune, "max_autotune_gemm_backends": "CPP,ATEN"})
    return time.perf_counter() - t0
