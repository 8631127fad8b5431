"""What the kernels' one-call drafting (qforward.cpp's qf_draft_tree) is asked for: how it grows a
tree, which N it verifies, and how many children a call ranks. qforward.cpp declares the same
numbers (its TreeBudget and Explore enums, QT_TOPK), and the library lists them in qf_layout, which
qlib.py compares with these when it loads the library. Torch-free."""
from __future__ import annotations

from enum import IntEnum

TREE_TOPK = 16   # each drafted node's best children a call ranks as it runs (qforward.cpp's QT_TOPK)


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
