"""The draft tree of one cycle: every node the policy generated (the pool), which ones the target
verifies (kept), and, after verification, what the target thought of them.

Columnar lists (one entry per pool node, index 0 = the root) keep it cheap to build in the hot
loop and trivial to serialise or turn into a table. Torch-free: traces hold trees, and the page
replays traces without a model. The types are plain dataclasses; trace.py reads and writes them
with pydantic, checking every field of a file against its annotation (CHECKED).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Annotated, Generic, TypeVar

from pydantic import Field

from .checked import CHECKED


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
    # runtime only, never read from or written to files: q at each parent of sampled siblings (dense [V] tensors)
    draft_dists: Annotated[dict, Field(exclude=True)] = field(default_factory=dict, init=False, repr=False,
                                                              compare=False)

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
