"""EAGLE head checkpoints in the official layout (docs/algorithms.md §1).

Synthetic checkpoints are written for each layout variant (fc with / without bias, Qwen2 q/k/v
biases, pytorch_model.bin, reduced vocabulary with d2t and optionally its own LM head, no stored
embedding); eagle2.model.loading.load_draft_head must return exactly those tensors, the head's maths must equal a
transformers LlamaDecoderLayer with an identity input norm, save_head -> load_draft_head must round-trip,
and corrupt or mismatched checkpoints must raise UserError with a clear message.
"""
from __future__ import annotations

import json
import pickle
import zlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from eagle2.decoding.decoder import Decoder
from eagle2.errors import UserError
from eagle2.model.head import EagleHead, save_head
from eagle2.model.loading import load_draft_head
from eagle2.model.llama import LlamaArgs
from eagle2.model.loading import load_bundle

H, V, HEADS, KV, INTER = 64, 97, 4, 2, 128


@pytest.fixture(scope="module")
def target(tiny_target):
    folder, hf = tiny_target("head-target", vocab=V, hidden=H, heads=HEADS, kv_heads=KV, inter=INTER,
                             lm_std=0.3)
    args = LlamaArgs.from_hf(json.loads((folder / "config.json").read_text()))
    return folder, hf, args


def head_cfg(**extra) -> dict:
    cfg = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": INTER, "num_attention_heads": HEADS, "num_key_value_heads": KV,
           "num_hidden_layers": 1, "vocab_size": V, "rms_norm_eps": 1e-6, "rope_theta": 10000.0,
           "max_position_embeddings": 256, "hidden_act": "silu", "torch_dtype": "float32"}
    cfg.update(extra)
    return cfg


def head_state(seed=0, fc_bias=True, qkv_bias=False, embed=True, draft_vocab=None, own_lm=False) -> dict:
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, std=0.08: std * torch.randn(*s, generator=g)  # noqa: E731
    hd = H // HEADS
    st = {
        "fc.weight": r(H, 2 * H),
        "layers.0.self_attn.q_proj.weight": r(HEADS * hd, H),
        "layers.0.self_attn.k_proj.weight": r(KV * hd, H),
        "layers.0.self_attn.v_proj.weight": r(KV * hd, H),
        "layers.0.self_attn.o_proj.weight": r(H, HEADS * hd),
        "layers.0.mlp.gate_proj.weight": r(INTER, H),
        "layers.0.mlp.up_proj.weight": r(INTER, H),
        "layers.0.mlp.down_proj.weight": r(H, INTER),
        "layers.0.post_attention_layernorm.weight": 1.0 + r(H, std=0.2),
    }
    if embed:
        st["embed_tokens.weight"] = r(V, H, std=0.3)
    if fc_bias:
        st["fc.bias"] = r(H, std=0.2)
    if qkv_bias:
        st["layers.0.self_attn.q_proj.bias"] = r(HEADS * hd, std=0.2)
        st["layers.0.self_attn.k_proj.bias"] = r(KV * hd, std=0.2)
        st["layers.0.self_attn.v_proj.bias"] = r(KV * hd, std=0.2)
    if draft_vocab is not None:
        ids = torch.tensor(draft_vocab, dtype=torch.long)
        st["d2t"] = ids - torch.arange(ids.numel())
        if own_lm:
            st["lm_head.weight"] = r(ids.numel(), H, std=0.3)
    return st


def write_ckpt(folder: Path, cfg: dict, state: dict, fmt: str = "safetensors") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    if fmt == "safetensors":
        save_file(state, str(folder / "model.safetensors"))
    else:
        torch.save(state, str(folder / "pytorch_model.bin"))
    return folder


