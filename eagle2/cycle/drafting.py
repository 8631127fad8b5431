"""Running the draft head inside one cycle: the tree part of its KV cache and its masks.

Policies see the draft head only through HeadRunner:
- the root's reading: `root_logp` (the head's distribution for the root's children), `root_g` (the
  feature it predicts at the root) and `root_seconds` (what reading it took: a call's first price);
- `run(...)`, which feeds a batch of tree nodes (each attending to the committed context, its
  ancestors and itself) and returns their predicted features and next-token log-probabilities;
  `topk(...)` ranks a row's best children (from what a call already ranked where it can), and
  `calls` counts the calls made;
- `drafts_trees` and `draft_tree(...)`: whether the draft head grows a whole tree in one call of
  the kernels, and that call (EAGLE-2's rule and the auto budget's, tree_modes.TreeBudget);
- the cycle's `clock` (each head call is its draft_head phase), the decoder's `sampling`
  parameters and its draft `gen`erator (for policies that sample their drafts), and `draft` (the
  head's forward: its draft vocabulary and size).
"""
from __future__ import annotations

import numpy as np
import torch

from ..model.forward import DraftForward
from ..model.llama import KVCache
from ..model.tree_modes import TREE_TOPK, BudgetInputs, TreeCounts
from ..phases import PhaseClock
from .sampling import SamplingParams
from .tree_arrays import TreeArrays


class HeadRunner:
    def __init__(self, draft: DraftForward, cache: KVCache, root_g: torch.Tensor, base_pos: int,
                 root_logp: torch.Tensor, sampling: SamplingParams | None = None, gen: torch.Generator | None = None,
                 clock: PhaseClock | None = None, root_top: tuple | None = None, root_seconds: float = 0.0):
        self.draft = draft
        self.clock = clock or PhaseClock()        # the cycle's: each head call is its draft_head phase
        self.sampling = sampling or SamplingParams()
        self.gen = gen if gen is not None else torch.Generator().manual_seed(0)
        self.cache = cache
        self.root_g = root_g                      # [D] predicted feature at the root's position
        self.root_logp = root_logp                # [V_draft]: the head's reading at the root
        # (log-probs, their top k ranked with them): what topk answers without ranking again
        self.ranked = [(self.root_logp, root_top)]
        self.root_seconds = root_seconds          # what the head took for the root's reading: a call's price
        self.base_pos = base_pos                  # head position of the root's pair
        self.start = cache.length            # first tree slot
        self.used = 0
        # the tree's ancestor masks, grown by run() (a tree the kernels draft in one call needs none)
        self.anc = np.zeros((0, 0), dtype=bool)
        self.calls = 1                            # the root call already ran

    @property
    def drafts_trees(self) -> bool:
        """Whether the whole tree can be drafted in one call of the kernels (draft_tree)."""
        return self.draft.drafts_trees and self.ranked[0][1] is not None

    def draft_tree(self, root: int, top_k: int, depth: int, total_tokens: int,
                   budget: BudgetInputs | None = None) -> tuple[TreeArrays, TreeCounts]:
        """EAGLE-2's tree under `root` in one call of the kernels (quantized.KernelDraft.draft_tree:
        every level's head step, the top-k, the beams, the rerank and the verify layout; `budget`:
        the auto budget's data). Its head steps' time is this cycle's draft_head phase, the rest
        its draft_tree phase. Returns the tree and the call's counts."""
        cols = self.draft.tree_arrays(top_k, depth, total_tokens)
        self.clock.lap("draft_tree")
        r = self.draft.draft_tree(self.cache, root, self.root_g, self.ranked[0][1], self.base_pos, top_k, depth,
                                  total_tokens, cols, budget)
        self.clock.lap_within("draft_tree", "draft_head", r.head_s)
        self.calls = r.draft_calls
        return TreeArrays.filled(cols, r), r

    def _grow(self, n: int) -> None:
        if n > self.anc.shape[0]:
            cap = max(n, 64, 2 * self.anc.shape[0])
            a = np.zeros((cap, cap), dtype=bool)
            a[: self.anc.shape[0], : self.anc.shape[1]] = self.anc
            self.anc = a

    def run(self, tokens: list[int], parent_g: torch.Tensor, parent_slots: list[int],
            depths: list[int]) -> tuple[torch.Tensor, torch.Tensor, list[int]]:
        """tokens: target ids of k nodes; parent_g [k, D]: the head's predicted feature at each
        node's parent; parent_slots: tree slot of each parent (-1 = the root, whose pair is in
        the committed part). Returns (g [k,D], logp [k,V_draft], slots of these nodes)."""
        k = len(tokens)
        s0 = self.used
        self._grow(s0 + k)
        for j, ps in enumerate(parent_slots):
            if ps >= 0:
                self.anc[s0 + j, : s0] = self.anc[ps, : s0]
            self.anc[s0 + j, s0 + j] = True
        dev = parent_g.device
        mask = torch.from_numpy(self.anc[s0: s0 + k, : s0 + k].copy()).to(dev)
        tok = torch.tensor(tokens, dtype=torch.long, device=dev)
        pos = torch.tensor([self.base_pos + d for d in depths], dtype=torch.long, device=dev)
        self.clock.lap("draft_tree")              # the tree's work since the last call, these inputs
        g, logp, top = self.draft.step(self.cache, parent_g, tok, pos, self.start + s0, mask, TREE_TOPK)
        self.ranked = [self.ranked[0], (logp, top)]
        self.clock.lap("draft_head")
        self.used += k
        self.calls += 1
        return g, logp, list(range(s0, s0 + k))

    def topk(self, logp: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
        """Top-k over the draft vocabulary, returned as (log-probs, target ids): the ranking the
        draft call made when `logp` is its output and k is within it."""
        k = min(k, logp.shape[-1])
        for lp, top in self.ranked:
            if lp is logp and top is not None and k <= top[0].shape[-1]:
                return top[0][..., :k], top[1][..., :k]
        v, i = logp.topk(k, dim=-1)
        return v, self.draft.to_target_ids(i)
