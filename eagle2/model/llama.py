"""A lean Llama-family transformer (Llama, Vicuna, Mistral-style, Qwen2) over HF weights.

gpt-fast style: plain modules, a preallocated KV cache, and one forward that takes explicit
positions and an explicit attention mask, so tree attention and cache commits are ours to control.
The same Block serves the target and the EAGLE-1/2 draft head (which has no input norm); the
default head, EAGLE-3, has its own layer (head3.py) built from this file's Attention and MLP. The
q4_1 backend (quantized.py) runs the same maths on the GGUF's blocks in C; forward.py holds both
behind one interface.
"""
from __future__ import annotations

from dataclasses import dataclass, field

import torch
import torch.nn.functional as F
from torch import nn


@dataclass
class LlamaArgs:
    vocab_size: int
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    intermediate: int
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0
    rope_parameters: dict = field(default_factory=dict)
    qkv_bias: bool = False
    tie_embeddings: bool = False
    max_positions: int = 4096
    eos_ids: tuple = ()

    @classmethod
    def from_hf(cls, cfg: dict) -> "LlamaArgs":
        heads = cfg["num_attention_heads"]
        rope = dict(cfg.get("rope_parameters") or cfg.get("rope_scaling") or {})
        theta = rope.get("rope_theta", cfg.get("rope_theta", 10000.0))
        eos = cfg.get("eos_token_id")
        eos = tuple(eos) if isinstance(eos, list) else ((eos,) if eos is not None else ())
        return cls(
            vocab_size=cfg["vocab_size"], dim=cfg["hidden_size"], n_layers=cfg["num_hidden_layers"],
            n_heads=heads, n_kv_heads=cfg.get("num_key_value_heads") or heads,
            head_dim=cfg.get("head_dim") or cfg["hidden_size"] // heads,
            intermediate=cfg["intermediate_size"], norm_eps=cfg.get("rms_norm_eps", 1e-5),
            rope_theta=theta, rope_parameters=rope,
            qkv_bias=bool(cfg.get("attention_bias") or cfg.get("qkv_bias")
                          or cfg.get("model_type") == "qwen2"),
            tie_embeddings=bool(cfg.get("tie_word_embeddings", False)),
            max_positions=int(cfg.get("max_position_embeddings", 4096)), eos_ids=eos)


