"""How the engine runs the target and the draft head: one interface each, one implementation per
backend, chosen once by load_bundle and held by the bundle (gpt-fast picks its one `forward` in
`main`; llama.cpp builds one graph whose backend dispatches by tensor type).

The backends, side by side (docs/layout.md):
- eager (`EagerTarget`, `EagerDraft`): the torch modules' own forward (llama.py, head.py, head3.py)
  in the bundle's dtype, on any device; on a CPU in fp32 the matmuls read prepacked copies of the
  frozen weights (llama.PackedWeight).
- q4_1 kernels (quantized.`KernelTarget`, `KernelDraft`): this project's C++ over the GGUF's
  blocks, on a CPU with AVX2; no fp32 copy of the target's weights is kept.

Decoding, drafting, timing, bench and profile call these and nothing else of a backend; to compare
two backends, load two bundles.
"""
from __future__ import annotations

from typing import Protocol

import torch

from .head import DraftHead
from .llama import KVCache, LlamaArgs, LlamaModel


class TargetForward(Protocol):
    """The target as the decoder runs it."""

    args: LlamaArgs
    device: torch.device
    description: str   # one line for the CLI and the page: what runs
    timing_id: str     # what a t(N) table measured on this forward is keyed by (calibration.py)

    def new_cache(self, max_len: int) -> KVCache:
        """A KV cache for one sequence, in the dtype this forward keeps it."""

    def prefill(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """The prompt [T] in causal order after the committed cache (K/V written, uncommitted):
        (what the draft head reads at every row [T, F], the last row's logits [vocab])."""

    def verify(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor,
               tree_mask: torch.Tensor | None = None, clock=None,
               best: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """N tree tokens after the committed cache under `tree_mask` [N, N] (ancestors and self,
        bool or uint8; None: causal), K/V written uncommitted: (what the draft head reads [N, F],
        logits [N, vocab] in fp32); with `best` ([N] int64 on the CPU) each row's argmax written
        into it (all that greedy decoding reads). `clock` (a cycle's PhaseClock): its verify_inputs
        phase closes where the forward's own computation starts."""

    def streamed_bytes(self) -> int:
        """The weight bytes one forward reads (the memory bound of a token: profile, prior t(N))."""

    def embedding(self) -> torch.Tensor:
        """The token embedding [vocab, dim] in fp32 (LANTERN's neighbours), made on demand where the
        backend keeps none."""


class DraftForward(Protocol):
    """The draft head as the drafting runs it."""

    description: str
    draft_ids: torch.Tensor | None   # the draft vocabulary as target ids (sorted), None: the target's
    vocab_size: int                  # the target's vocabulary
    # drafts a whole EAGLE-2 tree in one call (`draft_tree`, as quantized.KernelDraft does); else
    # the policies call `step` level by level
    drafts_trees: bool

    def new_cache(self, max_len: int) -> KVCache: ...

    def step(self, cache: KVCache, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor,
             start: int, tree_mask: torch.Tensor | None = None, k: int = 0,
             last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
        """Pairs (features [T, F], tokens [T]) written at cache slots start..start+T-1: (g [T, D],
        log-probs over the draft vocabulary [T, V_draft], and with k > 0 each row's k best
        (log-probs, target ids) [T, k'], k' = min(k, V_draft), best first; else None). Slots before
        cache.length are visible to every row, the rest follow `tree_mask` [T, start + T - length]
        (None: causal, start == length). last_only: the log-probs and top k of the last row alone
        ([1, ..]: absorbing a context, a prompt's thousands of rows, reads only its last)."""

    def to_target_ids(self, idx: torch.Tensor) -> torch.Tensor:
        """Draft-vocabulary indices as target token ids."""


class EagerTarget:
    """TargetForward as the LlamaModel's own forward."""

    def __init__(self, model: LlamaModel, packed: bool):
        self.model, self.args = model, model.args
        w = model.lm_head.weight
        self.device, self.dtype = w.device, w.dtype
        dtype = str(self.dtype).removeprefix("torch.")
        self.description = f"eager forward ({dtype}{', prepacked weights' if packed else ''})"
        self.timing_id = dtype + ("|packed" if packed else "")

    def new_cache(self, max_len: int) -> KVCache:
        return self.model.new_cache(max_len)

    def prefill(self, cache, tokens, positions):
        feats, head_feats = self.model.forward_draft(cache, tokens, positions)
        return head_feats, self.model.logits(feats[-1])

    def verify(self, cache, tokens, positions, tree_mask=None, clock=None, best=None):
        if clock is not None:
            clock.lap("verify_inputs")
        feats, head_feats = self.model.forward_draft(cache, tokens, positions, tree_mask)
        logits = self.model.logits(feats)
        if best is not None:
            best.copy_(logits.argmax(-1))
        return head_feats, logits

    def streamed_bytes(self) -> int:
        return sum(p.numel() * p.element_size() for p in self.model.parameters())

    def embedding(self) -> torch.Tensor:
        return self.model.embed_tokens.weight.detach().float()


class EagerDraft:
    """DraftForward as the head module's own forward (its matmuls through whatever copies its
    Linears were prepared with at load: llama.PackedWeight, quantized.Q8Weight)."""

    drafts_trees = False

    def __init__(self, head: DraftHead, what: str):
        self.head = head
        self.draft_ids, self.vocab_size = head.draft_ids, head.args.vocab_size
        self.description = f"draft head eager ({what})"

    def new_cache(self, max_len: int) -> KVCache:
        return self.head.new_cache(max_len)

    def step(self, cache, features, tokens, positions, start, tree_mask=None, k=0, last_only=False):
        return self.head.forward_draft(cache, features, tokens, positions, start, tree_mask, k, last_only)

    def to_target_ids(self, idx):
        return self.head.to_target_ids(idx)