DRAFT_VOCAB = sorted({0, 1, 2, 3, 5, 8, 13, 21, 34, 55, 89} | set(range(40, 60)))
VARIANTS = {
    "fc-bias": (dict(bias=True), dict(fc_bias=True), "safetensors"),
    "no-fc-bias": (dict(bias=False), dict(fc_bias=False), "safetensors"),
    "qwen2-qkv-bias": (dict(qkv_bias=True), dict(qkv_bias=True), "safetensors"),
    "pytorch-bin": (dict(), dict(), "bin"),
    "pytorch-bin-qkv": (dict(qkv_bias=True, bias=False), dict(qkv_bias=True, fc_bias=False), "bin"),
    "d2t": (dict(draft_vocab_size=len(DRAFT_VOCAB)), dict(draft_vocab=DRAFT_VOCAB), "safetensors"),
    "d2t-own-lm": (dict(draft_vocab_size=len(DRAFT_VOCAB)), dict(draft_vocab=DRAFT_VOCAB, own_lm=True),
                   "safetensors"),
    "no-embed": (dict(), dict(embed=False), "safetensors"),
}


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_official_layout_loads(tmp_path, target, variant):
    folder, _, targs = target
    cfg_extra, st_kw, fmt = VARIANTS[variant]
    state = head_state(seed=zlib.crc32(variant.encode()) % 1000, **st_kw)
    ck = write_ckpt(tmp_path / variant, head_cfg(**cfg_extra), state, fmt)
    head, own = load_draft_head(ck, targs)

    # every tensor round-trips exactly
    sd = head.state_dict()
    for k, v in state.items():
        if k == "d2t":
            assert torch.equal(head.draft_ids, torch.tensor(DRAFT_VOCAB))
        elif k == "lm_head.weight":
            assert own is not None and torch.equal(own, v)
        else:
            assert torch.equal(sd[k], v), k
    assert head.fc_bias == ("fc.bias" in state)
    assert head.args.qkv_bias == ("layers.0.self_attn.q_proj.bias" in state)
    assert (own is not None) == ("lm_head.weight" in state)
    assert head.has_embed == ("embed_tokens.weight" in state)
    assert (head.draft_ids is not None) == ("d2t" in state)

    # in a bundle: embedding and LM head come from the target unless the checkpoint has its own,
    # reduced-vocabulary drafts map back to target ids, and greedy decoding stays lossless
    b = load_bundle(target=str(folder), head=str(ck))
    h = b.head
    assert not h.lm_weight.requires_grad  # drafting must not build autograd graphs
    if "embed_tokens.weight" in state:
        assert torch.equal(h.embed_tokens.weight, state["embed_tokens.weight"])
    else:
        assert torch.equal(h.embed_tokens.weight, b.target.embed_tokens.weight)
    if "lm_head.weight" in state:
        assert torch.equal(h.lm_weight, state["lm_head.weight"])
    elif "d2t" in state:
        assert torch.equal(h.lm_weight, b.target.lm_head.weight[DRAFT_VOCAB])
    else:
        assert torch.equal(h.lm_weight, b.target.lm_head.weight)
    prompt = [5, 17, 33, 2, 71, 64, 8]
    plain = Decoder(b, "plain", max_new_tokens=12, record=False)
    plain.start(input_ids=prompt)
    plain.generate()
    dec = Decoder(b, "eagle2", max_new_tokens=12, record=True, total_tokens=10, depth=3, top_k=3)
    dec.start(input_ids=prompt)
    trace = dec.generate()
    assert dec.generated == plain.generated
    if "d2t" in state:
        allowed = set(DRAFT_VOCAB)
        for s in trace.steps:
            if s.tree is not None:
                assert set(s.tree.tokens[1:]) <= allowed


def hf_reference_head(state: dict, cfg: dict, features: torch.Tensor, tokens: torch.Tensor,
                      target_embed: torch.Tensor) -> torch.Tensor:
    """The EAGLE head computed with transformers' LlamaDecoderLayer (input norm = identity)."""
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaDecoderLayer, LlamaRotaryEmbedding

    c = LlamaConfig(**{k: v for k, v in cfg.items() if k not in ("bias", "qkv_bias")},
                    attention_bias="layers.0.self_attn.q_proj.bias" in state)
    c._attn_implementation = "eager"
    layer = LlamaDecoderLayer(c, layer_idx=0).eval()
    layer.input_layernorm = torch.nn.Identity()
    sd = {k[len("layers.0."):]: v for k, v in state.items() if k.startswith("layers.0.")}
    if "layers.0.self_attn.q_proj.bias" in state:  # attention_bias also puts a bias on o_proj
        sd["self_attn.o_proj.bias"] = torch.zeros(H)
    missing, unexpected = layer.load_state_dict(sd, strict=False)
    assert not unexpected and not [m for m in missing if "input_layernorm" not in m]
    emb = state.get("embed_tokens.weight", target_embed)
    x = torch.cat([emb[tokens], features], dim=-1) @ state["fc.weight"].T
    if "fc.bias" in state:
        x = x + state["fc.bias"]
    T = tokens.shape[-1]
    pos = torch.arange(T)[None]
    cos_sin = LlamaRotaryEmbedding(c)(x, pos)
    mask = torch.full((T, T), float("-inf")).triu(1)[None, None]
    with torch.no_grad():
        out = layer(x, attention_mask=mask, position_ids=pos, position_embeddings=cos_sin)
    return out[0] if isinstance(out, tuple) else out


