"""The draft tree of one cycle as a trace keeps it: every node the policy generated (the pool),
which ones the target verified (kept), and what the target thought of them.

Columnar lists (one entry per pool node, index 0 = the root), trivial to serialise or turn into a
table; a cycle's own tree is tree_arrays.TreeArrays, made into a DraftTree only where a trace
records it. Torch-free: traces hold trees, and the page replays traces without a model. The types are plain dataclasses; trace.py reads and writes them
with pydantic, checking every field of a file against its annotation (CHECKED) and a tree read
from a file for the shape the figures draw (DraftTree's validator).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Generic, TypeVar

from pydantic import model_validator

from .checked import CHECKED, broken

# the columns: one entry per pool node, or (the second) that or none at all (not filled)
NODE_COLUMNS = ("tokens", "parents", "depths", "ranks", "logp", "values", "levels", "kept")
NODE_COLUMNS_OR_EMPTY = ("order", "target_prob", "accepted")


def log_mass(values: list[float]) -> float:
    """log(sum(exp(values))) of a beam's few values (a beam's share of the draft's mass)."""
    top = max(values)
    return top + math.log(sum(math.exp(x - top) for x in values))


@dataclass
class TreeRecord:
    """The typed facts one tree policy records about a tree, beside the tree's common columns. Each
    policy defines its own subclass next to itself, with a first field `kind: Literal["..."]` that
    tags it in trace files (the policy registry lists every record type a trace may hold)."""
    __pydantic_config__ = CHECKED

    def departure(self) -> dict | None:
        """Lossy acceptance only: {"rule", "relaxed_tokens", "max_shift"}; None when exact."""
        return None


R = TypeVar("R")   # the record type a tree carries (a union of every policy's when a trace is read)


@dataclass
class DraftTree(Generic[R]):
    __pydantic_config__ = CHECKED
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
    # what the policy did (filled by drafting)
    draft_calls: int = 0                            # draft-head calls this cycle, the root's included
    beam: list[list[int]] = field(default_factory=list)    # beam-expanding policies: nodes expanded per level
    beam_mass: list[float] = field(default_factory=list)   # log of the draft mass each beam holds
    sampled_drafts: bool = False                    # siblings were sampled from q (SpecInfer's rule applies)
    record: R | None = None                         # the policy's own typed facts (a TreeRecord)

    @model_validator(mode="after")
    def _one_tree(self):
        """Read from a file: a root, every column one entry per node, each parent an earlier node
        (the figures lay the tree out by walking parents; a loop would never end)."""
        n = len(self.tokens)
        if n == 0:
            raise broken(("tokens",), "a tree holds at least its root")
        for k in NODE_COLUMNS + NODE_COLUMNS_OR_EMPTY:
            m = len(getattr(self, k))
            if m != n and not (m == 0 and k in NODE_COLUMNS_OR_EMPTY):
                raise broken((k,), f"{m} entries for the tree's {n} nodes")
        if self.parents[0] != -1:
            raise broken(("parents", 0), f"the root's parent is -1, not {self.parents[0]}")
        bad = next((i for i, p in enumerate(self.parents) if i and not 0 <= p < i), None)
        if bad is not None:
            raise broken(("parents", bad), f"node {bad}'s parent is not an earlier node ({self.parents[bad]})")
        return self

    def __len__(self) -> int:
        return len(self.tokens)