def rope_tables(args: LlamaArgs, n: int, device=None) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables [n, head_dim] for positions 0..n-1, honouring the config's RoPE scaling
    (llama3, linear, yarn... via transformers' own init functions, so the maths matches)."""
    rope_type = args.rope_parameters.get("rope_type", args.rope_parameters.get("type", "default"))
    scale = 1.0
    if rope_type in (None, "default"):
        inv = 1.0 / (args.rope_theta ** (torch.arange(0, args.head_dim, 2, dtype=torch.float64) / args.head_dim))
    else:
        from transformers import LlamaConfig
        from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS
        cfg = LlamaConfig(hidden_size=args.dim, num_attention_heads=args.n_heads, head_dim=args.head_dim,
                          max_position_embeddings=args.max_positions,
                          rope_parameters={"rope_theta": args.rope_theta, **args.rope_parameters})
        inv, scale = ROPE_INIT_FUNCTIONS[rope_type](cfg, "cpu")
        inv = inv.double()
    t = torch.arange(n, dtype=torch.float64)
    freqs = torch.outer(t, inv)
    emb = torch.cat([freqs, freqs], dim=-1)
    return (emb.cos() * scale).float().to(device), (emb.sin() * scale).float().to(device)


def rope_covering(tables: tuple, args: LlamaArgs, n: int, like: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """cos/sin tables covering positions < n: `tables` (cos, sin) where they already do, else new
    ones in `like`'s dtype and device for at least 2048 positions, so that they grow rarely. The
    target and its head each keep theirs (grown on demand, shared read-only)."""
    cos, sin = tables
    if cos is None or cos.shape[0] < n:
        cos, sin = rope_tables(args, max(n, 2048), like.device)
        cos, sin = cos.to(like.dtype), sin.to(like.dtype)
    return cos, sin


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    # x [B, h, T, d]; cos/sin [T, d] (HF's rotate-half convention)
    half = x.shape[-1] // 2
    rot = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rot * sin


class RMSNorm(nn.Module):
    def __init__(self, dim: int, eps: float):
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.ones(dim))

    def forward(self, x):
        dt = x.dtype
        x = x.float()
        x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.weight * x.to(dt)


class KVCache:
    """Preallocated K/V for every layer of one sequence (or a batch): [layers, batch, kv_heads,
    max_len, head_dim]; batch is 1 for a decoder."""

    def __init__(self, n_layers, n_kv_heads, max_len, head_dim, dtype, device, batch=1):
        shape = (n_layers, batch, n_kv_heads, max_len, head_dim)
        self.k = torch.zeros(shape, dtype=dtype, device=device)
        self.v = torch.zeros(shape, dtype=dtype, device=device)
        self.max_len = max_len
        self.length = 0  # committed tokens

    def write(self, layer: int, start: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Store one layer's new K/V [B, kv, T, d] at slots start..start+T-1 (uncommitted)."""
        T = k.shape[2]
        self.k[layer, :, :, start:start + T] = k
        self.v[layer, :, :, start:start + T] = v

    def advance(self, n: int) -> None:
        """Commit the n slots just written after `length` (already contiguous)."""
        self.length += n

    def commit(self, slots: torch.Tensor) -> None:
        """Keep the K/V at absolute `slots` (ascending, all >= length), moved to length.. ."""
        n = slots.numel()
        L = self.length
        self.k[:, :, :, L:L + n] = self.k[:, :, :, slots]
        self.v[:, :, :, L:L + n] = self.v[:, :, :, slots]
        self.length = L + n


def _onednn_ok() -> bool:
    return hasattr(torch.ops.mkldnn, "_linear_pointwise") and torch.backends.mkldnn.is_available()


class PackedWeight:
    """Copies of a frozen [out, in] weight laid out for fast CPU inference, made once:
    - for 2+ rows (tree verification, draft calls), reordered for oneDNN's matmul: MKL's sgemm
      repacks the weight on every call, which dominates at 2-64 rows;
    - for one row (plain decoding, the draft's root call), transposed to [in, out]: a row vector
      times a row-major matrix streams it faster than the GEMV over [out, in].
    A whole target forward + logits got 1.09x faster for 1 token, 1.3-1.5x for 2-64 tokens
    (`python -m eagle2 profile --compare-pack`, interleaved; benchmarks/README.md).
    Inference only: the copies do not follow later changes of the weight, so `valid_for` checks
    that it is still the same, unmodified tensor. quantized.Q8Weight has the same contract."""

    def __init__(self, weight: torch.Tensor, rows_hint: int = 16):
        w = weight.detach()
        self.data = torch.ops.mkldnn._reorder_linear_weight(w, rows_hint)
        self.t = w.T.contiguous()
        self.key = (w.data_ptr(), w._version, tuple(w.shape))

    def valid_for(self, weight: torch.Tensor) -> bool:
        return self.key == (weight.data_ptr(), weight._version, tuple(weight.shape))

    def apply(self, x2: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        """x2 [rows, in] @ weight.T (+ bias)."""
        if x2.shape[0] == 1:
            return x2 @ self.t if bias is None else torch.addmm(bias, x2, self.t)
        return torch.ops.mkldnn._linear_pointwise(x2.contiguous(), self.data, bias, "none", [], "")

    @staticmethod
    def build(weight: torch.Tensor) -> "PackedWeight | None":
        if weight.device.type != "cpu" or weight.dtype != torch.float32 or not _onednn_ok():
            return None
        try:
            return PackedWeight(weight)
        except (RuntimeError, AttributeError, TypeError):  # a torch build without this op: plain path
            return None


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None,
           packed: PackedWeight | None = None) -> torch.Tensor:
    """x @ weight.T (+ bias), through the prepared copy (`packed`: a PackedWeight or a
    quantized.Q8Weight, one contract) when it is current."""
    if (packed is None or not packed.valid_for(weight)
            or (torch.is_grad_enabled() and (weight.requires_grad or x.requires_grad))):
        return F.linear(x, weight, bias)
    rows = x.numel() // x.shape[-1]
    return packed.apply(x.reshape(rows, -1), bias).reshape(*x.shape[:-1], -1)


class Linear(nn.Linear):
    """nn.Linear that can carry a prepared copy of its frozen weight for few-row inference
    (`pack()`, once at load)."""

    packed: PackedWeight | None = None

    def pack(self, prepare=PackedWeight.build) -> None:
        self.packed = prepare(self.weight)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return linear(x, self.weight, self.bias, self.packed)


def pack_linears(module: nn.Module, prepare=PackedWeight.build) -> None:
    """Prepare every Linear of a frozen module once: `prepare(weight)` gives its copy or None
    (PackedWeight.build: a no-op off CPU fp32)."""
    for m in module.modules():
        if isinstance(m, Linear):
            m.pack(prepare)


def _additive(mask: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """A bool mask (True = may attend) as the additive float mask the CPU flash kernel takes."""
    return torch.zeros(mask.shape, dtype=like.dtype, device=like.device).masked_fill(~mask, float("-inf"))


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, past_k: torch.Tensor, past_v: torch.Tensor,
           past_mask: torch.Tensor | None, new_mask: torch.Tensor | None) -> torch.Tensor:
    """Attention of T new queries q [B, H, T, d] over the cached keys past_k/past_v [B, kv, S, d]
    (a view of the cache: slots 0..S-1) and their own keys k/v [B, kv, T, d], as one softmax over
    both. Masks are bool, True = may attend: past_mask [.., T, S], new_mask [.., T, T]; None = all.
    On CPU `attend_in_parts`, elsewhere `attend_concatenated`."""
    fn = attend_in_parts if q.device.type == "cpu" else attend_concatenated
    return fn(q, k, v, past_k, past_v, past_mask, new_mask)


def attend_in_parts(q, k, v, past_k, past_v, past_mask, new_mask) -> torch.Tensor:
    """`attend` as the CPU flash kernel twice, once per part, merged by the log-sum-exps it
    returns: the cache is read where it lies (no copy, whatever its length)."""
    flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
    out, lse = flash(q, k, v, attn_mask=None if new_mask is None else _additive(new_mask, q))
    if past_k.shape[2] == 0:
        return out
    out_past, lse_past = flash(q, past_k, past_v, attn_mask=None if past_mask is None else _additive(past_mask, q))
    top = torch.maximum(lse, lse_past)
    w_new, w_past = torch.exp(lse - top).unsqueeze(-1), torch.exp(lse_past - top).unsqueeze(-1)
    # a row that sees no cached key (lse -inf) weighs 0 there, whatever its output holds
    mixed = out * w_new + torch.where(w_past > 0, out_past * w_past, 0.0)
    return (mixed / (w_new + w_past)).to(q.dtype)


def attend_concatenated(q, k, v, past_k, past_v, past_mask, new_mask) -> torch.Tensor:
    """`attend` as one SDPA over the cached and new keys side by side (a copy of the visible cache)."""
    mask = None
    if past_mask is not None or new_mask is not None:
        T, S = q.shape[2], past_k.shape[2]
        pm = past_mask if past_mask is not None else q.new_ones((T, S), dtype=torch.bool)
        nm = new_mask if new_mask is not None else q.new_ones((T, T), dtype=torch.bool)
        rows = torch.broadcast_shapes(pm.shape[:-1], nm.shape[:-1])
        mask = torch.cat([pm.expand(*rows, S), nm.expand(*rows, T)], -1)
    return F.scaled_dot_product_attention(q, torch.cat([past_k, k], 2), torch.cat([past_v, v], 2),
                                          attn_mask=mask, enable_gqa=True)


class Attention(nn.Module):
    def __init__(self, a: LlamaArgs, in_dim: int | None = None):
        """`in_dim`: width of the input when it is not a.dim (EAGLE-3's layer reads 2 x dim)."""
        super().__init__()
        self.a = a
        d = in_dim or a.dim
        self.q_proj = Linear(d, a.n_heads * a.head_dim, bias=a.qkv_bias)
        self.k_proj = Linear(d, a.n_kv_heads * a.head_dim, bias=a.qkv_bias)
        self.v_proj = Linear(d, a.n_kv_heads * a.head_dim, bias=a.qkv_bias)
        self.o_proj = Linear(a.n_heads * a.head_dim, a.dim, bias=False)

    def forward(self, x, cos, sin, past_k=None, past_v=None, past_mask=None, new_mask=None):
        """x [B,T,D] -> (output [B,T,D], its K, its V [B, kv, T, d]). With past_k/past_v (a view
        of the cache's slots before these tokens) attention spans them and the new tokens under
        the masks (see `attend`); without, plain causal attention (training, feature extraction).
        The caller stores the returned K/V (KVCache.write): the forward writes nothing."""
        B, T, _ = x.shape
        a = self.a
        q = self.q_proj(x).view(B, T, a.n_heads, a.head_dim).transpose(1, 2)
        k = self.k_proj(x).view(B, T, a.n_kv_heads, a.head_dim).transpose(1, 2)
        v = self.v_proj(x).view(B, T, a.n_kv_heads, a.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        if past_k is None:
            out = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
        else:
            out = attend(q, k, v, past_k, past_v, past_mask, new_mask)
        return self.o_proj(out.transpose(1, 2).reshape(B, T, -1)), k, v


class MLP(nn.Module):
    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.gate_proj = Linear(a.dim, a.intermediate, bias=False)
        self.up_proj = Linear(a.dim, a.intermediate, bias=False)
        self.down_proj = Linear(a.intermediate, a.dim, bias=False)

    def forward(self, x):
        return self.down_proj(F.silu(self.gate_proj(x)) * self.up_proj(x))


class Block(nn.Module):
    def __init__(self, a: LlamaArgs, input_norm: bool = True):
        super().__init__()
        self.input_layernorm = RMSNorm(a.dim, a.norm_eps) if input_norm else nn.Identity()
        self.self_attn = Attention(a)
        self.post_attention_layernorm = RMSNorm(a.dim, a.norm_eps)
        self.mlp = MLP(a)

    def forward(self, x, cos, sin, past_k=None, past_v=None, past_mask=None, new_mask=None):
        """-> (output, its K, its V): Attention.forward's arguments and contract."""
        o, k, v = self.self_attn(self.input_layernorm(x), cos, sin, past_k, past_v, past_mask, new_mask)
        x = x + o
        return x + self.mlp(self.post_attention_layernorm(x)), k, v


def split_masks(committed: int, start: int, tree_mask: torch.Tensor | None, T: int, device):
    """(past_mask [T, start] or None, new_mask [T, T] or None) for T new tokens written at slots
    start.. of a cache whose slots before `committed` are committed: those are always visible;
    tree slots committed..start-1 and the new tokens follow `tree_mask` [T, start - committed + T]
    (earlier tree slots that are ancestors, and self) or, when None, causal order among the new
    tokens (start must then equal committed). None means all visible. The mask may be bool or
    bytes (nonzero = visible, as the tree's layout and the kernels hold it)."""
    tree = start - committed
    if tree_mask is None:
        return None, (torch.ones(T, T, dtype=torch.bool, device=device).tril() if T > 1 else None)
    tree_mask = tree_mask.bool()   # no copy when it is bool already
    past = None
    if tree > 0:
        past = torch.cat([torch.ones(T, committed, dtype=torch.bool, device=device), tree_mask[:, :tree]], 1)
    return past, tree_mask[:, tree:]


class LlamaModel(nn.Module):
    """The target: embeddings, blocks, final norm, LM head. forward() returns the post-norm
    features (EAGLE's f); logits() applies the LM head to whichever rows are needed."""

    def __init__(self, a: LlamaArgs):
        super().__init__()
        self.args = a
        # Built on the meta device, every weight then assigned from the checkpoint (load_target), so
        # the table gets no random init: on meta, normal_ runs a Python reference that imports
        # torch's compiler (dynamo, sympy: 74 MiB resident, 1,000 modules) for nothing.
        self.embed_tokens = nn.Embedding(a.vocab_size, a.dim, _weight=torch.empty(a.vocab_size, a.dim))
        self.layers = nn.ModuleList(Block(a) for _ in range(a.n_layers))
        self.norm = RMSNorm(a.dim, a.norm_eps)
        self.lm_head = Linear(a.dim, a.vocab_size, bias=False)
        if a.tie_embeddings:
            self.lm_head.weight = self.embed_tokens.weight
        self._cos = self._sin = None
        # What an EAGLE-3 draft head reads (load_bundle sets it from the head): the hidden states
        # entering these layers (n_layers = the last layer's output, before the final norm),
        # side by side. Empty: the head reads the final post-norm features.
        self.aux_layers: tuple[int, ...] = ()

    def rope(self, n: int):
        """cos/sin tables covering positions < n (grown on demand, shared read-only)."""
        self._cos, self._sin = rope_covering((self._cos, self._sin), self.args, n, self.lm_head.weight)
        return self._cos, self._sin

    def rope_at(self, positions: torch.Tensor):
        """cos/sin rows of these positions (the tables cover every cache this model made)."""
        return self._cos[positions], self._sin[positions]

    def new_cache(self, max_len: int, batch: int = 1) -> KVCache:
        """A KV cache for one sequence (or a batch); decoders own theirs, so sessions never
        share state."""
        w = self.lm_head.weight
        self.rope(max_len + 1)
        a = self.args
        return KVCache(a.n_layers, a.n_kv_heads, max_len, a.head_dim, w.dtype, w.device, batch)

    @torch.no_grad()
    def forward_cached(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor,
                       tree_mask: torch.Tensor | None = None, aux: list | None = None) -> torch.Tensor:
        """Run new tokens [T] after the committed cache; K/V are written at slots
        length..length+T-1 and stay uncommitted until cache.commit(). `tree_mask` [T,T]
        (ancestors + self) or None for causal order. Returns post-norm features [T, dim]
        (`aux`: see forward_batch)."""
        start, T = cache.length, tokens.numel()
        if start + T > cache.max_len:
            raise RuntimeError("KV cache full")
        _, new_mask = split_masks(start, start, tree_mask, T, tokens.device)
        return self._run(cache, tokens.view(1, T), positions, None, new_mask, aux)[0]

    @torch.no_grad()
    def forward_draft(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor,
                      tree_mask: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
        """forward_cached for a speculative decoder: (post-norm features [T, dim], what the draft
        head reads at these rows): the same tensor, or with `aux_layers` those layers' states
        side by side [T, len(aux_layers) * dim] (EAGLE-3)."""
        if not self.aux_layers:
            feats = self.forward_cached(cache, tokens, positions, tree_mask)
            return feats, feats
        aux = []
        feats = self.forward_cached(cache, tokens, positions, tree_mask, aux)
        return feats, torch.cat(aux, dim=-1)[0]

    @torch.no_grad()
    def forward_batch(self, cache: KVCache, tokens: torch.Tensor, positions: torch.Tensor,
                      mask: torch.Tensor | None, aux: list | None = None) -> torch.Tensor:
        """tokens [B,T] written at slots cache.length.. of each row; positions [T] or [B,T];
        mask broadcastable to [B,1,T,length+T] (None: all visible). Returns features [B,T,dim].
        `aux`, a list, receives the hidden states [B,T,dim] entering the layers in `aux_layers`,
        in layer order."""
        start = cache.length
        past_mask, new_mask = (None, None) if mask is None else (mask[..., :start], mask[..., start:])
        return self._run(cache, tokens, positions, past_mask, new_mask, aux)

    def _run(self, cache: KVCache, tokens, positions, past_mask, new_mask, aux: list | None):
        """`step` over the cache's committed slots, then its new K/V stored after them."""
        start = cache.length
        cos, sin = self.rope_at(positions)
        if cos.dim() == 3:  # per-row positions: [B,1,T,d] to broadcast over heads
            cos, sin = cos.unsqueeze(1), sin.unsqueeze(1)
        feats, taps, new_k, new_v = self.step(self.embed_tokens(tokens), cos, sin, cache.k[:, :, :, :start],
                                              cache.v[:, :, :, :start], past_mask, new_mask,
                                              with_aux=aux is not None)
        for i in range(len(self.layers)):
            cache.write(i, start, new_k[i], new_v[i])
        if aux is not None:
            aux.extend(taps)
        return feats

    def step(self, x: torch.Tensor, cos, sin, past_k: torch.Tensor, past_v: torch.Tensor,
             past_mask: torch.Tensor | None, new_mask: torch.Tensor | None, with_aux: bool = False):
        """The target's forward, pure:
        embeddings x [B,T,D] after the cached slots past_k/past_v [L,B,kv,S,d] (views) ->
        (post-norm features [B,T,D], the states entering the `aux_layers` (with_aux), the new K
        and V [L,B,kv,T,d])."""
        taps = self.aux_layers if with_aux else ()
        aux, new_k, new_v = [], [], []
        for i, layer in enumerate(self.layers):
            if i in taps:
                aux.append(x)
            x, k, v = layer(x, cos, sin, past_k[i], past_v[i], past_mask, new_mask)
            new_k.append(k)
            new_v.append(v)
        if len(self.layers) in taps:
            aux.append(x)
        return self.norm(x), aux, torch.stack(new_k), torch.stack(new_v)

    def forward_full(self, tokens: torch.Tensor, aux: list | None = None) -> torch.Tensor:
        """Causal forward over [B, T] without a cache (training features). Returns [B, T, dim];
        `aux` as in forward_batch."""
        T = tokens.shape[1]
        cos, sin = self.rope(T)
        cos, sin = cos[:T], sin[:T]
        taps = self.aux_layers if aux is not None else ()
        x = self.embed_tokens(tokens)
        for i, layer in enumerate(self.layers):
            if i in taps:
                aux.append(x)
            x = layer(x, cos, sin)[0]
        if len(self.layers) in taps:
            aux.append(x)
        return self.norm(x)

    def logits(self, features: torch.Tensor) -> torch.Tensor:
        return self.lm_head(features).float()


def hf_key_map(key: str) -> str | None:
    """HF LlamaForCausalLM / Qwen2ForCausalLM key -> our module key."""
    if key.startswith("model."):
        key = key[len("model."):]
    if "rotary_emb" in key:
        return None
    return key
