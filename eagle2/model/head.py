"""The EAGLE draft head (EAGLE-1/2 layout), its cache, and checkpoint load/save.

g_i = Block_no_input_norm(fc([e(x_{i+1}); f_i])) predicts the target's feature f_{i+1};
its logits come from the target's LM head, or from a reduced-vocabulary slice of it whose
draft index -> target id map (`d2t`, EAGLE-3 convention: target = index + d2t[index]) the
checkpoint records. `DraftHead` is what decoding needs of any head (the EAGLE-3 one is head3.py).
"""
from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file
from torch import nn

from ..errors import UserError
from .llama import (Block, KVCache, Linear, LlamaArgs, PackedWeight, linear, pack_linears, rope_covering,
                    split_masks)
from .ttt import unrolled_passes


class DraftHead(nn.Module):
    """What the decoder, HeadRunner and the policies use of a draft head, whatever its kind:
    a KV cache, RoPE tables, log-probabilities over the draft vocabulary and their map back to
    target ids. A subclass has `embed_tokens` and `fc` (whose weight fixes device and dtype) and
    defines step(emb, hidden, cos, sin, past_k, past_v, past_mask, new_mask) -> (g, K, V), its
    pure forward: g [B, T, D] are the vectors draft_logprobs reads and that tree nodes feed back as
    their children's features."""

    # Target layers whose input hidden states the head reads (LlamaModel.aux_layers); empty: the
    # target's final post-norm features.
    aux_layers: tuple[int, ...] = ()

    def __init__(self, args: LlamaArgs, draft_vocab: torch.Tensor | None = None):
        super().__init__()
        self.args = args
        # Reduced vocabulary: target ids the head may propose (sorted), or None for all.
        self.register_buffer("draft_ids", draft_vocab, persistent=False)
        self.lm_weight: torch.Tensor | None = None  # [V_draft, dim], set by attach()
        self.lm_packed: PackedWeight | None = None
        self._cos = self._sin = None

    def attach(self, target_lm_weight: torch.Tensor, own_lm_weight: torch.Tensor | None = None) -> None:
        """Use the target's frozen LM head (its draft-vocabulary rows), or the head's own."""
        if own_lm_weight is not None:
            self.lm_weight = own_lm_weight
        elif self.draft_ids is not None:
            self.lm_weight = target_lm_weight.detach()[self.draft_ids].contiguous()
        else:
            self.lm_weight = target_lm_weight
        self.lm_packed = None

    def pack(self, prepare=PackedWeight.build) -> None:
        """Prepare the frozen weights' copies for inference once (llama.pack_linears)."""
        pack_linears(self, prepare)
        self.lm_packed = prepare(self.lm_weight)

    def rope(self, n: int):
        self._cos, self._sin = rope_covering((self._cos, self._sin), self.args, n, self.fc.weight)
        return self._cos, self._sin

    def rope_at(self, positions: torch.Tensor):
        """cos/sin rows of these positions (the tables cover every cache this model made)."""
        return self._cos[positions], self._sin[positions]

    def new_cache(self, max_len: int) -> KVCache:
        w = self.fc.weight
        self.rope(max_len + 1)
        a = self.args
        return KVCache(1, a.n_kv_heads, max_len, a.head_dim, w.dtype, w.device)

    def draft_logprobs(self, g: torch.Tensor) -> torch.Tensor:
        """Log-probabilities over the draft vocabulary [.., V_draft] (float32)."""
        return torch.log_softmax(linear(g, self.lm_weight, None, self.lm_packed).float(), dim=-1)

    def forward_draft(self, cache: KVCache, features, tokens, positions, start: int, tree_mask=None,
                      k: int = 0, last_only: bool = False) -> tuple[torch.Tensor, torch.Tensor, tuple | None]:
        """forward_cached, then draft_logprobs of every row (last_only: of the last row alone), and
        with k > 0 each such row's k most likely draft tokens: (g [T, D], log-probs [T, V_draft],
        (their log-probs [T, k'], target ids [T, k']) or None), k' = min(k, V_draft), best first
        (forward.DraftForward.step's contract)."""
        g = self.forward_cached(cache, features, tokens, positions, start, tree_mask)
        logp = self.draft_logprobs(g[-1:] if last_only else g)
        top = None
        if k:
            v, i = logp.topk(min(k, logp.shape[-1]), dim=-1)
            top = (v, self.to_target_ids(i))
        return g, logp, top

    @torch.no_grad()
    def forward_cached(self, cache: KVCache, features, tokens, positions, start: int,
                       tree_mask=None) -> torch.Tensor:
        """Pairs (features [T, F], tokens [T]) written at cache slots start..start+T-1 -> g [T, D].
        Slots before cache.length are always visible; slots from there up to start+T follow
        `tree_mask` [T, start+T-length] (None: causal, start must equal length)."""
        c = cache
        T = tokens.numel()
        if start + T > c.max_len:
            raise RuntimeError("draft cache full")
        past_mask, new_mask = split_masks(c.length, start, tree_mask, T, tokens.device)
        cos, sin = self.rope_at(positions)
        g, k, v = self.step(self.embed_tokens(tokens)[None], self.hidden_input(features)[None], cos, sin,
                            c.k[0, :, :, :start], c.v[0, :, :, :start], past_mask, new_mask)
        c.write(0, start, k, v)
        return g[0]

    def hidden_input(self, features: torch.Tensor) -> torch.Tensor:
        """What `step` reads as `hidden`: for an EAGLE-1/2 head the features as given (its fc is
        inside `step`)."""
        return features

    def to_target_ids(self, idx: torch.Tensor) -> torch.Tensor:
        return idx if self.draft_ids is None else self.draft_ids[idx]


