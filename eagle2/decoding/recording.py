"""What a run keeps for people: the trace (texts of every token, each tree annotated with the
target's probabilities and the accepted path) and the preview of another policy's tree. Decoding
does not need any of it: a TraceRecorder observes the decoder's steps, when it records.
"""
from __future__ import annotations

import torch

from ..cycle.sampling import SamplingParams, probs_from_logits
from ..cycle.trace import StepTrace, Trace
from ..model.verify_times import RECORD_KEY


def annotate(c, sampling: SamplingParams) -> None:
    """Record on the cycle's tree the target's probability of each kept node (at its parent, at
    temperature 1 for greedy runs) and the accepted flags: what the page draws."""
    tree, vb = c.tree, c.vb
    sp = sampling if not sampling.greedy else SamplingParams(temperature=1.0)
    probs = probs_from_logits(c.logits, sp)
    parent = torch.tensor([max(p, 0) for p in vb.parent_pos], device=probs.device)
    tp = probs[parent, vb.tokens].tolist()
    tree.target_prob = [None] * len(tree.tokens)
    for i, p in enumerate(vb.pool_idx):
        if i > 0:
            tree.target_prob[p] = tp[i]
    acc = set(c.accepted_pool)
    tree.accepted = [i == 0 or i in acc for i in range(len(tree.tokens))]


def run_meta(dec) -> dict:
    """A trace's header: model, head, device, policy, sampling and prompt of a started decoder.
    (This machine's t(N), which the what-if views price with, is the caller's to add: reading
    the cost cache is not the decoder's business.)"""
    b = dec.b
    pol = {"name": dec.policy_name, **(dec.policy.params() if dec.policy is not None else {})}
    return {"model": b.name, "head": b.head_name, "device": str(b.device),
            "dtype": b.precision or str(b.dtype).replace("torch.", ""), "policy": pol,
            "sampling": vars(dec.sampling).copy(), "max_new_tokens": dec.max_new_tokens,
            "prompt_ids": dec.prompt_ids, RECORD_KEY: None,
            "prompt_text": b.tokenizer.decode(dec.prompt_ids)}


class TraceRecorder:
    """Appends each step of one decoder to its Trace, with the texts and annotations the page shows."""

    def __init__(self, b, meta: dict):
        self.b = b
        self.trace = Trace(meta=meta)

    def record(self, st: StepTrace, c, sampling: SamplingParams) -> None:
        st.new_texts = self.b.token_texts(st.new_tokens)
        if c is not None:
            annotate(c, sampling)
            st.tree_texts = self.b.token_texts(c.tree.tokens)
        self.trace.steps.append(st)


def preview_trace(b, cycle: int, root: int, c, policy_name: str, sampling: SamplingParams) -> StepTrace:
    """The step another policy would have made on this context (numbered like the next step)."""
    annotate(c, sampling)
    toks = c.path_tokens + [c.bonus]
    timings = dict(c.timings)   # a preview commits nothing: its commit phases are 0
    return StepTrace(cycle=cycle, policy=policy_name, new_tokens=toks, new_texts=b.token_texts(toks),
                     accepted_len=len(c.path_pos), bonus=c.bonus, timings=timings, cumulative={}, tree=c.tree,
                     tree_texts=b.token_texts(c.tree.tokens), accepted_path=c.accepted_pool, root=root)
