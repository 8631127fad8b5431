"""A prompt's forward before the first token (cycle 0's work), which the decoders of one bundle
may share (the race's three prefill once), and the check that a prompt leaves the model room to
decode."""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import check
from ..model.activity import DECODING
from ..model.llama import KVCache
from ..model.loading import Bundle
from ..phases import PhaseClock


def checked_ids(bundle, ids: list[int]) -> list[int]:
    """A prompt's token ids if the model can decode after them, else one clear line (UserError)."""
    check(len(ids) >= 1, "The prompt is empty: type something first.")
    ctx = bundle.args.max_positions
    check(len(ids) + 2 <= ctx,
          f"The prompt is {len(ids)} tokens long; this model's context is {ctx} tokens. Shorten it.")
    return ids


@dataclass(frozen=True)
class Prefill:
    """A prompt's target forward (cycle 0's work before the first token is chosen): the cache that
    holds its K/V (uncommitted: length 0), the features the head reads, the last row's logits and
    the seconds it took per phase. Decoders of the same bundle may share one (the race's three
    prefill once): each copies the K/V into its own cache and chooses its first token itself."""
    bundle: Bundle
    ids: tuple[int, ...]
    cache: KVCache
    feats: torch.Tensor
    logits: torch.Tensor
    seconds: dict[str, float]

    def copy(self, into: KVCache) -> KVCache:
        """`into` holding this prompt's K/V (still uncommitted, as the forward left its own)."""
        n = len(self.ids)
        into.k[:, :, :, :n] = self.cache.k[:, :, :, :n]
        into.v[:, :, :, :n] = self.cache.v[:, :, :, :n]
        return into


@DECODING
def prefill(bundle: Bundle, ids: list[int], cache: KVCache, clock: PhaseClock) -> Prefill:
    """The target's forward over the prompt's ids into `cache` (empty), timed on `clock` (a
    decoder's): what Decoder.start runs, or is given to share."""
    dev = bundle.device
    before = dict(clock.spent)
    tokens = torch.tensor(ids, dtype=torch.long, device=dev)
    clock.lap("verify_inputs")
    feats, logits = bundle.forward.prefill(cache, tokens, torch.arange(len(ids), device=dev))
    clock.lap("target_forward")
    seconds = {p: clock.spent[p] - before[p] for p in ("verify_inputs", "target_forward")}
    return Prefill(bundle, tuple(ids), cache, feats, logits, seconds)
