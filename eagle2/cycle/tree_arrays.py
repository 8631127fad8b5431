"""A draft tree as arrays: what the kernels' one-call drafting (quantized.KernelDraft.draft_tree)
fills, one column per node property and the verification's layout beside them. The cycle reads
it without a loop per node (the kept count, the layout for the target, the commit); the page's
DraftTree, lists that the trace and the figures read, is made from it only when a trace records
the cycle (`to_tree`).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
import torch

from .layout import VerifyBatch
from .tree import DraftTree, TreeRecord, log_mass


@dataclass
class TreeArrays:
    cols: dict[str, np.ndarray]   # KernelDraft.tree_arrays' columns, the first n entries filled
    n: int                        # nodes in the pool, the root included
    n_beams: int                  # levels whose beam is recorded (the root's children's first)
    draft_calls: int              # draft-head calls this cycle, the root's included
    n_verify: int                 # nodes verified (kept), the root included
    record: TreeRecord | None = None
    sampled_drafts: bool = False  # the kernels' trees are deterministic (top-k): the top-k rule applies
    draft_dists: dict = field(default_factory=dict)
    _tree: DraftTree | None = field(default=None, repr=False)

    @property
    def n_kept(self) -> int:
        return self.n_verify

    @property
    def values(self) -> np.ndarray:
        """Every pool node's path value (log), as DraftTree.values holds them."""
        return self.cols["values"][: self.n]

    @property
    def root(self) -> int:
        return int(self.cols["tokens"][0])

    def layout(self, committed: int, device) -> VerifyBatch:
        """cycle/layout.layout's batch, read from the arrays the kernels laid out."""
        return ArraysBatch(self.cols, self.n_verify, committed, device)

    def to_tree(self) -> DraftTree:
        """The tree as the trace and the page read it (made once)."""
        if self._tree is None:
            c, n = self.cols, self.n
            ends = np.cumsum(c["beam_len"][: self.n_beams])
            beams = [c["beam"][a:b].tolist() for a, b in zip(np.concatenate([[0], ends[:-1]]), ends)]
            values = c["values"][:n].tolist()
            self._tree = DraftTree(
                tokens=c["tokens"][:n].tolist(), parents=c["parents"][:n].tolist(), depths=c["depths"][:n].tolist(),
                ranks=c["ranks"][:n].tolist(), logp=c["logp"][:n].tolist(), values=values,
                levels=c["levels"][:n].tolist(), kept=c["kept"][:n].astype(bool).tolist(), order=list(range(n)),
                draft_calls=self.draft_calls, beam=beams,
                beam_mass=[log_mass([values[i] for i in b]) for b in beams], record=self.record)
        return self._tree


class ArraysBatch(VerifyBatch):
    """layout's batch off the kernels' arrays: its lists at once (the acceptance, the policy and
    the step's tokens read them), its tensors when first read (after a one-call cycle only a
    recorded trace reads them; building them every cycle cost about 0.04 ms). The entries they
    need are copied now: the arrays are the runner's, rewritten by its next call."""

    def __init__(self, cols: dict[str, np.ndarray], T: int, committed: int, device):
        order = cols["order"][:T]
        self.pool_idx, self.parent_pos = order.tolist(), cols["parent_pos"][:T].tolist()
        self.ranks = cols["ranks"][order].tolist()
        self._tokens, self._depths = cols["tokens"][order], cols["depths"][order]
        self._mask, self._at = cols["mask"][: T * T].reshape(T, T).astype(bool), (committed, device)
        self.token_list = self._tokens.tolist()

    @cached_property
    def tokens(self) -> torch.Tensor:
        return torch.from_numpy(self._tokens).to(self._at[1])

    @cached_property
    def positions(self) -> torch.Tensor:
        return torch.from_numpy(self._at[0] + self._depths.astype(np.int64)).to(self._at[1])

    @cached_property
    def mask(self) -> torch.Tensor:
        return torch.from_numpy(self._mask).to(self._at[1])
