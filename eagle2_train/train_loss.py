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


def head_loss(head, fin, tok, fout, m, obj: Objective, train=True, top1_target=None, ttt_steps=1, core=None):
    """The loss on one batch, plus (ttt_steps > 1) the same loss, weighted obj.ttt_weight, on each
    unrolled training-time-test pass in which the head reads its own outputs
    (head.forward_train_unrolled). Returns (loss, stats): the step-1 loss `loss1`, `top1`, the
    number of loss positions `n` and `top1_step{s}` for each unrolled pass. Agreement is against
    `top1_target` (full-vocabulary argmax, given for evaluation) or, in training, the target's
    argmax within the draft vocabulary. The rows the loss reads are found here, eagerly, so that
    `core` (loss_core, or its torch.compile'd form) sees index tensors only: no data-dependent
    shapes, no graph breaks."""
    sel = (m > 0).flatten()
    rows = sel.nonzero().squeeze(1)  # the vocabulary products (most of the cost) only where the loss looks
    col = rows % m.shape[1]
    keeps = [(col >= s - 1).nonzero().squeeze(1) for s in range(2, ttt_steps + 1)]  # a full chain of s-1 ancestors
    t1 = None if top1_target is None else top1_target.flatten().index_select(0, rows)
    loss, loss1, agree = (core or loss_core)(head, fin, tok, fout, rows, keeps, obj, train, t1)
    n = int(rows.numel())
    agree = agree.tolist()
    stats = {"loss1": float(loss1) / max(n, 1), "top1": agree[0] / max(n, 1), "n": n}
    for s, keep in enumerate(keeps, start=2):
        stats[f"top1_step{s}"] = agree[s - 1] / max(int(keep.numel()), 1)
    return loss, stats


def loss_core(head, fin, tok, fout, rows, keeps: list, obj: Objective, train: bool, top1_target=None):
    """head_loss's tensor work: (loss, step-1 summed loss, agreements per pass [ttt_steps]).
    `rows`: the flat [B*T] positions the loss reads; keeps[s-2]: those of `rows` that pass s reads."""
    if obj.input_scale is not None:
        fin = fin * obj.input_scale
    if train and obj.noise > 0:
        fin = fin + (torch.rand_like(fin) * 2 - 1) * obj.noise
    g = head.forward_train(fin, tok)
    D = g.shape[-1]
    fsel = fout.reshape(-1, fout.shape[-1]).index_select(0, rows)
    # the target's distribution on the draft vocabulary, in fp32 under --amp too (it is the label)
    with torch.no_grad(), torch.autocast(fsel.device.type, enabled=False):
        p = torch.softmax(fsel @ obj.ref_rows.T, dim=-1)
        target_ids = head.to_target_ids(p.argmax(-1)) if top1_target is None else top1_target

    def step(gs, keep=None):
        """Summed loss and agreement count at the selected rows (optionally a subset `keep`)."""
        t, pp, ids = ((fsel, p, target_ids) if keep is None else
                      (fsel.index_select(0, keep), p.index_select(0, keep), target_ids.index_select(0, keep)))
        logq = head.draft_logprobs(gs)
        loss = obj.ce_weight * -(pp * logq).sum(-1)
        if obj.reg_weight:
            loss = obj.reg_weight * F.smooth_l1_loss(gs, t, reduction="none").mean(-1) + loss
        with torch.no_grad():
            agree = (head.to_target_ids(logq.argmax(-1)) == ids).sum()
        return loss.sum(), agree

    denom = max(rows.shape[0], 1)
    loss, agree = step(g.reshape(-1, D).index_select(0, rows))
    loss1, agrees = loss.detach(), [agree]
    if keeps:
        for keep, gs in zip(keeps, head.forward_train_unrolled(fin, tok, g, len(keeps) + 1)):
            ls, a_s = step(gs.reshape(-1, D).index_select(0, rows).index_select(0, keep), keep)
            loss = loss + obj.ttt_weight * ls * denom / max(keep.shape[0], 1)
            agrees.append(a_s)
    return loss / denom, loss1, torch.stack(agrees)
