"""The draft tree of one cycle: every node the policy generated (the pool), which ones the target
verifies (kept), and, after verification, what the target thought of them.

Columnar lists (one entry per pool node, index 0 = the root) keep it cheap to build in the hot
loop and trivial to serialise or turn into a table.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import torch


@dataclass
class DraftTree:
    tokens: list[int]
    parents: list[int]          # pool index of the parent; -1 for the root
    depths: list[int]
    ranks: list[int]            # rank among siblings by draft probability (0 = best)
    logp: list[float]           # log draft probability of the token given its parent
    values: list[float]         # log path value = sum of logp from the root
    levels: list[int]           # the draft call that proposed it (0 = the call on the root)
    kept: list[bool]            # selected for verification (root always)
    order: list[int] = field(default_factory=list)  # order of addition (policies that care)
    # filled by verification
    target_prob: list[float | None] = field(default_factory=list)
    accepted: list[bool] = field(default_factory=list)
    extra: dict = field(default_factory=dict)       # policy-specific facts (beam mass, ...)

    def __len__(self) -> int:
        return len(self.tokens)

    @property
    def n_kept(self) -> int:
        return sum(self.kept)

    def verify_order(self) -> list[int]:
        """Kept pool indices, root first, by depth then pool index (parents before children)."""
        idx = [i for i, k in enumerate(self.kept) if k]
        return sorted(idx, key=lambda i: (self.depths[i], i))

    def children(self, i: int, kept_only: bool = True) -> list[int]:
        ch = [j for j, p in enumerate(self.parents) if p == i and (self.kept[j] or not kept_only)]
        return sorted(ch, key=lambda j: self.ranks[j])

    def close_under_parents(self) -> None:
        for i in range(len(self.tokens)):
            if self.kept[i]:
                p = self.parents[i]
                while p >= 0 and not self.kept[p]:
                    self.kept[p] = True
                    p = self.parents[p]

    def to_dict(self) -> dict:
        return {k: getattr(self, k) for k in ("tokens", "parents", "depths", "ranks", "logp", "values",
                                              "levels", "kept", "order", "target_prob", "accepted", "extra")}

    @classmethod
    def from_dict(cls, d: dict) -> "DraftTree":
        return cls(**d)


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
