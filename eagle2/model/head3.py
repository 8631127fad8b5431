"""The EAGLE-3 draft head (arXiv 2503.01840), official checkpoint layout (docs/algorithms.md §1, EAGLE-3 head).

It reads the target's low, middle and high hidden states side by side, a_i = [h^l_i; h^m_i; h^h_i],
fused by `fc` (3D -> D); one decoder layer (`midlayer`) whose attention input is
[input_layernorm(e(x_{i+1})) ; hidden_norm(u_i)] (2D wide); logits from `norm` and its own LM head
over a reduced draft vocabulary (`d2t`, `t2d`). A deeper draft step feeds the layer's own output
(before `norm`) in place of fc(a): a D-wide input skips `fc`, as in SGLang and vLLM. Trained by
`python -m eagle2_train train --head-kind eagle3` (forward_train, forward_train_unrolled, save_head3).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from torch import nn

from ..errors import UserError
from .head import DraftHead, head_args, head_config, load_weights
from .llama import MLP, Attention, Linear, LlamaArgs, RMSNorm
from .ttt import unrolled_passes


class Eagle3Layer(nn.Module):
    """EAGLE-3's decoder layer: the token embedding and the hidden state are normed apart and
    concatenated for q/k/v; the residual stream is the hidden state (normed first if
    `norm_before_residual`, a SpecForge config option)."""

    def __init__(self, a: LlamaArgs, norm_before_residual: bool = False):
        super().__init__()
        self.norm_before_residual = norm_before_residual
        self.input_layernorm = RMSNorm(a.dim, a.norm_eps)
        self.hidden_norm = RMSNorm(a.dim, a.norm_eps)
        self.self_attn = Attention(a, in_dim=2 * a.dim)
        self.post_attention_layernorm = RMSNorm(a.dim, a.norm_eps)
        self.mlp = MLP(a)

    def forward(self, emb, hidden, cos, sin, past_k=None, past_v=None, past_mask=None, new_mask=None):
        """-> (output, its K, its V), with llama.Attention's arguments and contract."""
        hn = self.hidden_norm(hidden)
        x = hn if self.norm_before_residual else hidden
        o, k, v = self.self_attn(torch.cat([self.input_layernorm(emb), hn], dim=-1), cos, sin, past_k, past_v,
                                 past_mask, new_mask)
        x = x + o
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