@pytest.mark.parametrize("variant", ["fc-bias", "no-fc-bias", "qwen2-qkv-bias"])
def test_head_math_matches_transformers_layer(tmp_path, target, variant):
    _, hf, targs = target
    cfg_extra, st_kw, fmt = VARIANTS[variant]
    state = head_state(seed=7, **st_kw)
    cfg = head_cfg(**cfg_extra)
    head, _ = load_draft_head(write_ckpt(tmp_path / variant, cfg, state, fmt), targs)
    head.eval()
    T = 9
    g = torch.Generator().manual_seed(3)
    feats = torch.randn(1, T, H, generator=g)
    toks = torch.randint(0, V, (1, T), generator=g)
    ref = hf_reference_head(state, cfg, feats, toks, hf.model.embed_tokens.weight.detach())[0]
    with torch.no_grad():
        ours_train = head.forward_train(feats, toks)[0]
    assert (ours_train - ref).abs().max().item() < 1e-4
    # the cached (decoding) path agrees with the teacher-forced one
    cache = head.new_cache(32)
    ours_cached = head.forward_cached(cache, feats[0], toks[0], torch.arange(T), 0)
    assert (ours_cached - ref).abs().max().item() < 1e-4


@pytest.mark.parametrize("kind", ["plain", "no-fc-bias", "qkv-bias", "reduced-vocab"])
def test_save_load_roundtrip(tmp_path, target, kind):
    _, _, targs = target
    args = LlamaArgs(**{**vars(targs), "n_layers": 1, "qkv_bias": kind == "qkv-bias"})
    torch.manual_seed(11)
    dv = torch.tensor(DRAFT_VOCAB) if kind == "reduced-vocab" else None
    head = EagleHead(args, fc_bias=kind != "no-fc-bias", draft_vocab=dv)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.1)
    out = tmp_path / kind
    save_head(head, out, embed=True, dtype=torch.float32)  # the full official layout, exact

    # the file has exactly the official key layout
    keys = set(load_file(str(out / "model.safetensors")))
    official = {"embed_tokens.weight", "fc.weight", "layers.0.post_attention_layernorm.weight"}
    official |= {f"layers.0.self_attn.{p}_proj.weight" for p in "qkvo"}
    official |= {f"layers.0.mlp.{p}_proj.weight" for p in ("gate", "up", "down")}
    if kind != "no-fc-bias":
        official.add("fc.bias")
    if kind == "qkv-bias":
        official |= {f"layers.0.self_attn.{p}_proj.bias" for p in "qkv"}
    if kind == "reduced-vocab":
        official.add("d2t")
    assert keys == official
    from transformers import LlamaConfig
    cfg = LlamaConfig.from_pretrained(str(out))
    assert cfg.num_hidden_layers == 1 and cfg.hidden_size == H

    loaded, own = load_draft_head(out, targs)
    assert own is None
    a, b = head.state_dict(), loaded.state_dict()
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert loaded.fc_bias == head.fc_bias and loaded.args.qkv_bias == head.args.qkv_bias

    # the compact default (how heads ship): no embedding (the target's is used), fp16 weights
    small = tmp_path / (kind + "-compact")
    save_head(head, small)
    st = load_file(str(small / "model.safetensors"))
    assert set(st) == official - {"embed_tokens.weight"}
    assert all(v.dtype == torch.float16 for k, v in st.items() if k != "d2t")
    loaded2, _ = load_draft_head(small, targs)
    assert not loaded2.has_embed
    for k, v in head.state_dict().items():
        if k != "embed_tokens.weight":
            assert torch.allclose(v, loaded2.state_dict()[k].float(), atol=1e-3), k
    if dv is None:
        assert loaded.draft_ids is None
    else:
        assert torch.equal(loaded.draft_ids, dv)


# ------------------------------------------------------------------------- corrupt checkpoints

class _Evil:
    def __reduce__(self):
        import os
        return (os.system, ("touch EVIL_MARKER",))


