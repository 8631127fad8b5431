"""EAGLE-1's static tree (docs/algorithms.md §3): the same shape every cycle."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import ClassVar

import torch

from ..cycle.drafting import HeadRunner
from ..cycle.tree_arrays import TreeArrays
from ..cycle.tree_builder import TreeBuilder
from ..errors import check
from .base import TreePolicy

# EAGLE-1's default shape (docs/algorithms.md §3): 25 nodes as rank paths.
EAGLE1_SHAPE = [
    [0], [1], [2], [3], [0, 0], [0, 1], [0, 2], [1, 0], [1, 1], [2, 0], [2, 1], [3, 0],
    [0, 0, 0], [0, 0, 1], [0, 0, 2], [0, 1, 0], [0, 1, 1], [0, 2, 0], [0, 2, 1], [1, 0, 0],
    [0, 0, 0, 0], [0, 0, 0, 1], [0, 0, 0, 2], [0, 0, 0, 0, 0], [0, 0, 0, 0, 1],
]


@dataclass
class StaticPolicy(TreePolicy):
    """EAGLE-1: a fixed tree of rank paths; D runs level by level on the non-leaf nodes."""
    shape: list = field(default_factory=lambda: [list(p) for p in EAGLE1_SHAPE])
    name: ClassVar[str] = "static"
    tree_params: ClassVar[tuple] = ()   # the shape is fixed: N, depth and top-k do not apply

    def validate(self) -> None:
        check(len(self.shape) >= 1, "The static tree needs at least one node.")
        paths = {tuple(p) for p in self.shape}
        for p in self.shape:
            check(len(p) >= 1 and all(isinstance(r, int) and r >= 0 for r in p),
                  f"Static tree path {p} must be a non-empty list of ranks >= 0.")
            check(len(p) == 1 or tuple(p[:-1]) in paths, f"Static tree path {p} has no parent path {p[:-1]}.")

    @property
    def total_tokens(self) -> int:
        return len(self.shape) + 1

    def params(self) -> dict:
        return {"total_tokens": self.total_tokens}

    def draft(self, runner: HeadRunner, root: int) -> TreeArrays:
        b = TreeBuilder(root)
        by_depth: dict[int, list[tuple]] = {}
        for p in sorted({tuple(p) for p in self.shape}, key=lambda p: (len(p), p)):
            by_depth.setdefault(len(p), []).append(p)
        node_of = {(): 0}
        g_of = {(): runner.root_g}
        slot_of = {(): -1}
        logp_of = {(): runner.root_logp}
        value_of = {(): 0.0}
        for d in sorted(by_depth):
            paths = by_depth[d]
            # children of each parent path at this depth, by rank
            need = {}
            for p in paths:
                need[p[:-1]] = max(need.get(p[:-1], 0), p[-1] + 1)
            topv, topi = {}, {}
            for par, n in need.items():
                v, i = runner.topk(logp_of[par], n)
                topv[par], topi[par] = v.tolist(), i.tolist()
            new = []
            for p in paths:
                par, r = p[:-1], p[-1]
                if r >= len(topv[par]):
                    continue
                lp = topv[par][r]
                value_of[p] = value_of[par] + lp
                (idx,) = b.add([topi[par][r]], [node_of[par]], [d], [r], [lp], [value_of[p]],
                               level=d - 1, kept=True)
                node_of[p] = idx
                new.append(p)
            # run D on the nodes of this depth that have children in the shape
            parents = [p for p in new if any(q[:-1] == p for q in by_depth.get(d + 1, []))]
            if parents:
                g, lp, slots = runner.run([b.tokens[node_of[p]] for p in parents],
                                          torch.stack([g_of[p[:-1]] for p in parents]),
                                          [slot_of[p[:-1]] for p in parents], [d] * len(parents))
                for j, p in enumerate(parents):
                    g_of[p], logp_of[p], slot_of[p] = g[j], lp[j], slots[j]
        b.draft_calls = runner.calls
        return b.build()
