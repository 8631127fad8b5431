"""The target in the GGUF's own precision (`--dtype q4_1`): weights in their blocks, integer dot
products, every row's result independent of the batch (qforward.cpp says how).

The backends (`KernelTarget`, `KernelDraft`: forward.py's interface) keep the blocks and no fp32
copy of the target's weights: the embedding lookup reads rows of the embedding's blocks (for the
embedded model they hold exactly the fp32 values the converted safetensors hold). Beside them:
qblocks.py (the blocks), qlib.py (the library and its ABI), qbuild.py (building the backends from a
GGUF or from fp32 weights).
"""
from __future__ import annotations

import ctypes
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from .llama import KVCache, rope_covering
from .qblocks import QK, QMatrix, quantise_q4_1, quantise_q8_0
from .qlib import (DRAFT_CODES, FORWARD_CODES, ISAS, TOPK_MAX, TREE_CODES, CDraft, CHead3, CLayer, CModel, CTreeIn,
                   CTreeOut, check_cache, check_code, cmat_of, head_size_problem, matmul, owned_copy, ptr_of, rows_of,
                   shape_problem)
from .tree_modes import TREE_TOPK, BudgetInputs, Explore, TreeBudget, TreeCounts

# the tree's arrays a call writes (tree_arrays' columns, QTreeOut's pointers in its order)
TREE_COLUMNS = ("tokens", "parents", "depths", "ranks", "logp", "values", "levels", "kept", "beam", "rank_sum",
                "rank_count", "beam_len", "level_s", "order", "parent_pos", "mask")

PRECISION = "q4_1"


MATRICES = ("q", "k", "v", "o", "gate", "up", "down")


class KernelCache(KVCache):
    """The kernels' KV cache (fp16): a cycle's accepted rows are kept in one C call (qf_commit)."""

    def __init__(self, lib: ctypes.CDLL, *args):
        super().__init__(*args)
        self.lib = lib

    def commit(self, slots) -> None:
        slots = torch.as_tensor(slots, dtype=torch.int64).contiguous()
        k = self.k
        planes = k.shape[0] * k.shape[1] * k.shape[2]
        if self.lib.qf_commit(k.data_ptr(), self.v.data_ptr(), planes, self.max_len, k.shape[-1] * k.element_size(),
                              self.length, slots.data_ptr(), slots.numel()) != 0:
            raise RuntimeError(f"commit: slots {slots.tolist()} are not ascending past {self.length} in the cache")
        self.length += slots.numel()


