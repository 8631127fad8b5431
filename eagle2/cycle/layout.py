"""Laying the kept nodes of a draft tree out for one target forward: tokens, positions, the tree
attention mask (each node sees the committed context, its ancestors and itself) and each node's
children in rank order, which the acceptance rules walk. The kernels' one-call drafting lays its
tree out itself (the same columns); `lay_out` does it for a tree a Python policy grew."""
from __future__ import annotations

from functools import cached_property

import numpy as np
import torch


def lay_out(kept: np.ndarray, parents: np.ndarray, depths: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(order, parent_pos, mask) of a pool's kept nodes: their pool indices by depth then pool
    index (parents before children, the root first), each one's parent's verify position (-1 for
    the root) and the [T*T] ancestors-and-self mask, row by row."""
    idx = np.flatnonzero(kept)
    order = idx[np.argsort(depths[idx], kind="stable")].astype(np.int32)
    T = len(order)
    pos = np.full(len(kept), -1, np.int32)
    pos[order] = np.arange(T, dtype=np.int32)
    par = parents[order]
    parent_pos = np.where(par >= 0, pos[np.maximum(par, 0)], -1).astype(np.int32)
    anc = np.eye(T, dtype=np.uint8)
    for i in range(1, T):  # parents come first, so one pass builds ancestor rows
        anc[i] |= anc[parent_pos[i]]
    return order, parent_pos, anc.reshape(-1)


class VerifyBatch:
    """The kept nodes laid out for one target forward, read from a tree's columns (TreeArrays):
    its lists at once (the acceptance, the policy and the step's tokens read them), its tensors
    when first read (after a one-call cycle only a recorded trace reads them; building them every
    cycle cost about 0.04 ms). The entries they need are copied now: the kernels' arrays are their
    runner's, rewritten by its next call."""
    pool_idx: list[int]          # verify position -> pool index
    parent_pos: list[int]        # verify position of the parent (-1 for the root)
    ranks: list[int]             # each node's rank among its siblings
    token_list: list[int]        # the tokens as Python ints (what the acceptance walks and the commit read)

    def __init__(self, cols: dict[str, np.ndarray], T: int, committed: int, device):
        order = cols["order"][:T]
        self.pool_idx, self.parent_pos = order.tolist(), cols["parent_pos"][:T].tolist()
        self.ranks = cols["ranks"][order].tolist()
        self._tokens, self._depths = cols["tokens"][order], cols["depths"][order]
        self._mask, self._at = cols["mask"][: T * T].reshape(T, T).copy(), (committed, device)
        self.token_list = self._tokens.tolist()

    @cached_property
    def tokens(self) -> torch.Tensor:
        """[T] the nodes' tokens."""
        return torch.from_numpy(self._tokens.astype(np.int64)).to(self._at[1])

    @cached_property
    def positions(self) -> torch.Tensor:
        """[T] committed length + depth."""
        return torch.from_numpy(self._at[0] + self._depths.astype(np.int64)).to(self._at[1])

    @cached_property
    def mask(self) -> torch.Tensor:
        """[T, T] uint8, 1 where a row may attend: its ancestors and itself (bytes as the kernels'
        forward reads them; the eager forward reads them as bool)."""
        return torch.from_numpy(self._mask).to(self._at[1])

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
