"""Building the q4_1 backends (quantized.py's KernelTarget and the head's DraftForward).

Where the weights come from:
- the embedded model: its GGUF's own blocks, read as shipped (Q4_1 for the layers' matrices, Q8_0
  for the tied embedding / LM head; the norms are F32). llama.cpp stores the q and k projections'
  rows interleaved for its RoPE; they are put back in Hugging Face's order, whole blocks moved.
- any other folder or hub id: its fp32 weights quantised here the way ggml does (Q4_1 for the
  matrices, Q8_0 for the LM head and an untied embedding), so every Llama-family model gets the
  same forward.
"""
from __future__ import annotations

from pathlib import Path

import torch

from ..errors import UserError
from .llama import LlamaModel
from .qblocks import Q4_1, Q8_0, QMatrix, from_gguf, quantise_q4_1, quantise_q8_0
from .qlib import library, shape_problem
from .quantized import KernelDraft, KernelTarget, Q8Weight


def _gguf_tensors(gguf: Path) -> dict:
    from gguf import GGUFReader
    return {t.name: t for t in GGUFReader(str(gguf)).tensors}


def _gguf_norms(gguf: Path, args, tensors: dict | None = None) -> tuple[list, torch.Tensor]:
    """The embedded model's norm weights, as shipped (F32): per layer (attention norm, MLP norm),
    and the final norm."""
    tensors = tensors or _gguf_tensors(gguf)

    def read(name: str) -> torch.Tensor:
        t = tensors[name]
        if t.tensor_type.name != "F32":
            raise UserError(f"{gguf.name}: {name} is {t.tensor_type.name}, not F32; use --dtype float32.")
        return torch.from_numpy(t.data.copy()).float().reshape(-1)
    norms = [(read(f"blk.{i}.attn_norm.weight"), read(f"blk.{i}.ffn_norm.weight")) for i in range(args.n_layers)]
    return norms, read("output_norm.weight")


def _gguf_blocks(gguf: Path, args, tensors: dict | None = None) -> tuple[list[dict], QMatrix, QMatrix | None]:
    """The embedded model's blocks, as shipped, rows in Hugging Face's order: (layers, LM head,
    token embedding or None where the LM head is the embedding)."""
    kinds = {"Q4_1": Q4_1, "Q8_0": Q8_0}
    tensors = tensors or _gguf_tensors(gguf)

    def read(name: str) -> QMatrix:
        t = tensors[name]
        kind = kinds.get(t.tensor_type.name)
        if kind is None:
            raise UserError(f"{gguf.name}: tensor {name} is {t.tensor_type.name}, which the q4_1 kernels do "
                            f"not read (they read Q4_1 and Q8_0); use --dtype float32.")
        return from_gguf(torch.from_numpy(t.data.copy()), kind)

    def unpermute(m: QMatrix, heads: int) -> QMatrix:
        # llama.cpp's convert interleaves each head's rotary halves; undo it on whole rows
        N = m.shape[0]
        order = torch.arange(N).view(heads, N // heads // 2, 2).transpose(1, 2).reshape(N)
        return m.rows(order)

    names = {"q": "attn_q", "k": "attn_k", "v": "attn_v", "o": "attn_output", "gate": "ffn_gate",
             "up": "ffn_up", "down": "ffn_down"}
    layers = []
    for i in range(args.n_layers):
        blk = {k: read(f"blk.{i}.{n}.weight") for k, n in names.items()}
        blk["q"], blk["k"] = unpermute(blk["q"], args.n_heads), unpermute(blk["k"], args.n_kv_heads)
        layers.append(blk)
    if "output.weight" in tensors:
        return layers, read("output.weight"), read("token_embd.weight")
    return layers, read("token_embd.weight"), None


def _quantised_blocks(model: LlamaModel) -> tuple[list[dict], QMatrix, QMatrix | None]:
    """`model`'s weights quantised as ggml does (_gguf_blocks' result)."""
    layers = []
    for layer in model.layers:
        att, mlp = layer.self_attn, layer.mlp
        mats = {"q": att.q_proj, "k": att.k_proj, "v": att.v_proj, "o": att.o_proj,
                "gate": mlp.gate_proj, "up": mlp.up_proj, "down": mlp.down_proj}
        layers.append({k: quantise_q4_1(m.weight) for k, m in mats.items()})
    embed = None if model.args.tie_embeddings else quantise_q8_0(model.embed_tokens.weight)
    return layers, quantise_q8_0(model.lm_head.weight), embed


def _kernels_here(args, log):
    """The kernels' library, or None (the reason logged) where they cannot run here (no AVX2, no
    compiler); a UserError for a model shape they do not take."""
    problem = shape_problem(args)
    if problem:
        raise UserError(f"{problem}; use --dtype float32.")
    return library(log)


def _draft_for(target: KernelTarget, head):
    """The head's DraftForward beside the kernels' target: an EAGLE-3 head runs its whole step in
    the kernels (KernelDraft, in the blocks EAGLE2_HEAD_BLOCKS names); another keeps its eager
    forward, its matmuls through Q8_0 copies (a matrix whose input is no multiple of 32 keeps its
    fp32 matmul)."""
    from .. import config
    from .forward import EagerDraft
    if KernelDraft.fits(head):
        return KernelDraft(head, target, config.current().head_blocks)
    head.pack(lambda w: Q8Weight.build(w, target.lib))
    return EagerDraft(head, "Q8_0 matmuls on the q4_1 kernels")


def gguf_backends(args, gguf: Path, head, own_lm: torch.Tensor | None, log=None):
    """(KernelTarget, the head's DraftForward) for the embedded model, from its GGUF alone: the
    blocks and norms as shipped, no fp32 model first. `head` (fp32, on the CPU) is attached here:
    to the LM head's fp32 values (the blocks dequantised: what the converted model holds, exactly)
    unless it has its own, and, where it runs eagerly without an embedding of its own, to the
    token embedding's. None where the kernels cannot run here."""
    lib = _kernels_here(args, log)
    if lib is None:
        return None
    tensors = _gguf_tensors(gguf)
    layers, lm, embed = _gguf_blocks(gguf, args, tensors)
    norms, final = _gguf_norms(gguf, args, tensors)
    del tensors   # the file's mapping goes before the blocks are packed: its pages count as resident
    target = KernelTarget(args, layers, lm, embed, norms, final, lib, head.aux_layers)
    if not getattr(head, "has_embed", False) and not KernelDraft.fits(head):
        table = (embed if embed is not None else lm).dequantised()
        head.embed_tokens.weight = torch.nn.Parameter(table, requires_grad=False)
    head.attach(lm.dequantised() if own_lm is None else None, own_lm)
    return target, _draft_for(target, head)


def kernel_backends(model: LlamaModel, head, log=None):
    """(KernelTarget, the head's DraftForward) for `model` (fp32, on the CPU; its `aux_layers` set)
    quantised as ggml does, and its attached `head`; None where the kernels cannot run here."""
    a = model.args
    lib = _kernels_here(a, log)
    if lib is None:
        return None
    layers, lm, embed = _quantised_blocks(model)
    for blk, layer in zip(layers, model.layers):
        att = layer.self_attn
        for name, lin in (("q", att.q_proj), ("k", att.k_proj), ("v", att.v_proj)):
            blk[name].bias = lin.bias   # cmat_of keeps its own fp32 copy
    norms = [(ly.input_layernorm.weight, ly.post_attention_layernorm.weight) for ly in model.layers]
    target = KernelTarget(a, layers, lm, embed, norms, model.norm.weight, lib, model.aux_layers)
    return target, _draft_for(target, head)