class KernelTarget:
    """forward.TargetForward in qforward.cpp: the target's matrices in their blocks (`layers`: per
    layer a dict of MATRICES; `lm_head`; `embed`, the token embedding's blocks, which the kernels
    read rows of: for a tied model the LM head's own), its norms and biases as owned fp32 copies,
    RoPE tables. No fp32 copy of a weight it never runs is kept: the fp32 module it was built from
    can go. The cache is fp16, as llama.cpp keeps it: attention reads half fp32's bytes (the kernels
    convert exactly on load; rows stay independent of the batch)."""

    precision = PRECISION

    def __init__(self, args, layers: list[dict], lm_head: QMatrix, embed: QMatrix | None, norms: list,
                 final_norm: torch.Tensor, lib: ctypes.CDLL, aux_layers: tuple[int, ...] = ()):
        """`norms`: per layer (attention norm, MLP norm); `embed` None: the LM head's blocks (tied)."""
        a = self.args = args
        self.device = torch.device("cpu")
        self.lib = lib
        # each matrix's (outputs, inputs, bytes as a GGUF holds it): what profile's roofline reads
        self.sizes = {n: [(*blk[n].shape, blk[n].nbytes()) for blk in layers] for n in MATRICES}
        self.sizes["lm_head"] = [(*lm_head.shape, lm_head.nbytes())]
        # what one forward streams: the blocks, and the norms
        self._streamed = sum(b for mats in self.sizes.values() for _, _, b in mats) + 4 * a.dim * (2 * a.n_layers + 1)
        self.aux_layers = tuple(aux_layers)
        if any(not 0 <= t <= a.n_layers for t in self.aux_layers) or len(set(self.aux_layers)) != len(self.aux_layers):
            raise UserError(f"The draft head reads layers {list(self.aux_layers)}: they must be distinct, in 0..{a.n_layers} "
                            f"(this target's layers, {a.n_layers} the last one's output).")
        keep: list = []  # the packed copies the C structures point into, kept alive with this object
        c_layers = (CLayer * a.n_layers)()
        for i, (blk, (attn_norm, ffn_norm)) in enumerate(zip(layers, norms)):
            c_layers[i] = CLayer(owned_copy(attn_norm, keep), *[cmat_of(blk[n], keep) for n in MATRICES[:4]],
                                  owned_copy(ffn_norm, keep), *[cmat_of(blk[n], keep) for n in MATRICES[4:]])
        c_lm = cmat_of(lm_head, keep)
        self.c_embed = c_lm if embed is None else cmat_of(embed, keep)
        if (self.c_embed.N, self.c_embed.K) != (a.vocab_size, a.dim):
            raise UserError(f"The token embedding's blocks are [{self.c_embed.N}, {self.c_embed.K}], "
                            f"not [{a.vocab_size}, {a.dim}].")
        self._c_layers, self._packed = c_layers, keep
        self.c_model = CModel(a.dim, a.n_heads, a.n_kv_heads, a.head_dim, a.intermediate, a.n_layers,
                              a.norm_eps, a.vocab_size, c_layers, owned_copy(final_norm, keep), c_lm, self.c_embed)
        self.c_taps = (ctypes.c_int32 * max(1, len(self.aux_layers)))(*self.aux_layers)
        self._rope = (None, None)
        self.rope(2048)

    @property
    def isa(self) -> str:
        return ISAS.get(self.lib.qf_isa(), "?")

    @property
    def kernels_id(self) -> str:
        """The dot products that run and the kernels' build (their sources' hash): what a t(N)
        table measured on them is keyed by, so that new kernels are timed anew."""
        return f"{self.isa} {Path(self.lib._name).parent.name}"

    @property
    def timing_id(self) -> str:
        return f"{PRECISION} {self.kernels_id}"

    @property
    def description(self) -> str:
        return f"q4_1 forward (integer kernels, {self.isa})"

    def rope(self, n: int):
        """cos/sin tables covering positions < n (grown on demand, shared read-only). One attribute
        holds both: a call reads the pair once and holds it for its length, so a table that another
        session's cache grows is never freed under it, nor paired with the other's older table."""
        self._rope = rope_covering(self._rope, self.args, n, torch.empty(0))
        return self._rope

    def new_cache(self, max_len: int) -> KVCache:
        self.rope(max_len + 1)
        a = self.args
        return KernelCache(self.lib, a.n_layers, a.n_kv_heads, max_len, a.head_dim, torch.float16, self.device)

    def streamed_bytes(self) -> int:
        return self._streamed

    def embedding(self) -> torch.Tensor:
        return rows_of(self.lib, self.c_embed, torch.arange(self.c_embed.N))

    @torch.no_grad()
    def prefill(self, cache: KVCache, tokens, positions):
        feats, taps = self._call(cache, tokens, positions, None, bool(self.aux_layers), None)
        return (feats if taps is None else taps), self.logits(feats[-1:])[0]

    @torch.no_grad()
    def verify(self, cache: KVCache, tokens, positions, tree_mask=None, clock=None, best: torch.Tensor | None = None,
               prof: torch.Tensor | None = None):
        """forward.TargetForward.verify as one call of the kernels: the forward, every row's logits
        and, into `best` [N] (int64), each row's argmax (`prof`: see _call)."""
        if clock is not None:
            clock.lap("verify_inputs")
        logits = torch.empty(tokens.numel(), self.args.vocab_size)
        feats, taps = self._call(cache, tokens, positions, tree_mask, bool(self.aux_layers), logits, prof, best)
        return (feats if taps is None else taps), logits

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        """The LM head of rows [.., D] (fp32)."""
        y = matmul(self.lib, self.c_model.lm_head, features.reshape(-1, self.args.dim))
        return y.reshape(*features.shape[:-1], -1)

    def _call(self, cache: KVCache, tokens, positions, tree_mask, with_taps: bool, logits: torch.Tensor | None,
              prof: torch.Tensor | None = None, best: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor | None]:
        """One qf_forward of T new tokens after the committed cache, `tree_mask` [T, T] (None:
        causal): (post-norm features [T, D], the states entering `aux_layers` side by side [T,
        len * D] or None); with `logits` [T, vocab], the LM head of every row too; with `prof`
        [threads, len(OPS)] (float64), each thread's seconds per op added to it; with `best` [T]
        (int64, and logits), each row's argmax."""
        if tokens.device.type != "cpu":
            raise UserError("The q4_1 forward runs on the CPU; use --dtype float32 or bfloat16 on a GPU.")
        start, T, D = cache.length, tokens.numel(), self.args.dim
        a = self.args
        check_cache(cache, a.n_layers, a.n_kv_heads, a.head_dim, "the q4_1 forward")
        if positions.numel() != T or (tree_mask is not None and tuple(tree_mask.shape) != (T, T)):
            raise ValueError(f"the q4_1 forward: {T} tokens need {T} positions and a [{T}, {T}] tree mask "
                             f"(got {positions.numel()} and {None if tree_mask is None else list(tree_mask.shape)})")
        if logits is not None and (logits.dtype != torch.float32 or tuple(logits.shape) != (T, a.vocab_size)
                                   or not logits.is_contiguous()):
            raise ValueError(f"the q4_1 forward: logits must be fp32 [{T}, {a.vocab_size}], contiguous")
        if start + T > cache.max_len:
            raise RuntimeError("KV cache full")
        toks = tokens.reshape(T).to(torch.int64)
        pos = positions.reshape(T).to(torch.int64)
        visible = None if tree_mask is None or T == 1 else tree_mask.reshape(T, T).to(torch.uint8).contiguous()
        if best is not None and (logits is None or best.dtype != torch.int64 or best.numel() != T
                                 or not best.is_contiguous()):
            raise ValueError(f"best must be a contiguous int64 tensor of {T} entries beside the logits")
        x = torch.empty(T, D)
        taps = torch.empty(T, len(self.aux_layers) * D) if with_taps else None
        cos, sin = self._rope   # held for the call: another session may grow the tables meanwhile
        rc = self.lib.qf_forward(ctypes.byref(self.c_model), toks.data_ptr(), x.data_ptr(), T, cos.data_ptr(),
                                 sin.data_ptr(), min(cos.shape[0], sin.shape[0]), cache.k.data_ptr(),
                                 cache.v.data_ptr(), cache.max_len, start, pos.data_ptr(), ptr_of(visible), self.c_taps,
                                 len(self.aux_layers) if with_taps else 0, ptr_of(taps), ptr_of(logits), ptr_of(best),
                                 torch.get_num_threads(), ptr_of(prof))
        check_code("qf_forward", rc, FORWARD_CODES, taps=list(self.c_taps), layers=a.n_layers,
                   head_size=head_size_problem(self.c_model.hd))
        return x, taps


