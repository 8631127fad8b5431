"""The draft-head training loss (docs/algorithms.md §1), one function for both head kinds:
EAGLE-1/2 regresses the target's next feature and adds 0.1 x cross-entropy; EAGLE-3 is trained on
tokens only (cross-entropy against the target's distribution). Both on the draft vocabulary, both
with the training-time test's unrolled passes."""
from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F


@dataclass(frozen=True)
class Objective:
    ref_rows: torch.Tensor  # the target's frozen LM-head rows of the draft vocabulary: p = softmax(ref_rows f)
    inputs: str = "feat"  # what the head reads from the cache: "feat" (EAGLE-1/2) or "aux" (EAGLE-3)
    reg_weight: float = 1.0  # SmoothL1 feature regression (0: none, EAGLE-3)
    ce_weight: float = 0.1
    noise: float = 0.0  # uniform input-feature noise half-width (training only)
    ttt_weight: float = 1.0  # weight of each unrolled pass
    input_scale: torch.Tensor | None = None  # per-channel factor on what the head reads (EAGLE-3's aux states)


def collate(batch: list[dict], device, inputs: str = "feat"):
    """Teacher forcing: inputs (c[inputs]_i, x_{i+1}), targets f_{i+1}, loss where x_{i+1} is
    assistant text."""
    T = max(len(c["ids"]) for c in batch) - 1
    B, D, Din = len(batch), batch[0]["feat"].shape[1], batch[0][inputs].shape[1]
    fin = torch.zeros(B, T, Din)
    fout = torch.zeros(B, T, D)
    tok = torch.zeros(B, T, dtype=torch.long)
    m = torch.zeros(B, T)
    for b, c in enumerate(batch):
        n = len(c["ids"]) - 1
        fin[b, :n] = c[inputs][:-1].float()
        fout[b, :n] = c["feat"][1:].float()
        tok[b, :n] = c["ids"][1:]
        m[b, :n] = c["mask"][1:].float()
    return fin.to(device), tok.to(device), fout.to(device), m.to(device)


def head_loss(head, fin, tok, fout, m, obj: Objective, train=True, top1_target=None, ttt_steps=1):
    """The loss on one batch, plus (ttt_steps > 1) the same loss, weighted obj.ttt_weight, on each
    unrolled training-time-test pass in which the head reads its own outputs
    (head.forward_train_unrolled). Returns (loss, stats): the step-1 loss `loss1`, `top1`, the
    number of loss positions `n` and `top1_step{s}` for each unrolled pass. Agreement is against
    `top1_target` (full-vocabulary argmax, given for evaluation) or, in training, the target's
    argmax within the draft vocabulary."""
    if obj.input_scale is not None:
        fin = fin * obj.input_scale
    if train and obj.noise > 0:
        fin = fin + (torch.rand_like(fin) * 2 - 1) * obj.noise
    g = head.forward_train(fin, tok)
    sel = m > 0  # the vocabulary products (most of the cost) only where the loss looks
    fsel = fout[sel]
    # the target's distribution on the draft vocabulary, in fp32 under --amp too (it is the label)
    with torch.no_grad(), torch.autocast(fsel.device.type, enabled=False):
        p = torch.softmax(fsel @ obj.ref_rows.T, dim=-1)
        target_ids = head.to_target_ids(p.argmax(-1)) if top1_target is None else top1_target[sel]

    def step(gs, keep=None):
        """Summed loss and agreements at the selected rows (optionally a subset `keep`)."""
        t, pp, ids = (fsel, p, target_ids) if keep is None else (fsel[keep], p[keep], target_ids[keep])
        logq = head.draft_logprobs(gs)
        loss = obj.ce_weight * -(pp * logq).sum(-1)
        if obj.reg_weight:
            loss = obj.reg_weight * F.smooth_l1_loss(gs, t, reduction="none").mean(-1) + loss
        with torch.no_grad():
            agree = (head.to_target_ids(logq.argmax(-1)) == ids).float().sum()
        return loss.sum(), float(agree), int(gs.shape[0])

    denom = max(int(sel.sum()), 1)
    loss, agree, _ = step(g[sel])
    stats = {"loss1": float(loss.detach()) / denom, "top1": agree / denom, "n": int(sel.sum())}
    if ttt_steps > 1:
        col = torch.arange(sel.shape[1], device=sel.device).expand_as(sel)[sel]
        for s, gs in enumerate(head.forward_train_unrolled(fin, tok, g, ttt_steps), start=2):
            keep = col >= s - 1  # rows with a full chain of s-1 drafted ancestors
            ls, a_s, n_s = step(gs[sel][keep], keep)
            loss = loss + obj.ttt_weight * ls * denom / max(n_s, 1)
            stats[f"top1_step{s}"] = a_s / max(n_s, 1)
    return loss / denom, stats
