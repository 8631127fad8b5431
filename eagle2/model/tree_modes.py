"""What crosses into the kernels' one-call drafting (qforward.cpp's qf_draft_tree) and what comes
back: how it grows a tree, which N it verifies and how many children a call ranks (qforward.cpp
declares the same numbers, its TreeBudget and Explore enums and QT_TOPK, and the library lists them
in qf_layout, which qlib.py compares with these when it loads the library), the auto budget's
inputs for one cycle, and the counts a call reports. Torch-free."""
from __future__ import annotations

from dataclasses import dataclass
from enum import IntEnum

import numpy as np

# each drafted node's best children a draft call ranks as it runs (qforward.cpp's QT_TOPK; the eager
# head ranks as many): a policy asking for more ranks them with torch, and drafts level by level
TREE_TOPK = 16


class TreeBudget(IntEnum):
    """How a tree grows (QTreeIn.budget)."""
    EAGLE2 = 0   # EAGLE-2: every beam node expanded for `depth` levels, the total_tokens - 1 best kept
    AUTO = 1     # the auto budget: each level's width chosen by rate, and N by rate
    AUTO_N = 2   # the auto budget choosing N only (every beam node expanded, as EAGLE-2)


class Explore(IntEnum):
    """Which N the auto budget verifies this cycle (QTreeIn.explore): now and then another than the
    best, to re-measure sizes it would not choose."""
    BEST = 0     # the N of the best rate
    DOUBLE = 1   # twice it
    HALF = 2     # half of it


class CycleStage(IntEnum):
    """Which part of the kernels' one-call cycle (qf_cycle) a nonzero return came from
    (QCycleOut.stage): each part's codes are its own call's."""
    NONE = 0
    TREE = 1      # the tree's drafting (qf_draft_tree)
    FORWARD = 2   # the target's forward (qf_forward)
    ABSORB = 3    # the head absorbing the accepted pairs (qf_draft)
    CYCLE = 4     # the cycle's own check: its arrays or a cache too small for the tree


@dataclass(frozen=True)
class BudgetInputs:
    """The auto budget's data for one cycle's call (QTreeIn's budget fields; policies/auto.py builds
    it): everything its choices depend on besides the head's outputs. The call reads them only; the
    seconds each level took come back in the tree's `level_s` for the policy to learn prices from."""
    mode: TreeBudget
    tn: np.ndarray            # [>= total_tokens] t(N) for N = 1, 2, ...
    rank_prob: np.ndarray     # [>= top_k] a child's predicted draft probability by rank
    prices: np.ndarray        # [max_width + 1] a head call's price by width (NaN: not measured yet)
    call_guess: float         # a call's price before any width was measured
    odds: float               # the acceptance odds' multiplier calibrating node values (1: none)
    explore_depth: bool       # one call at least below the root's children this cycle
    explore: Explore          # which N to verify: the best, twice it or half of it


@dataclass(frozen=True)
class TreeCounts:
    """What one call reports beside the tree's arrays (QTreeOut's counts)."""
    n: int                    # nodes in the pool, the root included
    n_beams: int              # beams recorded (one per level expanded, and the root's)
    draft_calls: int          # head calls, the root's reading included
    n_verify: int             # rows the target verifies (the root and the kept nodes)
    best_n: int               # the budget's best N (total_tokens for EAGLE-2)
    expected: float           # the budget's expected tokens at best_n (1 for EAGLE-2)
    head_s: float             # seconds of the call spent in the head's steps