class EagleHead(DraftHead):
    def __init__(self, args: LlamaArgs, fc_bias: bool = True, draft_vocab: torch.Tensor | None = None):
        super().__init__(args, draft_vocab)
        self.fc_bias = fc_bias
        self.embed_tokens = nn.Embedding(args.vocab_size, args.dim)
        self.fc = Linear(2 * args.dim, args.dim, bias=fc_bias)
        self.layers = nn.ModuleList([Block(args, input_norm=False)])

    def inputs(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        return self.fc(torch.cat([self.embed_tokens(tokens), features], dim=-1))

    def step(self, emb, hidden, cos, sin, past_k, past_v, past_mask, new_mask):
        """DraftHead.step: the pair (embedding, target features) through fc and the layer."""
        return self.layers[0](self.fc(torch.cat([emb, hidden], dim=-1)), cos, sin, past_k, past_v, past_mask,
                              new_mask)

    def forward_train(self, features: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """Teacher-forced causal pass: features [B,T,D] of x_0..x_{T-1}, tokens [B,T] = x_1..x_T."""
        T = tokens.shape[1]
        cos, sin = self.rope(T)
        x = self.inputs(features, tokens)
        return self.layers[0](x, cos[:T], sin[:T])[0]

    def forward_train_unrolled(self, features: torch.Tensor, tokens: torch.Tensor, g1: torch.Tensor,
                               steps: int) -> list[torch.Tensor]:
        """Training-time test (HASS / EAGLE-3 style): `steps` - 1 further passes in which the head
        reads its own predicted features, as deeper draft nodes do. In pass s (s = 2..steps) row j
        is the depth-s node at position j: the pair (pass s-1's output at j-1, x_{j+1}), attending
        to the true pairs up to j-s+1, to its ancestors (pass m's row j-s+m, m = 2..s-1) and to
        itself, exactly as at decode time. Each pass has forward_train's targets (f_{j+1}); rows
        j < s-1 have no such chain and belong out of the loss. g1 = forward_train's output.
        Returns the outputs of passes 2..steps."""
        blk = self.layers[0]

        def step_inputs(own):
            x = self.inputs(own, tokens)
            return blk.input_layernorm(x), x

        cos, sin = self.rope(features.shape[1])
        return unrolled_passes(blk, cos, sin, blk.input_layernorm(self.inputs(features, tokens)), g1, steps,
                               step_inputs)


# ---------------------------------------------------------------- checkpoints (official layout)

def head_config(args: LlamaArgs, fc_bias: bool, draft_vocab_size: int | None) -> dict:
    cfg = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": args.dim, "intermediate_size": args.intermediate,
        "num_attention_heads": args.n_heads, "num_key_value_heads": args.n_kv_heads,
        "head_dim": args.head_dim, "num_hidden_layers": 1, "vocab_size": args.vocab_size,
        "rms_norm_eps": args.norm_eps, "max_position_embeddings": args.max_positions,
        "rope_theta": args.rope_theta, "hidden_act": "silu", "bias": fc_bias,
        "qkv_bias": args.qkv_bias, "torch_dtype": "float32",
    }
    if args.rope_parameters and args.rope_parameters.get("rope_type", "default") != "default":
        cfg["rope_scaling"] = args.rope_parameters
    if draft_vocab_size:
        cfg["draft_vocab_size"] = draft_vocab_size
    return cfg


def save_head(head: EagleHead, out: Path, extra_card: str | None = None, embed: bool = False,
              dtype: torch.dtype = torch.float16) -> None:
    """Write config.json + model.safetensors in the official layout. The embedding is the target's
    (frozen) and is left out unless `embed`; fp16 keeps a shipped head a few MB."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().to(dtype).contiguous().cpu() for k, v in head.state_dict().items()
             if embed or k != "embed_tokens.weight"}
    if head.draft_ids is not None:
        ids = head.draft_ids.cpu().long()
        state["d2t"] = ids - torch.arange(ids.numel())
    save_file(state, str(out / "model.safetensors"), metadata={"format": "pt"})
    cfg = head_config(head.args, head.fc_bias, None if head.draft_ids is None else head.draft_ids.numel())
    cfg["torch_dtype"] = str(dtype).replace("torch.", "")
    (out / "config.json").write_text(json.dumps(cfg, indent=2))
    if extra_card:
        (out / "README.md").write_text(extra_card)


def _read_state(folder: Path) -> dict:
    st = folder / "model.safetensors"
    if st.exists():
        return load_file(str(st))
    binf = folder / "pytorch_model.bin"
    if binf.exists():
        return torch.load(str(binf), map_location="cpu", weights_only=True)  # safe: tensors only
    raise UserError(f"{folder} has no model.safetensors or pytorch_model.bin.")


def read_checkpoint(folder: Path) -> tuple[dict, dict]:
    """(config.json as a dict, state dict) of a draft head folder of any kind; UserError for a
    missing, malformed or unreadable file."""
    folder = Path(folder)
    try:
        cfg = json.loads((folder / "config.json").read_text())
    except FileNotFoundError:
        raise UserError(f"Draft head folder {folder} has no config.json.") from None
    except json.JSONDecodeError as e:
        raise UserError(f"Draft head config {folder / 'config.json'} is not valid JSON ({e.msg}).") from None
    if not isinstance(cfg, dict):
        raise UserError(f"Draft head config {folder / 'config.json'} is not a JSON object.")
    try:
        state = _read_state(folder)
    except UserError:
        raise
    except Exception as e:
        raise UserError(f"Draft head weights in {folder} are unreadable or corrupt ({type(e).__name__}: "
                        f"{str(e)[:120]}).") from None
    return cfg, state


def head_args(cfg: dict, target_args: LlamaArgs) -> LlamaArgs:
    """The head's one-layer LlamaArgs from its config.json, checked against the target."""
    try:
        args = LlamaArgs.from_hf({**cfg, "num_hidden_layers": 1, "model_type": cfg.get("model_type", "llama")})
    except KeyError as e:
        raise UserError(f"Draft head config lacks {e}.") from None
    if args.dim != target_args.dim or args.vocab_size != target_args.vocab_size:
        raise UserError(f"Draft head (hidden {args.dim}, vocab {args.vocab_size}) does not fit the target "
                        f"(hidden {target_args.dim}, vocab {target_args.vocab_size}).")
    args.rope_parameters = args.rope_parameters or target_args.rope_parameters
    return args


def load_weights(head: DraftHead, state: dict, folder: Path, layout: str) -> None:
    """Load a checkpoint's tensors into `head` (exactly its keys; the embedding may be absent: the
    caller then gives it the target's) and record `has_embed`; UserError on any disagreement."""
    emb = state.get("embed_tokens.weight")
    head.has_embed = emb is not None and emb.numel() > 0
    if not head.has_embed:
        state = {k: v for k, v in state.items() if k != "embed_tokens.weight"}
    try:
        missing, unexpected = head.load_state_dict(state, strict=False)
    except RuntimeError as e:  # tensor shapes disagree with config.json
        first = next((ln.strip() for ln in str(e).splitlines() if "size mismatch" in ln), str(e)[:200])
        raise UserError(f"Draft head checkpoint in {folder} does not match its config.json (tensor "
                        f"shape mismatch: {first[:240]}).") from None
    missing = [m for m in missing if m != "embed_tokens.weight"]
    if missing or unexpected:
        raise UserError(f"Draft head checkpoint in {folder} does not have the {layout} layout "
                        f"(missing {missing[:3]}, unexpected {unexpected[:3]}).")


def head_from_checkpoint(folder: Path, cfg: dict, state: dict,
                         target_args: LlamaArgs) -> tuple[EagleHead, torch.Tensor | None]:
    """An EAGLE-1/2 head from a checkpoint already read (read_checkpoint); returns (head, its own LM
    head weight or None). loading.load_draft_head reads a folder and picks the layout."""
    args = head_args(cfg, target_args)
    args.qkv_bias = "layers.0.self_attn.q_proj.bias" in state
    draft_ids = None
    if "d2t" in state:
        d2t = state.pop("d2t").long()
        draft_ids = d2t + torch.arange(d2t.numel())
    state.pop("t2d", None)
    own_lm = state.pop("lm_head.weight", None)
    head = EagleHead(args, fc_bias="fc.bias" in state, draft_vocab=draft_ids)
    load_weights(head, state, folder, "EAGLE")
    return head, own_lm
