"""A draft tree while a Python policy grows it: the pool as lists that the policy's hooks read and
extend node by node (index 0 = the root), then `build()`: the columnar tree every policy and
backend hands the cycle (TreeArrays, as the kernels' one-call drafting fills it), its verification
laid out once (cycle/layout.py).
"""
from __future__ import annotations

import numpy as np

from .layout import lay_out
from .tree import TreeRecord
from .tree_arrays import TreeArrays


class TreeBuilder:
    def __init__(self, root: int):
        self.tokens, self.parents, self.depths, self.ranks = [root], [-1], [0], [0]
        self.logp: list[float] = [0.0]     # log draft probability of the token given its parent
        self.values: list[float] = [0.0]   # log path value = sum of logp from the root
        self.levels = [-1]                 # the draft call that proposed it (0 = the call on the root)
        self.kept = [True]                 # selected for verification (root always)
        self.beam: list[list[int]] = []    # beam-expanding policies: nodes expanded per level
        self.draft_calls = 0               # draft-head calls this cycle, the root's included
        self.record: TreeRecord | None = None
        self.sampled_drafts = False        # siblings were sampled from q (SpecInfer's rule applies)
        self.draft_dists: dict = {}        # q at each parent of sampled siblings (dense [V] tensors)

    def __len__(self) -> int:
        return len(self.tokens)

    def add(self, tokens, parents, depths, ranks, logp, values, level, kept=False) -> list[int]:
        """Append nodes (one entry each in every list); returns their pool indices."""
        n0 = len(self.tokens)
        self.tokens += tokens
        self.parents += parents
        self.depths += depths
        self.ranks += ranks
        self.logp += logp
        self.values += values
        self.levels += [level] * len(tokens)
        self.kept += [kept] * len(tokens)
        return list(range(n0, n0 + len(tokens)))

    def close_under_parents(self) -> None:
        """Keep every kept node's ancestors too (a verified node's context is verified)."""
        for i in range(len(self.tokens)):
            if self.kept[i]:
                p = self.parents[i]
                while p >= 0 and not self.kept[p]:
                    self.kept[p] = True
                    p = self.parents[p]

    def build(self) -> TreeArrays:
        """The tree as columns, with the verification's layout (what the kernels fill)."""
        cols = {"tokens": np.asarray(self.tokens, np.int64), "parents": np.asarray(self.parents, np.int32),
                "depths": np.asarray(self.depths, np.int32), "ranks": np.asarray(self.ranks, np.int32),
                "logp": np.asarray(self.logp, np.float64), "values": np.asarray(self.values, np.float64),
                "levels": np.asarray(self.levels, np.int32), "kept": np.asarray(self.kept, np.uint8),
                "beam": np.asarray([i for b in self.beam for i in b], np.int32),
                "beam_len": np.asarray([len(b) for b in self.beam], np.int32)}
        cols["order"], cols["parent_pos"], cols["mask"] = lay_out(cols["kept"], cols["parents"], cols["depths"])
        return TreeArrays(cols, len(self.tokens), len(self.beam), self.draft_calls, len(cols["order"]),
                          record=self.record, sampled_drafts=self.sampled_drafts, draft_dists=self.draft_dists)
