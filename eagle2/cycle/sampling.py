"""Turning target logits into the distribution we sample from: temperature, top-k, top-p.

Plain decoding and every verification rule call the same function, so speculative sampling
targets exactly the distribution plain sampling draws from.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from ..errors import check


@dataclass
class SamplingParams:
    temperature: float = 0.0   # 0 = greedy
    top_p: float = 1.0
    top_k: int = 0             # 0 = off
    seed: int | None = None

    def validate(self) -> None:
        check(isinstance(self.temperature, (int, float)) and 0.0 <= self.temperature <= 10.0,
              f"temperature must be in [0, 10] (got {self.temperature!r}); 0 means greedy.")
        check(isinstance(self.top_p, (int, float)) and 0.0 < self.top_p <= 1.0,
              f"top-p must be in (0, 1] (got {self.top_p!r}).")
        check(isinstance(self.top_k, int) and self.top_k >= 0,
              f"top-k sampling must be an integer >= 0 (got {self.top_k!r}); 0 disables it.")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


def probs_from_logits(logits: torch.Tensor, sp: SamplingParams) -> torch.Tensor:
    """[..., V] logits -> [..., V] float32 probabilities after temperature / top-k / top-p."""
    logits = logits.float()
    if sp.greedy:
        return torch.softmax(logits, dim=-1)
    logits = logits / sp.temperature
    if sp.top_k and sp.top_k < logits.shape[-1]:
        kth = logits.topk(sp.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    probs = torch.softmax(logits, dim=-1)
    if sp.top_p < 1.0:
        sp_, si = probs.sort(dim=-1, descending=True)
        cum = sp_.cumsum(-1)
        drop = (cum - sp_) >= sp.top_p  # keep the smallest prefix whose mass reaches top_p
        sp_ = sp_.masked_fill(drop, 0.0)
        probs = torch.zeros_like(probs).scatter(-1, si, sp_)
        probs = probs / probs.sum(-1, keepdim=True)
    return probs


def sample(probs: torch.Tensor, gen: torch.Generator | None) -> int:
    if gen is not None and probs.device != gen.device:  # decoders seed a CPU generator, also on CUDA
        probs = probs.to(gen.device)
    return int(torch.multinomial(probs, 1, generator=gen).item())


def choose(logits: torch.Tensor, sp: SamplingParams, gen: torch.Generator | None) -> int:
    """Next token from one row of logits, greedy or sampled."""
    if sp.greedy:
        return int(logits.argmax(-1).item())
    return sample(probs_from_logits(logits, sp), gen)