class Q8Weight:
    """A frozen fp32 weight's Q8_0 copy that llama.linear multiplies through the kernels (an
    EAGLE-1/2 draft head under q4_1: a quarter of fp32's bytes a call; drafts need no exactness,
    only the target's verification does). llama.PackedWeight's contract: `valid_for` checks that
    the weight is still the one copied, `apply` multiplies."""

    def __init__(self, weight: torch.Tensor, lib: ctypes.CDLL):
        w = weight.detach()
        self.lib = lib
        self._keep: list = []
        self.cmat = cmat_of(quantise_q8_0(w), self._keep)
        self.key = (w.data_ptr(), w._version, tuple(w.shape))

    def valid_for(self, weight: torch.Tensor) -> bool:
        return self.key == (weight.data_ptr(), weight._version, tuple(weight.shape))

    def apply(self, x2: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        y = matmul(self.lib, self.cmat, x2)
        return y if bias is None else y + bias

    @staticmethod
    def build(weight: torch.Tensor, lib: ctypes.CDLL) -> "Q8Weight | None":
        """The copy, or None (the fp32 matmul) for a matrix the kernels cannot take."""
        if weight.device.type != "cpu" or weight.dim() != 2 or weight.shape[1] % QK:
            return None
        return Q8Weight(weight, lib)


# The blocks a head's matrices may take on the kernels, by name (config's EAGLE2_HEAD_BLOCKS).
# Q4_1 is the default: on all 60 held-out prompts it drafted with Q8_0's tau, 12-18% faster (about
# 40% fewer bytes a call), and eagle2-auto ran 1-6% faster (benchmarks/README.md, head-blocks).
HEAD_BLOCKS = {"q4_1": quantise_q4_1, "q8_0": quantise_q8_0}


class KernelDraft:
    """forward.DraftForward for an EAGLE-3 head in qforward.cpp (`qf_draft`), its matrices in
    `blocks` (Q4_1 or Q8_0): one call (fc, the layer, the final norm, the draft LM head,
    log-softmax and each row's top k) instead of some sixty small torch operations. Built from the
    head module, which it does not keep; the token embedding is the target's blocks (a head with
    its own embedding: that, in Q8_0, one row read a token). Its cache is fp16, like the target's.
    It drafts a whole EAGLE-2 tree in one call too (`draft_tree`). Drafts need no exactness: the
    blocks change how fast a head drafts and how well, never the output."""

    drafts_trees = True

    def __init__(self, head, target: KernelTarget, blocks: str):
        if blocks not in HEAD_BLOCKS:
            raise UserError(f"The draft head's blocks must be one of {', '.join(HEAD_BLOCKS)} (got {blocks!r}; "
                            f"EAGLE2_HEAD_BLOCKS).")
        quantise = HEAD_BLOCKS[blocks]
        m, a = head.midlayer, head.args
        self.args, self.lib, self._keep, self.blocks = a, target.lib, [], blocks
        att, mlp = m.self_attn, m.mlp
        mats = [cmat_of(quantise(lin.weight), self._keep) for lin in
                (att.q_proj, att.k_proj, att.v_proj, att.o_proj, mlp.gate_proj, mlp.up_proj, mlp.down_proj)]
        norms = [m.input_layernorm.weight, m.hidden_norm.weight, m.post_attention_layernorm.weight]
        layer = CHead3(a.dim, a.n_heads, a.n_kv_heads, a.head_dim, a.intermediate, int(m.norm_before_residual),
                        a.norm_eps, 0, *[owned_copy(w, self._keep) for w in norms], *mats)
        fc = quantise(head.fc.weight)
        fc.bias = head.fc.bias
        embed = cmat_of(quantise_q8_0(head.embed_tokens.weight), self._keep) if head.has_embed else target.c_embed
        self._target = target  # whose embedding blocks it reads
        ids = None if head.draft_ids is None else head.draft_ids.to(torch.int64).clone().contiguous()
        self.draft_ids, self.vocab_size = ids, a.vocab_size
        self.vocab = head.lm_weight.shape[0]
        self.c = CDraft(layer, cmat_of(fc, self._keep), embed, owned_copy(head.norm.weight, self._keep),
                         cmat_of(quantise(head.lm_weight), self._keep), ptr_of(ids), a.vocab_size, 0)
        self._rope = (None, None)
        self.description = f"draft step in {blocks.upper()} on the same kernels"

    @staticmethod
    def fits(head) -> bool:
        return (getattr(head, "midlayer", None) is not None and not head.args.qkv_bias
                and shape_problem(head.args) is None and head.fc.weight.shape[1] % QK == 0)

    def new_cache(self, max_len: int) -> KVCache:
        self._rope = rope_covering(self._rope, self.args, max_len + 1, torch.empty(0))
        a = self.args
        return KVCache(1, a.n_kv_heads, max_len, a.head_dim, torch.float16, torch.device("cpu"))

    def to_target_ids(self, idx: torch.Tensor) -> torch.Tensor:
        return idx if self.draft_ids is None else self.draft_ids[idx]

    def _check(self, cache: KVCache) -> None:
        a = self.args
        check_cache(cache, 1, a.n_kv_heads, a.head_dim, "the draft head's step")

    @torch.no_grad()
    def step(self, cache: KVCache, features, tokens, positions, start: int, tree_mask=None, k: int = 0,
             last_only: bool = False):
        T = tokens.numel()
        self._check(cache)
        if features.dim() != 2 or features.shape[0] != T or positions.numel() != T:
            raise ValueError(f"the draft head's step: {T} tokens need features [{T}, width] and {T} positions "
                             f"(got {list(features.shape)} and {positions.numel()})")
        if tree_mask is not None and tuple(tree_mask.shape) != (T, start + T - cache.length):
            raise ValueError(f"the draft head's step: its tree mask must be [{T}, {start + T - cache.length}] "
                             f"(got {list(tree_mask.shape)})")
        if start + T > cache.max_len:
            raise RuntimeError("draft cache full")
        feats = features.float().contiguous()
        toks = tokens.to(torch.int64).contiguous()
        cos, sin = self._rope
        cos, sin = cos[positions].contiguous(), sin[positions].contiguous()
        tree = None if tree_mask is None else tree_mask.to(torch.uint8).contiguous()
        k = min(k, self.vocab)
        lm_from = T - 1 if last_only else 0   # the rows that get log-probabilities: lm_from..T-1
        g, logp = torch.empty(T, self.args.dim), torch.empty(T - lm_from, self.vocab)
        top = (torch.empty(T - lm_from, k), torch.empty(T - lm_from, k, dtype=torch.int64)) if k else None
        rc = self.lib.qf_draft(ctypes.byref(self.c), toks.data_ptr(), feats.data_ptr(), feats.shape[-1], T,
                               cos.data_ptr(), sin.data_ptr(), cache.k.data_ptr(), cache.v.data_ptr(), cache.max_len,
                               cache.length, start, ptr_of(tree), g.data_ptr(), logp.data_ptr(), k,
                               ptr_of(top[0]) if top else None, ptr_of(top[1]) if top else None, lm_from,
                               torch.get_num_threads())
        check_code("qf_draft", rc, DRAFT_CODES, topk_max=TOPK_MAX, k=k, head_size=head_size_problem(self.c.layer.hd))
        return g, logp, top


    # the pool's columns and the verification's layout as qf_draft_tree fills them (QTreeOut)
    TREE_COLUMNS = {"tokens": np.int64, "parents": np.int32, "depths": np.int32, "ranks": np.int32,
                    "logp": np.float32, "values": np.float32, "levels": np.int32, "kept": np.uint8,
                    "beam": np.int32}
    VERIFY_COLUMNS = {"order": np.int32, "parent_pos": np.int32}

    @classmethod
    def tree_arrays(cls, top_k: int, depth: int, total_tokens: int) -> dict[str, np.ndarray]:
        """Empty arrays for one qf_draft_tree call of this shape (the caller keeps them: the tree)."""
        nodes = 1 + top_k + depth * top_k * top_k
        verify = min(total_tokens, nodes)
        out = {k: np.empty(nodes, dt) for k, dt in cls.TREE_COLUMNS.items()}
        out.update({k: np.empty(verify, dt) for k, dt in cls.VERIFY_COLUMNS.items()})
        out["beam_len"] = np.empty(depth + 1, np.int32)
        out["level_s"] = np.empty(depth)
        out["rank_sum"], out["rank_count"] = np.empty(top_k), np.empty(top_k, np.int32)
        out["mask"] = np.empty(verify * verify, np.uint8)
        return out

    @staticmethod
    def tree_out(out: dict[str, np.ndarray]) -> CTreeOut:
        """qf_draft_tree's outputs: pointers into `out` (tree_arrays)."""
        return CTreeOut(cap_nodes=len(out["tokens"]), cap_verify=len(out["order"]),
                        **{k: out[k].ctypes.data for k in TREE_COLUMNS})

    @torch.no_grad()
    def draft_tree(self, cache: KVCache, root: int, root_g: torch.Tensor, root_top: tuple, base_pos: int,
                   top_k: int, depth: int, total_tokens: int, out: dict[str, np.ndarray],
                   budget: BudgetInputs | None = None) -> TreeCounts:
        """A whole cycle's draft tree in one call (qf_draft_tree: EAGLE-2's levels, the budget's
        choices, the rerank and the verification's layout) into `out` (tree_arrays). The root's
        reading: its feature `root_g` [D] and its best children `root_top` (log-probs, target ids),
        best first. `budget` None: EAGLE-2 at this shape; else the auto budget's data for this
        cycle (read only: the seconds each level took come back in out["level_s"]). Returns the
        call's counts."""
        call = self.tree_call(cache, root, root_g, root_top, base_pos, top_k, depth, total_tokens, out, budget)
        rc = self.lib.qf_draft_tree(ctypes.byref(self.c), ctypes.byref(call.cin), ctypes.byref(call.cout))
        if rc != 0:
            check_code("qf_draft_tree", rc, TREE_CODES, **call.known)
        return call.counts()

    def tree_call(self, cache: KVCache, root: int, root_g: torch.Tensor, root_top: tuple, base_pos: int,
                  top_k: int, depth: int, total_tokens: int, out: dict[str, np.ndarray],
                  budget: BudgetInputs | None, cout: CTreeOut | None = None) -> "TreeCall":
        """qf_draft_tree's arguments (draft_tree's), checked, with what they point into kept alive
        (the kernels' one-call cycle passes them on too; `cout`: tree_out(out), kept by a caller
        that reuses `out`)."""
        cos, sin = self._rope
        self._check(cache)
        if root_g.numel() != self.args.dim or root_top[0].numel() != root_top[1].numel():
            raise ValueError(f"draft_tree: the root's feature must have {self.args.dim} values and its children "
                             f"as many ids as log-probs")
        if base_pos + depth >= min(cos.shape[0], sin.shape[0]) or cache.length + depth * top_k > cache.max_len:
            raise RuntimeError("draft cache full")
        g = root_g.float().contiguous()
        vals = root_top[0].float().contiguous()
        ids = root_top[1].to(torch.int64).contiguous()
        # EAGLE-2 as it is: the budget's fields at neutral values (the kernels do not read them then)
        b = budget or BudgetInputs(mode=TreeBudget.EAGLE2, tn=np.zeros(total_tokens), rank_prob=np.zeros(top_k),
                                   prices=np.full(2, np.nan), call_guess=0.0, odds=1.0, explore_depth=False,
                                   explore=Explore.BEST)
        tn, ranks, prices = (np.ascontiguousarray(x, dtype=np.float64) for x in (b.tn, b.rank_prob, b.prices))
        if len(tn) < total_tokens or len(ranks) < top_k or len(prices) < 2:
            raise ValueError("the budget's tables are shorter than the tree's shape")
        cin = CTreeIn(root=root, root_g=g.data_ptr(), root_vals=vals.data_ptr(), root_ids=ids.data_ptr(),
                      n_root=vals.numel(), top_k=top_k, depth=depth, total_tokens=total_tokens,
                      committed=cache.length, base_pos=base_pos, cap=cache.max_len,
                      rope_rows=min(cos.shape[0], sin.shape[0]), kc=cache.k.data_ptr(), vc=cache.v.data_ptr(),
                      cos=cos.data_ptr(), sin=sin.data_ptr(), budget=int(b.mode), explore_depth=int(b.explore_depth),
                      explore=int(b.explore), max_width=len(prices) - 1, call_guess=b.call_guess, odds=b.odds,
                      tn=tn.ctypes.data, rank_prob=ranks.ctypes.data, prices=prices.ctypes.data,
                      threads=torch.get_num_threads())
        cout = cout or self.tree_out(out)
        return TreeCall(cin, cout, (g, vals, ids, tn, ranks, prices, cos, sin), (top_k, depth, total_tokens),
                        self.c.layer.hd)


@dataclass
class TreeCall:
    """One qf_draft_tree call's structs, the arrays they point into (alive while this is) and what
    its error lines name."""
    cin: CTreeIn
    cout: CTreeOut
    keep: tuple
    shape: tuple[int, int, int]   # top_k, depth, total_tokens
    head_dim: int

    @property
    def known(self) -> dict:
        """What its error lines name (made only when one is raised)."""
        top_k, depth, total_tokens = self.shape
        return dict(top_k=top_k, depth=depth, total_tokens=total_tokens, tree_topk=TREE_TOPK,
                    head_size=head_size_problem(self.head_dim))

    def counts(self) -> TreeCounts:
        c = self.cout
        return TreeCounts(n=c.n, n_beams=c.n_beams, draft_calls=c.draft_calls, n_verify=c.n_verify, best_n=c.best_n,
                          expected=c.expected, head_s=c.head_s)
