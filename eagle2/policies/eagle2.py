"""EAGLE-2's context-aware dynamic tree (docs/algorithms.md §4): expand the best nodes
level by level, then rerank the whole pool by path value."""
from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import torch

from ..cycle.drafting import HeadRunner
from ..cycle.tree import TreeRecord
from ..cycle.tree_arrays import TreeArrays
from ..cycle.tree_builder import TreeBuilder
from ..model.tree_modes import TREE_TOPK, BudgetInputs, TreeBudget, TreeCounts
from .base import TreePolicy, check_int


@dataclass
class Eagle2Policy(TreePolicy):
    """EAGLE-2: expand the top_k highest-value nodes per level for `depth` levels, then keep the
    total_tokens - 1 highest-value nodes of the whole pool (docs/algorithms.md §4)."""
    total_tokens: int = 60
    depth: int = 5
    top_k: int = 10
    name: ClassVar[str] = "eagle2"

    def validate(self) -> None:
        for key, lo, hi in (("total_tokens", 1, 1024), ("depth", 1, 32), ("top_k", 1, 64)):
            check_int("", key, getattr(self, key), lo, hi)

    def stop_early(self, level: int, beam_values: torch.Tensor, tree: TreeBuilder) -> bool:
        """Called before draft call `level + 1`; True ends the expansion. EAGLE-2 always expands to
        full depth (DDD overrides this)."""
        return False

    def begin(self, runner: HeadRunner):
        """The cycle's own state that the hooks below read (the budget's clock and tables), made
        when the cycle's drafting starts and gone with it; None: EAGLE-2 needs none."""
        return None

    def expand_width(self, level: int, beam_values: torch.Tensor, tree: TreeBuilder, cyc=None) -> int:
        """Called before draft call `level + 1` with the beam's values (best first): how many of the
        best beam nodes to expand, 0 ending the expansion. EAGLE-2 expands the whole beam unless
        stop_early says stop (the auto budget chooses the width from measured costs)."""
        return 0 if self.stop_early(level, beam_values, tree) else len(beam_values)

    def new_record(self) -> TreeRecord | None:
        """The policy's typed record for a new tree (variants that log their decisions)."""
        return None

    def native_budget(self) -> TreeBudget | None:
        """How the kernels' one-call drafting runs this policy (quantized.KernelDraft.draft_tree's
        budget: EAGLE-2 as it is), or None where only this file's loop does (a variant's hooks)."""
        return TreeBudget.EAGLE2 if type(self) is Eagle2Policy else None

    def native_tree(self, runner: HeadRunner) -> bool:
        return runner.drafts_trees and self.top_k <= TREE_TOPK and self.native_budget() is not None

    def draft(self, runner: HeadRunner, root: int) -> TreeArrays:
        """The tree, in one call of the kernels where the draft head runs there and this policy's
        rule is theirs (the same tree: tests/test_native_cycle.py), else level by level below."""
        cyc = self.begin(runner)
        if self.native_tree(runner):
            return self.draft_native(runner, root, cyc)
        return self.draft_levels(runner, root, cyc)

    def draft_native(self, runner: HeadRunner, root: int, cyc) -> TreeArrays:
        tree, counts = runner.draft_tree(root, self.top_k, self.depth, self.total_tokens, self.native_inputs(cyc))
        self.native_learn(tree, counts, cyc)
        return tree

    def native_inputs(self, cyc) -> BudgetInputs | None:
        """What the kernels' tree call reads of this policy this cycle (None: EAGLE-2 as it is)."""
        return None

    def native_learn(self, tree: TreeArrays, counts: TreeCounts, cyc) -> None:
        """What the policy keeps of the kernels' tree (its record, what it learns); EAGLE-2 none."""

    def draft_levels(self, runner: HeadRunner, root: int, cyc) -> TreeArrays:
        """EAGLE-2's loop in Python: a draft call per level, the hooks deciding (the reference
        the kernels' drafting is tested against)."""
        k = self.top_k
        b = TreeBuilder(root)
        b.record = self.new_record()
        v, ids = runner.topk(runner.root_logp, k)
        kk = v.numel()
        beam = b.add(ids.tolist(), [0] * kk, [1] * kk, list(range(kk)), v.tolist(), v.tolist(), level=0)
        beam_vals = v
        beam_g = runner.root_g.expand(kk, -1)
        beam_parent_slots = [-1] * kk
        b.beam.append(beam)
        for level in range(1, self.depth + 1):
            w = self.expand_width(level, beam_vals, b, cyc)
            if w == 0:
                break
            if w < len(beam):  # the w best of the beam (it is in value order)
                beam, beam_vals, beam_g, beam_parent_slots = beam[:w], beam_vals[:w], beam_g[:w], beam_parent_slots[:w]
                b.beam[-1] = beam
            g, lp, slots = runner.run([b.tokens[i] for i in beam], beam_g, beam_parent_slots,
                                      [b.depths[i] for i in beam])
            cv, cid = runner.topk(lp, k)                       # [beam, k]
            cand_vals = beam_vals[:, None] + cv                # path values of all children
            nb, kc = cand_vals.shape
            idx = b.add(cid.flatten().tolist(), [beam[r] for r in range(nb) for _ in range(kc)],
                        [b.depths[beam[0]] + 1] * (nb * kc), list(range(kc)) * nb,
                        cv.flatten().tolist(), cand_vals.flatten().tolist(), level=level)
            if level == self.depth:
                break
            # the level's top k by value, ties to the earlier (the kernels' order)
            flat = cand_vals.flatten()
            order = np.argsort(-flat.float().cpu().numpy(), kind="stable")[: min(k, nb * kc)]
            sel = torch.from_numpy(order).to(flat.device)
            rows = sel // kc
            beam = [idx[j] for j in sel.tolist()]
            beam_vals = cand_vals.flatten()[sel]
            beam_g = g[rows]
            beam_parent_slots = [slots[r] for r in rows.tolist()]
            b.beam.append(beam)
        b.draft_calls = runner.calls
        self.keep(b, cyc)
        return b.build()

    def keep(self, t: TreeBuilder, cyc=None) -> None:
        """Mark the nodes the target verifies (EAGLE-2: the best total_tokens - 1 of the pool)."""
        self.rerank(t, self.total_tokens)

    @staticmethod
    def rerank(t: TreeBuilder, total_tokens: int) -> None:
        """Keep the total_tokens-1 best non-root nodes by value (ties: shallower, then earlier),
        then close the set under parents."""
        n = len(t.tokens) - 1
        keep = min(total_tokens - 1, n)
        if keep > 0:
            vals = np.asarray(t.values[1:])
            depths = np.asarray(t.depths[1:])
            order = np.lexsort((np.arange(n), depths, -vals))[:keep]
            for j in order:
                t.kept[j + 1] = True
        t.close_under_parents()
