"""The lossless rules for accepting a path of the draft tree against the target
(docs/algorithms.md §7): the output is exactly the target's, greedy or sampled.

All rules walk from the root; `children[i]` lists verify positions of node i's children in rank
(or sampling) order, `logits[i]` is the target's output at node i; the greedy rule reads only each
node's argmax (`best`, which the q4_1 forward computes beside its logits).
"""
from __future__ import annotations

import torch

from .sampling import SamplingParams, probs_from_logits, sample


def greedy(tokens: list[int], parent_pos: list[int], best: list[int]) -> tuple[list[int], int]:
    """Accept a child iff it equals the target's argmax at its parent (`best[i]`: node i's).
    Children are distinct tokens, so the accepted path is unique. Returns (accepted verify
    positions, bonus token)."""
    node, path, T = 0, [], len(tokens)
    while True:
        want = best[node]
        nxt = next((c for c in range(node + 1, T) if parent_pos[c] == node and tokens[c] == want), None)
        if nxt is None:
            return path, want
        path.append(nxt)
        node = nxt


def topk_sampling(tokens: list[int], children: list[list[int]], logits: torch.Tensor,
                  sp: SamplingParams, gen: torch.Generator | None) -> tuple[list[int], int]:
    """Deterministic (top-k) drafts: try children in rank order, accept x with probability p(x);
    on rejection zero p(x) and renormalise; if all fail, the bonus is drawn from the residual.
    Then P(next = x) = p(x) exactly (the draft probability never enters)."""
    node, path = 0, []
    while True:
        p = probs_from_logits(logits[node], sp)
        nxt = None
        for c in children[node]:
            x = tokens[c]
            px = float(p[x])
            if px > 0.0 and float(torch.rand((), generator=gen)) < px:
                nxt = c
                break
            if px > 0.0:
                p[x] = 0.0
                p = p / p.sum()
        if nxt is None:
            return path, sample(p, gen)
        path.append(nxt)
        node = nxt


def specinfer(tokens: list[int], children: list[list[int]], logits: torch.Tensor,
              draft_probs: list, sp: SamplingParams, gen: torch.Generator | None) -> tuple[list[int], int]:
    """Sampled drafts (SpecInfer rule, siblings sampled without replacement): at a node with
    target p and draft q (the distribution the children were sampled from), try children in
    sampling order: accept y with probability min(1, p(y)/q(y)); on rejection p <- norm(max(p-q,0)),
    q[y] <- 0 and renormalise q. If all fail, the bonus comes from the final p.
    `draft_probs[i]` is q at node i (a dense [V] tensor) or None for a node without children."""
    node, path = 0, []
    while True:
        p = probs_from_logits(logits[node], sp)
        q = draft_probs[node]
        nxt = None
        if children[node]:
            if q is None:
                raise RuntimeError(f"specinfer: node {node} has children but no draft distribution")
            q = q.to(device=p.device, dtype=p.dtype, copy=True)
            for c in children[node]:
                y = tokens[c]
                py, qy = float(p[y]), float(q[y])
                if qy > 0.0 and float(torch.rand((), generator=gen)) < min(1.0, py / qy):
                    nxt = c
                    break
                r = torch.clamp(p - q, min=0.0)
                s = float(r.sum())
                p = r / s if s > 0 else p  # p == q on the support: nothing moves
                q[y] = 0.0
                qs = float(q.sum())
                if qs <= 0:
                    break
                q = q / qs
        if nxt is None:
            return path, sample(p, gen)
        path.append(nxt)
        node = nxt
