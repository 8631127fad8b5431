"""Laying the kept nodes of a draft tree out for one target forward: tokens, positions, the tree
attention mask (each node sees the committed context, its ancestors and itself) and each node's
children in rank order, which the acceptance rules walk."""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property

import numpy as np
import torch

from .tree import DraftTree


@dataclass
class VerifyBatch:
    """The kept nodes laid out for one target forward."""
    pool_idx: list[int]          # verify position -> pool index
    tokens: torch.Tensor         # [T]
    positions: torch.Tensor      # [T] = committed length + depth
    mask: torch.Tensor           # [T, T] ancestors + self
    parent_pos: list[int]        # verify position of the parent (-1 for the root)
    ranks: list[int]             # each node's rank among its siblings

    @cached_property
    def token_list(self) -> list[int]:
        """The tokens as Python ints (what the acceptance walks and the commit read)."""
        return self.tokens.tolist()

    @cached_property
    def children(self) -> list[list[int]]:
        """Verify positions of each node's children, in rank order (what the sampled and the
        lossy rules walk; the greedy rule reads parent_pos)."""
        children: list[list[int]] = [[] for _ in self.parent_pos]
        for i in range(1, len(self.parent_pos)):
            children[self.parent_pos[i]].append(i)
        for ch in children:
            ch.sort(key=lambda i: self.ranks[i])
        return children


def layout(tree, committed: int, device) -> VerifyBatch:
    """The batch of a DraftTree, or of a TreeArrays (whose kernels laid it out already)."""
    if not isinstance(tree, DraftTree):
        return tree.layout(committed, device)
    order = tree.verify_order()
    pos_of = {p: i for i, p in enumerate(order)}
    T = len(order)
    parent_pos = [pos_of.get(tree.parents[p], -1) for p in order]
    anc = np.eye(T, dtype=bool)
    for i in range(1, T):  # parents come first, so one pass builds ancestor rows
        anc[i] |= anc[parent_pos[i]]
    depths = np.array([tree.depths[p] for p in order])
    return VerifyBatch(
        pool_idx=order,
        tokens=torch.tensor([tree.tokens[p] for p in order], dtype=torch.long, device=device),
        positions=torch.from_numpy(committed + depths).to(device),
        mask=torch.from_numpy(anc).to(device),
        parent_pos=parent_pos, ranks=[tree.ranks[p] for p in order])
