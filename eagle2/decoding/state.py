"""What a speculative decoder carries between cycles and what one cycle produced: `DecodeState`,
one sequence between cycles (docs/algorithms.md §2), with the head's `Reading` of its context, and
`Cycle`, a draft -> verify -> accept's tree, batch and verdict (decoder.py's `speculate` makes both).
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..cycle.layout import VerifyBatch
from ..cycle.tree import DraftTree
from ..cycle.tree_arrays import TreeArrays
from ..model.llama import KVCache
from ..phases import PHASES

NO_TIME = dict.fromkeys(PHASES, 0.0)   # every phase at 0 s (eagle2/phases.py)


@dataclass(frozen=True)
class Reading:
    """The draft head's reading of the context: its predicted feature at the root, the log-probs
    of the root's children and their best TREE_TOPK ranked, and the seconds absorbing took (they
    count as the next cycle's draft_head phase, whenever the absorbing ran)."""
    g: torch.Tensor
    logp: torch.Tensor
    top: tuple | None
    seconds: float
    charged: bool = False   # its seconds already counted in the cycle that took it (the kernels' one call)


@dataclass(frozen=True)
class DecodeState:
    """One sequence between cycles. The KV caches are views (own `length`, shared tensors): a
    cycle writes only slots at or past a state's lengths, so the state it read stays what it was;
    a preview's writes there are scratch, overwritten before they are read. The random streams are
    the sequence's own and advance with each committing cycle (a preview draws from its own)."""
    prompt_ids: tuple[int, ...]
    cache: KVCache | None                     # target K/V of x_0..x_{L-1}; None once released
    hcache: KVCache | None                    # head K/V of the absorbed pairs
    root: int
    pending: tuple[torch.Tensor, list[int]] | None   # (features [n, D], next tokens) not absorbed yet
    reading: Reading | None                   # set by absorbing pending, cleared by a commit
    accept_gen: torch.Generator               # the target's samples (acceptance, bonus, plain tokens)
    draft_gen: torch.Generator                # policies that sample their drafts (DySpec)
    generated: tuple[int, ...] = ()
    cycle: int = 0                            # the next step's number (prefill is cycle 0)
    target_forwards: int = 0
    draft_calls: int = 0
    spent: tuple[tuple[str, float], ...] = tuple(NO_TIME.items())   # seconds per phase, every cycle
    finished: str | None = None               # "eos", "max_new_tokens", "context" once done


@dataclass
class Cycle:
    """What one draft -> verify -> accept produced."""
    drafted: TreeArrays          # the policy's tree
    root: int
    vb: VerifyBatch
    feats: torch.Tensor          # what the draft head reads at every verified node (forward.verify)
    logits: torch.Tensor
    path_pos: list[int]          # accepted verify positions (root excluded)
    bonus: int
    timings: dict

    @property
    def tree(self) -> DraftTree:
        """The tree as the trace and the page read it (its columns made into lists once)."""
        return self.drafted.to_tree()

    @property
    def path_tokens(self) -> list[int]:
        toks = self.vb.token_list
        return [toks[p] for p in self.path_pos]

    @property
    def accepted_pool(self) -> list[int]:
        """The accepted nodes as pool indices."""
        return [self.vb.pool_idx[p] for p in self.path_pos]
