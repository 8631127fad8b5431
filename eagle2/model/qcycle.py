"""A greedy speculative cycle in one call of the kernels (qcycle.h's qf_cycle): the tree drafted,
verified by the target, the accepted path walked on each row's argmax, its K/V kept and the draft
head's reading of it taken, for a target and an EAGLE-3 head both on the kernels. What
Decoder.speculate does call by call, without Python between the calls (docs/algorithms.md §2).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass

import numpy as np
import torch

from .llama import KVCache
from .qlib import CYCLE_CODES, CCycleIn, CCycleOut, check_cache, check_code
from .quantized import KernelDraft, KernelTarget
from .tree_modes import TREE_TOPK, BudgetInputs, CycleStage, TreeCounts


@dataclass(frozen=True)
class CycleOutcome:
    """What one call leaves. The tree's columns, `feats` and `logits` are the runner's arrays,
    valid until its next call (a step's trace reads them within the step); the head's reading
    (g, logp, top) stays valid one call longer, while the next cycle starts from it."""
    cols: dict[str, np.ndarray]  # the tree's columns (KernelDraft.tree_arrays)
    tree: TreeCounts             # the tree's counts
    path: list[int]              # the accepted verify positions, root excluded
    bonus: int                   # the target's token after the path: the next root
    feats: torch.Tensor          # [n_verify, width] what the head reads at every verified row
    logits: torch.Tensor         # [n_verify, vocab]
    g: torch.Tensor              # [D] the head's feature at the next root
    logp: torch.Tensor           # [V_draft] its log-probs for the next root's children
    top: tuple[torch.Tensor, torch.Tensor]   # their best TREE_TOPK: log-probs, target ids
    seconds: dict[str, float]    # tree (head: the head's steps within it), forward, accept, commit, absorb


class _Arrays:
    """One tree shape's outputs, made once and reused each call: the tree's columns, the rows the
    target verifies, and two sets of the head's reading (a call writes one while the reading it
    starts from, the other, is still read)."""

    def __init__(self, target: KernelTarget, draft: KernelDraft, shape: tuple[int, int, int]):
        a = target.args
        self.cols = draft.tree_arrays(*shape)
        self.tree_out = draft.tree_out(self.cols)
        rows = self.rows = len(self.cols["order"])
        width = len(target.aux_layers) * a.dim
        self.x, self.logits = torch.empty(rows, a.dim), torch.empty(rows, a.vocab_size)
        self.aux = torch.empty(rows, width) if width else None
        self.best, self.path = torch.empty(rows, dtype=torch.int64), np.empty(rows, np.int32)
        k = min(TREE_TOPK, draft.vocab)
        self.readings = [(torch.empty(rows, a.dim), torch.empty(draft.vocab), torch.empty(k),
                          torch.empty(k, dtype=torch.int64)) for _ in range(2)]
        self.outs = [CCycleOut(x=self.x.data_ptr(), aux=None if self.aux is None else self.aux.data_ptr(),
                               logits=self.logits.data_ptr(), best=self.best.data_ptr(), path=self.path.ctypes.data,
                               g=g.data_ptr(), logp=lp.data_ptr(), top_vals=tv.data_ptr(), top_ids=ti.data_ptr())
                     for g, lp, tv, ti in self.readings]
        self.turn = 0

    def tensors(self) -> list[torch.Tensor]:
        return [self.x, self.logits, self.best, *([] if self.aux is None else [self.aux]),
                *(t for r in self.readings for t in r)]


class KernelCycle:
    """qf_cycle for one target and its head. Its arrays are kept between calls (one set per tree
    shape), so one runner serves one decoder, one call at a time."""

    def __init__(self, target: KernelTarget, draft: KernelDraft):
        self.target, self.draft, self.lib = target, draft, target.lib
        self._shapes: dict[tuple[int, int, int], _Arrays] = {}

    @staticmethod
    def of(target, draft) -> "KernelCycle | None":
        """A runner where both run on the kernels (an EAGLE-3 head's one-call tree), else None."""
        if isinstance(target, KernelTarget) and isinstance(draft, KernelDraft) and draft.drafts_trees:
            return KernelCycle(target, draft)
        return None

    def _arrays(self, shape: tuple[int, int, int]) -> _Arrays:
        if shape not in self._shapes:
            self._shapes[shape] = _Arrays(self.target, self.draft, shape)
        return self._shapes[shape]

    def release(self) -> None:
        """Let its arrays go (a decoder that will not step again); the next call makes them anew."""
        self._shapes.clear()

    @property
    def held_bytes(self) -> int:
        """The bytes its arrays reserve (the logits' rows the most: [rows, vocab] in fp32)."""
        return sum(t.numel() * t.element_size() for a in self._shapes.values() for t in a.tensors())

    def rows(self, top_k: int, depth: int, total_tokens: int) -> int:
        """The most rows a tree of this shape verifies (the target's cache needs room for them)."""
        return self._arrays((top_k, depth, total_tokens)).rows

    @torch.no_grad()
    def run(self, cache: KVCache, hcache: KVCache, root: int, root_g: torch.Tensor, root_top: tuple, top_k: int,
            depth: int, total_tokens: int, budget: BudgetInputs | None) -> CycleOutcome:
        """One cycle from the root's reading (`root_g`, `root_top`: what the head last absorbed).
        The caches' lengths advance by the pairs kept; a cache without room for the tree's rows is
        refused before anything runs."""
        t, d, a = self.target, self.draft, self.target.args
        check_cache(cache, a.n_layers, a.n_kv_heads, a.head_dim, "the one-call cycle")
        arr = self._arrays((top_k, depth, total_tokens))
        rows = arr.rows
        if cache.length + rows > cache.max_len:
            raise RuntimeError("KV cache full")
        tree = d.tree_call(hcache, root, root_g, root_top, hcache.length - 1, top_k, depth, total_tokens, arr.cols,
                           budget, arr.tree_out)
        cos, sin = t.rope(cache.max_len + 1)
        cin = CCycleIn(kc=cache.k.data_ptr(), vc=cache.v.data_ptr(), cap=cache.max_len, committed=cache.length,
                       cos=cos.data_ptr(), sin=sin.data_ptr(), taps=ctypes.addressof(t.c_taps),
                       rope_rows=min(cos.shape[0], sin.shape[0]), ntaps=len(t.aux_layers), cap_rows=rows,
                       threads=torch.get_num_threads())
        arr.turn ^= 1
        cout = arr.outs[arr.turn]
        rc = self.lib.qf_cycle(ctypes.byref(t.c_model), ctypes.byref(d.c), ctypes.byref(tree.cin),
                               ctypes.byref(tree.cout), ctypes.byref(cin), ctypes.byref(cout))
        if rc != 0:
            stage = CycleStage(cout.stage)
            k = min(TREE_TOPK, d.vocab)
            check_code(f"qf_cycle ({stage.name.lower()})", rc, CYCLE_CODES[stage], **tree.known,
                       taps=list(t.aux_layers), layers=a.n_layers, rows=rows, topk_max=k, k=k)
        counts, kept = tree.counts(), 1 + cout.n_path
        cache.advance(kept)
        hcache.advance(kept)
        T = counts.n_verify
        g, logp, tv, ti = arr.readings[arr.turn]
        feats = arr.x if arr.aux is None else arr.aux
        return CycleOutcome(cols=arr.cols, tree=counts, path=arr.path[: cout.n_path].tolist(), bonus=cout.bonus,
                            feats=feats[:T], logits=arr.logits[:T], g=g[kept - 1], logp=logp, top=(tv, ti),
                            seconds={"tree": cout.tree_s, "head": counts.head_s, "forward": cout.forward_s,
                                     "accept": cout.accept_s, "commit": cout.commit_s, "absorb": cout.absorb_s})
