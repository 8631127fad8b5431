"""The draft tree of one cycle: every node the policy generated (the pool), which ones the target
verifies (kept), and, after verification, what the target thought of them.

Columnar lists (one entry per pool node, index 0 = the root) keep it cheap to build in the hot
loop and trivial to serialise or turn into a table. Torch-free: traces hold trees, and the page
replays traces without a model.
"""
from __future__ import annotations

from dataclasses import dataclass, field

from .records import TreeRecord, record_from_dict
from .schema import FieldError, checked, type_name


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
    # what the policy did (filled by drafting)
    draft_calls: int = 0                            # draft-head calls this cycle, the root's included
    beam: list[list[int]] = field(default_factory=list)    # EAGLE-2 family: nodes expanded at each level
    beam_mass: list[float] = field(default_factory=list)   # log of the draft mass each beam holds
    sampled_drafts: bool = False                    # siblings were sampled from q (SpecInfer's rule applies)
    record: TreeRecord | None = None                # the policy's own typed facts (records.py)
    # runtime only, never serialised: q at each parent of sampled siblings (dense [V] tensors)
    draft_dists: dict = field(default_factory=dict, repr=False, compare=False, metadata={"runtime": True})

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
        d = {k: getattr(self, k) for k in COLUMNS}
        d["record"] = self.record.to_dict() if self.record is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "tree") -> "DraftTree":
        """The tree a trace stored, each field checked against its type (a FieldError, a
        UserError, names the first that is not)."""
        if not isinstance(d, dict):
            raise FieldError(f"{where}: expected dict, got {type_name(d)}")
        old = d.get("extra") or {}  # schema v1 kept these in a free dict
        if not isinstance(old, dict):
            raise FieldError(f"{where}.extra: expected dict, got {type_name(old)}")
        cols = {**{k: old[k] for k in COLUMNS if k in old}, **{k: v for k, v in d.items() if k != "extra"}}
        cols = checked(cls, cols, where, skip=("record",))
        cols["record"] = record_from_dict(cols.get("record"), f"{where}.record")
        return cls(**cols)


COLUMNS = ("tokens", "parents", "depths", "ranks", "logp", "values", "levels", "kept", "order", "target_prob",
           "accepted", "draft_calls", "beam", "beam_mass", "sampled_drafts")