def corrupt(folder: Path, kind: str) -> str:
    """Write a broken checkpoint; returns a fragment its error message must contain."""
    state = head_state(seed=1)
    write_ckpt(folder, head_cfg(), state)
    if kind == "truncated-safetensors":
        p = folder / "model.safetensors"
        data = p.read_bytes()
        p.write_bytes(data[: len(data) // 2])
        return "corrupt"
    if kind == "garbage-safetensors":
        (folder / "model.safetensors").write_bytes(b"\x00\x01not a safetensors file")
        return "corrupt"
    if kind == "invalid-json":
        (folder / "config.json").write_text('{"hidden_size": 64,,')
        return "not valid JSON"
    if kind == "json-not-object":
        (folder / "config.json").write_text("[1, 2, 3]")
        return "config"
    if kind == "no-config":
        (folder / "config.json").unlink()
        return "no config.json"
    if kind == "no-weights":
        (folder / "model.safetensors").unlink()
        return "no model.safetensors"
    if kind == "config-lacks-key":
        cfg = head_cfg()
        del cfg["hidden_size"]
        (folder / "config.json").write_text(json.dumps(cfg))
        return "hidden_size"
    if kind == "wrong-hidden-size":
        write_ckpt(folder, head_cfg(hidden_size=32, num_attention_heads=2, num_key_value_heads=1), state)
        return "does not fit the target"
    if kind == "wrong-vocab":
        write_ckpt(folder, head_cfg(vocab_size=50), state)
        return "does not fit the target"
    if kind == "missing-key":
        del state["fc.weight"]
        write_ckpt(folder, head_cfg(), state)
        return "EAGLE layout"
    if kind == "unexpected-key":
        state["layers.1.mlp.up_proj.weight"] = torch.zeros(INTER, H)
        write_ckpt(folder, head_cfg(), state)
        return "EAGLE layout"
    if kind == "shape-mismatch":  # config's intermediate size disagrees with the tensors
        write_ckpt(folder, head_cfg(intermediate_size=96), state)
        return "shape"
    if kind == "malicious-bin":
        (folder / "model.safetensors").unlink()
        with open(folder / "pytorch_model.bin", "wb") as f:
            pickle.dump({"fc.weight": _Evil()}, f)
        return "corrupt"
    raise AssertionError(kind)


CORRUPT = ["truncated-safetensors", "garbage-safetensors", "invalid-json", "json-not-object", "no-config",
           "no-weights", "config-lacks-key", "wrong-hidden-size", "wrong-vocab", "missing-key",
           "unexpected-key", "shape-mismatch", "malicious-bin"]


@pytest.mark.parametrize("kind", CORRUPT)
def test_corrupt_checkpoint_is_a_user_error(tmp_path, target, kind, monkeypatch):
    _, _, targs = target
    monkeypatch.chdir(tmp_path)
    folder = tmp_path / "head"
    fragment = corrupt(folder, kind)
    with pytest.raises(UserError) as ei:
        load_draft_head(folder, targs)
    msg = str(ei.value)
    assert fragment.lower() in msg.lower(), msg
    assert "\n" not in msg and len(msg) < 400
    assert not (tmp_path / "EVIL_MARKER").exists()


def test_unrolled_training_steps_match_deeper_draft_nodes(target):
    """forward_train_unrolled's pass s, row j must be exactly what decoding computes for the
    depth-s node at position j: the true pairs up to j-s+1 in the head's cache, then the chain of
    drafted pairs (each reading its parent's predicted feature) under HeadRunner's tree mask."""
    _, _, targs = target
    args = LlamaArgs(**{**vars(targs), "n_layers": 1})
    torch.manual_seed(5)
    head = EagleHead(args, fc_bias=True)
    with torch.no_grad():
        for p in head.parameters():
            p.normal_(0, 0.1)
    head.eval()
    T, S = 7, 3
    feats, toks = torch.randn(1, T, H), torch.randint(0, V, (1, T))
    with torch.no_grad():
        g1 = head.forward_train(feats, toks)
        passes = [g1[0]] + [g[0] for g in head.forward_train_unrolled(feats, toks, g1, S)]
    for s in range(2, S + 1):
        for j in range(s - 1, T):
            c = j - s + 2  # true pairs 0..c-1 are committed
            cache = head.new_cache(32)
            head.forward_cached(cache, feats[0, :c], toks[0, :c], torch.arange(c), 0)
            cache.advance(c)
            g = passes[0][c - 1:c]  # the root's prediction, read by the depth-2 node
            for d in range(2, s + 1):  # the chain of drafted nodes down to depth s
                pos = c + d - 2
                mask = torch.ones(1, d - 1, dtype=torch.bool)  # ancestors in the tree part, and itself
                g = head.forward_cached(cache, g, toks[0, pos:pos + 1], torch.tensor([pos]), c + d - 2, mask)
            assert (g[0] - passes[s - 1][j]).abs().max().item() < 1e-5, (s, j)
    # a pass reads the head's own features, so it differs from the teacher-forced one
    assert (passes[1][1:] - g1[0, 1:]).abs().max().item() > 1e-3


