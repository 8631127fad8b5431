"""The functions that are compiled ahead of time (compiled.py packages and loads them): the
model's own pure forwards (`LlamaModel.step`, `DraftHead.step`), wrapped so that every shape but
the cache's is static in the row count T (one package per tree-size bucket):
- `TreeForward`, the target: (tokens [T], cos, sin, k_cache, v_cache, past_mask [T, S],
      new_mask [T, T]) -> (what the draft head reads [T, F], logits [T, V], new K [L, 1, kv, T, d],
      new V): F is D, or for a target whose `aux_layers` are set (an EAGLE-3 head reads them)
      those layers' input states side by side;
- `HeadForward`, a draft head of either kind: (embeddings [T, D], hidden input [T, D] or [T, 2D],
      cos, sin, k_cache, v_cache, past_mask [T, S], new_mask [T, T]) -> (g [T, D], draft
      log-probs [T, V_draft], new K [1, kv, T, d], new V).
S, the cached slots attention reads, is the past mask's width: the graphs read the cache as a
view of its first S slots (llama.attend: no copy, no Python, any cache size). They do not write
it: the caller stores the returned K/V, as the eager forward does. The head takes token
embeddings, not ids, so its package does not bake in the target's 113 MB embedding table.
"""
from __future__ import annotations

import time
from pathlib import Path

import torch
from torch import nn

from ..files import atomic_path
from .llama import plain_linears


# inductor's own C++ GEMM over weights it packs once, for every matmul: with ATen also offered,
# autotuning at build time once gave the T=8 LM head to MKL, which repacks its 113 MB weight on
# every call (the T=8 forward took 67 ms against 28 ms at T=4; measured, benchmarks/one-graph)
GEMM_BACKENDS = "CPP"


class TreeForward(nn.Module):
    """The target's `step` and logits, with the cache's visible width taken from the past mask."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, tokens, cos, sin, k_cache, v_cache, past_mask, new_mask):
        m = self.model
        S = past_mask.shape[1]
        feats, aux, new_k, new_v = m.step(m.embed_tokens(tokens)[None], cos, sin, k_cache[:, :, :, :S],
                                          v_cache[:, :, :, :S], past_mask, new_mask, with_aux=bool(m.aux_layers))
        feats = feats[0]
        head_in = torch.cat(aux, -1)[0] if m.aux_layers else feats
        return head_in, m.logits(feats), new_k, new_v


class HeadForward(nn.Module):
    """A draft head's `step` and its draft log-probabilities in one graph."""

    def __init__(self, head):
        super().__init__()
        self.head = head

    def forward(self, emb, hidden, cos, sin, k_cache, v_cache, past_mask, new_mask):
        h = self.head
        S = past_mask.shape[1]
        g, k, v = h.step(emb[None], hidden[None], cos, sin, k_cache[:, :, :S], v_cache[:, :, :S], past_mask,
                         new_mask)
        return g[0], h.draft_logprobs(g[0]), k, v


def target_example(model, T: int, context: int = 8):
    a = model.args
    w = model.lm_head.weight
    cos, sin = model.rope(context + T + 1)
    pos = torch.arange(context, context + T, device=w.device)
    cache = torch.zeros(a.n_layers, 1, a.n_kv_heads, context + T + 64, a.head_dim, dtype=w.dtype, device=w.device)
    return (torch.zeros(T, dtype=torch.long, device=w.device), cos[pos], sin[pos], cache, cache.clone(),
            torch.ones(T, context, dtype=torch.bool, device=w.device),
            torch.ones(T, T, dtype=torch.bool, device=w.device).tril())


def head_example(head, T: int, context: int = 8, tree: int = 3):
    a = head.args
    w = head.fc.weight
    cos, sin = head.rope(context + tree + T + 1)
    pos = torch.arange(context, context + T, device=w.device)
    cache = torch.zeros(1, a.n_kv_heads, context + tree + T + 64, a.head_dim, dtype=w.dtype, device=w.device)
    x = torch.zeros(T, a.dim, dtype=w.dtype, device=w.device)  # the embeddings; the hidden input as wide
    return (x, x.clone(), cos[pos], sin[pos], cache, cache.clone(),
            torch.ones(T, context + tree, dtype=torch.bool, device=w.device),
            torch.ones(T, T, dtype=torch.bool, device=w.device).tril())


def build_package(kind: str, module, T: int, path: Path, autotune: bool = True) -> float:
    """Export the T-row function of `kind` ("target": a LlamaModel, "head": a draft head) and
    compile it with AOTInductor into `path` (atomically). Returns the seconds it took."""
    t0 = time.perf_counter()
    C = torch.export.Dim("C", min=16, max=1 << 20)  # any cache capacity
    S = torch.export.Dim("S", min=1, max=(1 << 20) - 1)  # the cached slots read (never 0: compiled.py)
    if kind == "target":
        fn, example = TreeForward(module), target_example(module, T)
        shapes = {"tokens": None, "cos": None, "sin": None, "k_cache": {3: C}, "v_cache": {3: C},
                  "past_mask": {1: S}, "new_mask": None}
    else:
        fn, example = HeadForward(module), head_example(module, T)
        shapes = {"emb": None, "hidden": None, "cos": None, "sin": None, "k_cache": {2: C}, "v_cache": {2: C},
                  "past_mask": {1: S}, "new_mask": None}
    with torch.no_grad(), plain_linears(module):
        ep = torch.export.export(fn.eval(), example, dynamic_shapes=shapes)
    with atomic_path(path, suffix=".part.pt2") as tmp:  # renamed when whole (AOTInductor wants .pt2)
        torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp), inductor_configs={
            "freezing": True, "max_autotune": autotune, "max_autotune_gemm_backends": GEMM_BACKENDS,
            # the weights in a blob beside the library, so that packages can share one copy
            "aot_inductor.package_constants_in_so": False,
            "aot_inductor.package_constants_on_disk_format": "binary_blob"})
    return time.perf_counter() - t0
