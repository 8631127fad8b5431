"""Laying the kept nodes of a draft tree out for one target forward: tokens, positions, the tree
attention mask (each node sees the committed context, its ancestors and itself) and each node's
children in rank order, which the acceptance rules walk."""
from __future__ import annotations

from dataclasses import dataclass

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
    children: list[list[int]]    # verify positions of each node's children, in rank order


def layout(tree: DraftTree, committed: int, device) -> VerifyBatch:
    order = tree.verify_order()
    pos_of = {p: i for i, p in enumerate(order)}
    T = len(order)
    parent_pos = [pos_of.get(tree.parents[p], -1) for p in order]
    anc = np.eye(T, dtype=bool)
    for i in range(1, T):  # parents come first, so one pass builds ancestor rows
        anc[i] |= anc[parent_pos[i]]
    children: list[list[int]] = [[] for _ in range(T)]
    for i in range(1, T):
        children[parent_pos[i]].append(i)
    for ch in children:
        ch.sort(key=lambda i: tree.ranks[order[i]])
    depths = np.array([tree.depths[p] for p in order])
    return VerifyBatch(
        pool_idx=order,
        tokens=torch.tensor([tree.tokens[p] for p in order], dtype=torch.long, device=device),
        positions=torch.from_numpy(committed + depths).to(device),
        mask=torch.from_numpy(anc).to(device),
        parent_pos=parent_pos, children=children)