class Eagle3Head(DraftHead):
    def __init__(self, args: LlamaArgs, aux_layers: tuple[int, ...], fc_bias: bool = False,
                 draft_vocab: torch.Tensor | None = None, norm_before_residual: bool = False):
        super().__init__(args, draft_vocab)
        self.aux_layers = tuple(aux_layers)
        self.fc_bias = fc_bias
        self.embed_tokens = nn.Embedding(args.vocab_size, args.dim)
        self.fc = Linear(len(self.aux_layers) * args.dim, args.dim, bias=fc_bias)
        self.midlayer = Eagle3Layer(args, norm_before_residual)
        self.norm = RMSNorm(args.dim, args.norm_eps)

    def step(self, emb, hidden, cos, sin, past_k, past_v, past_mask, new_mask):
        """DraftHead.step, `hidden` the layer's D-wide input (hidden_input). g: the layer's outputs
        before `norm`, which draft_logprobs reads and children feed back."""
        return self.midlayer(emb, hidden, cos, sin, past_k, past_v, past_mask, new_mask)

    def draft_logprobs(self, g: torch.Tensor) -> torch.Tensor:
        return super().draft_logprobs(self.norm(g))

    def hidden_input(self, features: torch.Tensor) -> torch.Tensor:
        """The layer's D-wide hidden input: fc of the fused target states, or a fed-back output as
        it is (what `step` takes)."""
        return features if features.shape[-1] == self.args.dim else self.fc(features)

    # ------------------------------------------------------------ training (eagle2_train/train.py)

    def trainable_lm_head(self, weight: torch.Tensor) -> None:
        """Make the LM head a trained parameter starting from `weight` [V_draft, D] (the target's
        draft-vocabulary rows, or a checkpoint's own); `lm_head.weight`, as checkpoints name it."""
        self.lm_head = Linear(self.args.dim, weight.shape[0], bias=False, device=weight.device, dtype=weight.dtype)
        with torch.no_grad():
            self.lm_head.weight.copy_(weight)
        # draft_logprobs reads lm_weight: the same tensor, set past nn.Module so that it is not
        # registered a second time (as `lm_weight`, in state_dict)
        object.__setattr__(self, "lm_weight", self.lm_head.weight)
        self.lm_packed = None

    def forward_train(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced causal pass: the target's fused states [B,T,k*D] of x_0..x_{T-1}, tokens
        [B,T] = x_1..x_T -> the layer's outputs before `norm` [B,T,D]."""
        T = tokens.shape[1]
        cos, sin = self.rope(T)
        return self.midlayer(self.embed_tokens(tokens), self.fc(features), cos[:T], sin[:T])[0]

    def forward_train_unrolled(self, features: torch.Tensor, tokens: torch.Tensor, g1: torch.Tensor,
                               steps: int) -> list[torch.Tensor]:
        """Training-time test as EAGLE-3 trains it: in pass s (s = 2..steps) row j is the depth-s
        node at position j, the pair (pass s-1's output at j-1 in place of fc(a), x_{j+1}), with
        EagleHead.forward_train_unrolled's attention (ttt.unrolled_passes). Gradients flow through
        the fed-back outputs, as in the official training. Returns the outputs of passes 2..steps."""
        m = self.midlayer
        e = m.input_layernorm(self.embed_tokens(tokens))

        def attn_input(hidden):
            hn = m.hidden_norm(hidden)
            return torch.cat([e, hn], dim=-1), (hn if m.norm_before_residual else hidden)

        cos, sin = self.rope(tokens.shape[1])
        return unrolled_passes(m, cos, sin, attn_input(self.fc(features))[0], g1, steps, attn_input, detach=False)


# ---------------------------------------------------------------- checkpoints (official layout)

def is_eagle3(cfg: dict, state: dict) -> bool:
    """Whether a draft head checkpoint has the EAGLE-3 layout: its architecture says so, or it
    has `midlayer.*` tensors, or its `fc` reads three hidden states (3 x hidden_size)."""
    archs = cfg.get("architectures") or []
    fc = state.get("fc.weight")
    wide_fc = (fc is not None and fc.dim() == 2 and isinstance(cfg.get("hidden_size"), int)
               and fc.shape[1] == 3 * cfg["hidden_size"])
    return (any("eagle3" in str(a).lower() for a in archs) or wide_fc
            or any(k.startswith("midlayer.") for k in state))


def aux_layers_of(cfg: dict, n_layers: int) -> tuple[int, ...]:
    """Target layers whose input states the head reads. The config's
    eagle_config.eagle_aux_hidden_state_layer_ids name layer *outputs* (id k = the state entering
    layer k + 1, as SGLang reads them); without them, the official (2, L//2, L-3)."""
    ids = (cfg.get("eagle_config") or {}).get("eagle_aux_hidden_state_layer_ids")
    if ids is None:
        layers = (2, n_layers // 2, n_layers - 3)
        where = f"the default (2, L//2, L-3) for a {n_layers}-layer target"
    else:
        if not (isinstance(ids, list) and all(isinstance(i, int) for i in ids)):
            raise UserError(f"eagle_aux_hidden_state_layer_ids must be a list of layer numbers (got {ids!r}).")
        layers = tuple(i + 1 for i in ids)
        where = f"eagle_aux_hidden_state_layer_ids {ids}"
    if len(set(layers)) != len(layers) or not all(0 <= i <= n_layers for i in layers):
        raise UserError(f"The EAGLE-3 head's target layers ({where}) must be distinct layers of the "
                        f"{n_layers}-layer target.")
    return tuple(sorted(layers))  # concatenated in layer order, as the target runs them


def _draft_vocab(state: dict, cfg: dict, V: int, folder: Path) -> torch.Tensor | None:
    """Target ids of the draft vocabulary (index + d2t[index]), checked against t2d and the
    config's draft_vocab_size; None for the full vocabulary."""
    t2d = state.pop("t2d", None)
    if "d2t" not in state:
        return None
    d2t = state.pop("d2t")
    if d2t.dim() != 1 or d2t.is_floating_point():
        raise UserError(f"d2t in {folder} must be a 1-d integer tensor (got {tuple(d2t.shape)} {d2t.dtype}).")
    ids = d2t.long() + torch.arange(d2t.numel())
    n = cfg.get("draft_vocab_size")
    if n is not None and n != ids.numel():
        raise UserError(f"d2t in {folder} has {ids.numel()} entries; config.json says draft_vocab_size {n}.")
    if ids.numel() == 0 or int(ids.min()) < 0 or int(ids.max()) >= V or ids.unique().numel() != ids.numel():
        raise UserError(f"d2t in {folder} does not map the draft vocabulary onto distinct target ids < {V}.")
    if t2d is not None:
        mask = torch.zeros(V, dtype=torch.bool)
        mask[ids] = True
        if t2d.shape != (V,) or not torch.equal(t2d.bool(), mask):
            raise UserError(f"t2d in {folder} disagrees with d2t (they must mark the same {ids.numel()} target ids).")
    return ids


def head3_from_checkpoint(folder: Path, cfg: dict, state: dict,
                          target_args: LlamaArgs) -> tuple[Eagle3Head, torch.Tensor | None]:
    """An EAGLE-3 head from a checkpoint read by head.read_checkpoint (loading.load_draft_head);
    returns (head, its own LM head weight or None). Clear errors for a missing, misshapen or
    inconsistent tensor."""
    args = head_args(cfg, target_args)
    args.qkv_bias = "midlayer.self_attn.q_proj.bias" in state
    th = cfg.get("target_hidden_size")
    if th is not None and th != target_args.dim:
        raise UserError(f"The EAGLE-3 head in {folder} reads target states of width {th}; the target's "
                        f"are {target_args.dim}.")
    aux = aux_layers_of(cfg, target_args.n_layers)
    fc = state.get("fc.weight")
    if fc is not None and tuple(fc.shape) != (args.dim, len(aux) * args.dim):
        raise UserError(f"fc.weight in {folder} is {tuple(fc.shape)}; an EAGLE-3 head fusing {len(aux)} target "
                        f"layers needs ({args.dim}, {len(aux) * args.dim}).")
    draft_ids = _draft_vocab(state, cfg, args.vocab_size, folder)
    own_lm = state.pop("lm_head.weight", None)
    rows = args.vocab_size if draft_ids is None else draft_ids.numel()
    if own_lm is not None and tuple(own_lm.shape) != (rows, args.dim):
        raise UserError(f"lm_head.weight in {folder} is {tuple(own_lm.shape)}; the draft vocabulary needs "
                        f"({rows}, {args.dim}).")
    head = Eagle3Head(args, aux, fc_bias="fc.bias" in state, draft_vocab=draft_ids,
                      norm_before_residual=bool(cfg.get("norm_before_residual", False)))
    load_weights(head, state, folder, "EAGLE-3")
    return head, own_lm


def save_head3(head: Eagle3Head, out: Path, card: str | None = None, dtype: torch.dtype = torch.float16) -> None:
    """Write config.json + model.safetensors in the official EAGLE-3 layout that
    head3_from_checkpoint (and SGLang / vLLM) load: fc, midlayer.*, norm, lm_head (the head's own or
    the target's rows it uses), d2t and t2d; the frozen embedding is left out. The aux layers go in
    eagle_config.eagle_aux_hidden_state_layer_ids as layer outputs (id = layer entered - 1)."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous().cpu() for k, v in head.state_dict().items()
             if k != "embed_tokens.weight"}
    state["lm_head.weight"] = head.lm_weight.detach().to(dtype).contiguous().cpu()
    a = head.args
    if head.draft_ids is not None:
        ids = head.draft_ids.cpu().long()
        state["d2t"] = ids - torch.arange(ids.numel())
        t2d = torch.zeros(a.vocab_size, dtype=torch.bool)
        t2d[ids] = True
        state["t2d"] = t2d
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = head_config(a, head.fc_bias, None if head.draft_ids is None else head.draft_ids.numel())
    cfg.update({"architectures": ["LlamaForCausalLMEagle3"], "target_hidden_size": a.dim,
                "tie_word_embeddings": False, "torch_dtype": str(dtype).replace("torch.", ""),
                "norm_before_residual": head.midlayer.norm_before_residual,
                "eagle_config": {"eagle_aux_hidden_state_layer_ids": [i - 1 for i in head.aux_layers]}})
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if card:
        (out / "README.md").write_text(card)
