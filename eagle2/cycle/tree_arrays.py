"""The draft tree of one cycle, for every policy and backend: one column per node property and the
verification's layout beside them, as the kernels' one-call drafting (quantized.KernelDraft.
draft_tree) fills them and a Python policy's TreeBuilder builds them. The cycle reads it without a
loop per node (the kept count, the layout for the target, the commit); the page's DraftTree, lists
that the trace and the figures read, is made from it only when a trace records the cycle
(`to_tree`).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from .layout import VerifyBatch
from .tree import DraftTree, TreeRecord, log_mass


@dataclass
class TreeArrays:
    cols: dict[str, np.ndarray]   # KernelDraft.tree_arrays' columns (or TreeBuilder's), the first n entries filled
    n: int                        # nodes in the pool, the root included
    n_beams: int                  # levels whose beam is recorded (the root's children's first)
    draft_calls: int              # draft-head calls this cycle, the root's included
    n_verify: int                 # nodes verified (kept), the root included
    record: TreeRecord | None = None
    sampled_drafts: bool = False  # siblings sampled from q (SpecInfer's rule); the kernels' are top-k
    draft_dists: dict = field(default_factory=dict)   # q at each parent of sampled siblings (pool index -> [V])
    _tree: DraftTree | None = field(default=None, repr=False)

    @classmethod
    def filled(cls, cols: dict[str, np.ndarray], counts) -> "TreeArrays":
        """The tree a kernels' call filled into `cols`, by the counts it returned (TreeCounts)."""
        return cls(cols, counts.n, counts.n_beams, counts.draft_calls, counts.n_verify)

    def __len__(self) -> int:
        return self.n

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
        """The kept nodes laid out for the target's forward after `committed` tokens."""
        return VerifyBatch(self.cols, self.n_verify, committed, device)

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
                draft_calls=self.draft_calls, beam=beams, sampled_drafts=self.sampled_drafts,
                beam_mass=[log_mass([values[i] for i in b]) for b in beams], record=self.record)
        return self._tree
