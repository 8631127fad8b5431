"""EAGLE-3 draft heads in the official layout (docs/algorithms.md §1, "EAGLE-3 head").

Random checkpoints are written with exactly the official tensor names and shapes (config.json with
"LlamaForCausalLMEagle3" + model.safetensors: fc over three target layers, midlayer.* with 2D-wide
q/k/v, norm, a reduced-vocabulary lm_head, d2t, t2d; no embedding) for a tiny random 8-layer
target. They must load through load_bundle; their draft log-probabilities, through the decoder's
own absorb and HeadRunner, must equal a straightforward computation of the EAGLE-3 maths from the
tensors and transformers' hidden states (first step, then steps fed the head's own output, and
again after decoding cycles committed accepted tokens); greedy decoding with them must equal plain
greedy decoding; broken checkpoints must raise a one-line UserError.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file

from eagle2.decoding.decoder import Decoder
from eagle2.cycle.drafting import HeadRunner
from eagle2.errors import UserError
from eagle2.model.head3 import Eagle3Head, aux_layers_of
from eagle2.model.llama import LlamaArgs
from eagle2.model.loading import load_bundle, load_draft_head

H, V, HEADS, KV, INTER, LAYERS, EPS, THETA = 64, 97, 4, 2, 128, 8, 1e-6, 10000.0
HD = H // HEADS
DRAFT = sorted({0, 1, 2, 3, 5, 8, 9, 13, 21, 34, 55, 89, 91, 96} | set(range(30, 80)))
# checkpoint variants: (config additions, state options, the target states the head must read:
# i < LAYERS is transformers' hidden_states[i], the input of layer i; LAYERS is the last layer's output)
VARIANTS = {
    "default-layers": ({}, {}, [2, 4, 5]),  # (2, L//2, L-3) for L = 8
    "config-layers": ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 6]}}, {}, [1, 4, 7]),
    "own-embed-fc-bias": ({"bias": True}, {"embed": True, "fc_bias": True}, [2, 4, 5]),
    "norm-before-residual": ({"norm_before_residual": True}, {}, [2, 4, 5]),
    "repeat": ({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [1, 4, 7]}}, {"repeat": True}, [2, 5, 8]),
}


@pytest.fixture(scope="module")
def target(tiny_target):
    folder, hf = tiny_target("eagle3-target", vocab=V, hidden=H, layers=LAYERS, heads=HEADS, kv_heads=KV,
                             inter=INTER, lm_std=0.3)
    return folder, hf, LlamaArgs.from_hf(json.loads((folder / "config.json").read_text()))


def e3_config(**extra) -> dict:
    cfg = {"architectures": ["LlamaForCausalLMEagle3"], "model_type": "llama", "hidden_size": H,
           "intermediate_size": INTER, "num_attention_heads": HEADS, "num_key_value_heads": KV,
           "num_hidden_layers": 1, "vocab_size": V, "draft_vocab_size": len(DRAFT), "rms_norm_eps": EPS,
           "rope_theta": THETA, "max_position_embeddings": 256, "hidden_act": "silu",
           "tie_word_embeddings": False, "bias": False, "torch_dtype": "float32"}
    cfg.update(extra)
    return cfg


def e3_state(seed: int = 0, embed: bool = False, fc_bias: bool = False, repeat_of=None) -> dict:
    """Random tensors in the official layout. `repeat_of` (a transformers target) makes a head that
    drafts "the current token again": fc picks the target's last-layer output, the layer adds nothing
    (o_proj and down_proj are zero), norm and lm_head are the target's. Random tiny targets repeat
    tokens a lot when greedy, so its drafts are accepted, several in a row."""
    g = torch.Generator().manual_seed(seed)
    r = lambda *s, std=0.08: std * torch.randn(*s, generator=g)  # noqa: E731
    ids = torch.tensor(DRAFT)
    t2d = torch.zeros(V, dtype=torch.bool)
    t2d[ids] = True
    st = {
        "fc.weight": r(H, 3 * H),
        "midlayer.input_layernorm.weight": 1.0 + r(H, std=0.2),
        "midlayer.hidden_norm.weight": 1.0 + r(H, std=0.2),
        "midlayer.self_attn.q_proj.weight": r(HEADS * HD, 2 * H),
        "midlayer.self_attn.k_proj.weight": r(KV * HD, 2 * H),
        "midlayer.self_attn.v_proj.weight": r(KV * HD, 2 * H),
        "midlayer.self_attn.o_proj.weight": r(H, HEADS * HD),
        "midlayer.post_attention_layernorm.weight": 1.0 + r(H, std=0.2),
        "midlayer.mlp.gate_proj.weight": r(INTER, H),
        "midlayer.mlp.up_proj.weight": r(INTER, H),
        "midlayer.mlp.down_proj.weight": r(H, INTER),
        "norm.weight": 1.0 + r(H, std=0.2),
        "lm_head.weight": r(len(DRAFT), H, std=0.3),
        "d2t": ids - torch.arange(len(DRAFT)),
        "t2d": t2d,
    }
    if embed:
        st["embed_tokens.weight"] = r(V, H, std=0.3)
    if fc_bias:
        st["fc.bias"] = r(H, std=0.2)
    if repeat_of is not None:
        st["fc.weight"] = torch.cat([torch.zeros(H, 2 * H), torch.eye(H)], dim=1)
        st["midlayer.self_attn.o_proj.weight"].zero_()
        st["midlayer.mlp.down_proj.weight"].zero_()
        st["norm.weight"] = repeat_of.model.norm.weight.detach().clone()
        st["lm_head.weight"] = repeat_of.lm_head.weight.detach()[DRAFT].clone()
    return st


def write_ckpt(folder: Path, cfg: dict, state: dict) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "config.json").write_text(json.dumps(cfg))
    save_file(state, str(folder / "model.safetensors"))
    return folder


@pytest.fixture(scope="module")
def bundles(target, tmp_path_factory):
    """variant -> (bundle, the checkpoint's tensors, its config, the target states it reads), loaded once."""
    folder, hf = target[:2]
    out = {}
    for i, (name, (cfg_extra, st_kw, capture)) in enumerate(VARIANTS.items()):
        kw = dict(st_kw)
        if kw.pop("repeat", False):
            kw["repeat_of"] = hf
        state, cfg = e3_state(seed=10 + i, **kw), e3_config(**cfg_extra)
        ck = write_ckpt(tmp_path_factory.mktemp(f"eagle3-{name}"), cfg, state)
        out[name] = (load_bundle(target=str(folder), head=str(ck)), state, cfg, capture)
    return out


# ------------------------------------------------------------------ an independent reference

def rms(x, w):
    return w * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + EPS))


def ref_layer(st: dict, cfg: dict, emb_w, hidden_in, tokens) -> tuple[torch.Tensor, torch.Tensor]:
    """EAGLE-3's layer written out, causal over rows 0..T-1 at positions 0..T-1: row i reads
    (token tokens[i], hidden state hidden_in[i]). Returns (outputs before norm [T, H], log q [T, |DRAFT|])."""
    m = "midlayer."
    T = tokens.numel()
    hn = rms(hidden_in, st[m + "hidden_norm.weight"])
    x = torch.cat([rms(emb_w[tokens], st[m + "input_layernorm.weight"]), hn], dim=-1)
    q = (x @ st[m + "self_attn.q_proj.weight"].T).view(T, HEADS, HD)
    k = (x @ st[m + "self_attn.k_proj.weight"].T).view(T, KV, HD)
    v = (x @ st[m + "self_attn.v_proj.weight"].T).view(T, KV, HD)
    inv = 1.0 / THETA ** (torch.arange(0, HD, 2, dtype=torch.float64) / HD)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None]
    cos, sin = torch.cat([ang, ang], -1).cos().float()[:, None], torch.cat([ang, ang], -1).sin().float()[:, None]

    def rope(t):
        return t * cos + torch.cat([-t[..., HD // 2:], t[..., :HD // 2]], dim=-1) * sin

    q, k = rope(q), rope(k)
    k, v = k.repeat_interleave(HEADS // KV, dim=1), v.repeat_interleave(HEADS // KV, dim=1)
    scores = torch.einsum("qhd,khd->hqk", q, k) / HD ** 0.5
    scores = scores.masked_fill(~torch.ones(T, T, dtype=torch.bool).tril(), float("-inf"))
    att = torch.einsum("hqk,khd->qhd", scores.softmax(-1), v).reshape(T, HEADS * HD)
    r = (hn if cfg.get("norm_before_residual") else hidden_in) + att @ st[m + "self_attn.o_proj.weight"].T
    u = rms(r, st[m + "post_attention_layernorm.weight"])
    h = r + (F.silu(u @ st[m + "mlp.gate_proj.weight"].T) * (u @ st[m + "mlp.up_proj.weight"].T)) \
        @ st[m + "mlp.down_proj.weight"].T
    return h, torch.log_softmax(rms(h, st["norm.weight"]) @ st["lm_head.weight"].T, dim=-1)


def ref_fc_inputs(hf, st: dict, capture: list[int], seq: list[int]) -> torch.Tensor:
    """fc of the target's fused states at every position of `seq`, from transformers' hidden states
    (and the input of its final norm: the last layer's output, which hidden_states gives normed)."""
    last = []
    hook = hf.model.norm.register_forward_hook(lambda mod, inp, out: last.append(inp[0]))
    with torch.no_grad():
        hs = hf(input_ids=torch.tensor([seq]), output_hidden_states=True).hidden_states
    hook.remove()
    assert torch.allclose(hs[0][0], hf.model.embed_tokens.weight[seq])  # hidden_states[i] enters layer i
    states = list(hs[:LAYERS]) + last
    fused = torch.cat([states[i][0] for i in capture], dim=-1)
    return fused @ st["fc.weight"].T + st.get("fc.bias", torch.zeros(H))


# ------------------------------------------------------------------ tests

@pytest.mark.parametrize("variant", list(VARIANTS))
def test_official_layout_loads_through_load_bundle(bundles, variant):
    b, state, cfg, capture = bundles[variant]
    h = b.head
    assert isinstance(h, Eagle3Head)
    assert h.aux_layers == b.target.aux_layers == tuple(capture)
    sd = h.state_dict()
    for k, v in state.items():
        if k in ("d2t", "t2d"):
            continue
        if k == "lm_head.weight":
            assert torch.equal(h.lm_weight, v)
        else:
            assert torch.equal(sd[k], v), k
    assert h.draft_ids.tolist() == DRAFT
    assert h.has_embed == ("embed_tokens.weight" in state)
    if not h.has_embed:  # taken from the target, as SGLang and vLLM do
        assert torch.equal(h.embed_tokens.weight, b.target.embed_tokens.weight)
    assert not any(p.requires_grad for p in h.parameters())


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_draft_logprobs_match_the_reference(bundles, target, variant):
    b, st, cfg, capture = bundles[variant]
    hf = target[1]
    emb_w = st.get("embed_tokens.weight", hf.model.embed_tokens.weight.detach())
    prompt = [5, 17, 33, 2, 71, 64, 8, 40]
    dec = Decoder(b, "eagle2", max_new_tokens=64, record=False, total_tokens=12, depth=4, top_k=3)
    dec.start(input_ids=prompt)

    def check_absorbed():
        """The head's prediction at the root equals the reference over every committed pair."""
        dec.absorb()
        seq = prompt + dec.generated  # x_0 .. x_n, x_n = the root
        hid, toks = ref_fc_inputs(hf, st, capture, seq[:-1]), torch.tensor(seq[1:])
        ref_h, ref_logq = ref_layer(st, cfg, emb_w, hid, toks)
        root_g = dec.state.reading.g
        assert (root_g - ref_h[-1]).abs().max().item() < 1e-4
        assert (b.head.draft_logprobs(root_g) - ref_logq[-1]).abs().max().item() < 1e-4
        return hid, toks, ref_h, ref_logq

    hid, toks, ref_h, ref_logq = check_absorbed()
    # deeper draft steps read the head's own output (before norm) in place of fc(fused states)
    s = dec.state
    runner = HeadRunner(b.draft, s.hcache, s.reading.g, base_pos=s.hcache.length - 1, root_logp=s.reading.logp)
    g, slots = s.reading.g[None], [-1]
    for depth in (1, 2):
        y = int(runner.topk(ref_logq[-1], 1)[1][0])  # the head's best child, as a target id
        g, logq, slots = runner.run([y], g, slots, [depth])
        hid, toks = torch.cat([hid, ref_h[-1:]]), torch.cat([toks, torch.tensor([y])])
        ref_h, ref_logq = ref_layer(st, cfg, emb_w, hid, toks)
        assert (g[0] - ref_h[-1]).abs().max().item() < 1e-4, depth
        assert (logq[0] - ref_logq[-1]).abs().max().item() < 1e-4, depth
    # cycles commit the target's fused states at the accepted nodes: the next absorb agrees again
    for _ in range(8):
        dec.step()
    check_absorbed()


@pytest.mark.parametrize("variant", ["default-layers", "repeat"])
@pytest.mark.parametrize("policy", ["static", "eagle2"])
def test_greedy_decoding_is_lossless(bundles, variant, policy):
    b = bundles[variant][0]
    kw = {"total_tokens": 16, "depth": 4, "top_k": 4} if policy == "eagle2" else {}
    accepted = []
    for prompt in ([5, 17, 33, 2, 71, 64, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11], [40, 41, 40, 41, 40]):
        plain = Decoder(b, "plain", max_new_tokens=24, record=False)
        plain.start(input_ids=prompt)
        plain.generate()
        dec = Decoder(b, policy, max_new_tokens=24, record=True, **kw)
        dec.start(input_ids=prompt)
        trace = dec.generate()
        assert dec.generated == plain.generated, prompt
        drafted = {t for s in trace.steps if s.tree is not None for t in s.tree.tokens[1:]}
        assert drafted and drafted <= set(DRAFT)  # drafts come from the reduced vocabulary
        accepted += [s.accepted_len for s in trace.steps]
    if variant == "repeat":  # cycles committed several drafted tokens (and their fused states) at once
        assert max(accepted) >= 3 and sum(accepted) >= 15, accepted


def test_aux_layers():
    assert aux_layers_of({}, 8) == (2, 4, 5)
    assert aux_layers_of({}, 32) == (2, 16, 29)  # the official choice for Llama-3.1-8B
    assert aux_layers_of({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [6, 0, 3]}}, 8) == (1, 4, 7)
    with pytest.raises(UserError, match="distinct"):
        aux_layers_of({}, 4)  # (2, 2, 1): too shallow for the default
    with pytest.raises(UserError, match="distinct"):
        aux_layers_of({"eagle_config": {"eagle_aux_hidden_state_layer_ids": [0, 3, 8]}}, 8)


def corrupt(folder: Path, kind: str) -> str:
    """Write a broken EAGLE-3 checkpoint; returns a fragment its error message must contain."""
    st, cfg = e3_state(seed=1), e3_config()
    if kind == "missing-hidden-norm":
        del st["midlayer.hidden_norm.weight"]
        frag = "EAGLE-3 layout"
    elif kind == "unexpected-tensor":
        st["midlayer.self_attn.o_proj.bias"] = torch.zeros(H)
        frag = "EAGLE-3 layout"
    elif kind == "fc-reads-one-layer":
        st["fc.weight"] = torch.zeros(H, 2 * H)
        frag = "fc.weight"
    elif kind == "qkv-not-2d-wide":
        st["midlayer.self_attn.k_proj.weight"] = torch.zeros(KV * HD, H)
        frag = "shape mismatch"
    elif kind == "t2d-disagrees":
        st["t2d"][4] = ~st["t2d"][4]
        frag = "t2d"
    elif kind == "d2t-out-of-range":
        st["d2t"][-1] = V
        frag = "d2t"
    elif kind == "draft-vocab-size":
        cfg["draft_vocab_size"] = len(DRAFT) + 1
        frag = "draft_vocab_size"
    elif kind == "lm-head-rows":
        st["lm_head.weight"] = torch.zeros(len(DRAFT) - 1, H)
        frag = "lm_head.weight"
    elif kind == "layer-ids":
        cfg["eagle_config"] = {"eagle_aux_hidden_state_layer_ids": [0, 3, 40]}
        frag = "layers"
    elif kind == "wrong-target-width":
        cfg["target_hidden_size"] = 2 * H
        frag = "width"
    elif kind == "truncated":
        write_ckpt(folder, cfg, st)
        p = folder / "model.safetensors"
        p.write_bytes(p.read_bytes()[:1000])
        return "corrupt"
    else:
        raise AssertionError(kind)
    write_ckpt(folder, cfg, st)
    return frag


CORRUPT = ["missing-hidden-norm", "unexpected-tensor", "fc-reads-one-layer", "qkv-not-2d-wide", "t2d-disagrees",
           "d2t-out-of-range", "draft-vocab-size", "lm-head-rows", "layer-ids", "wrong-target-width", "truncated"]


@pytest.mark.parametrize("kind", CORRUPT)
def test_broken_checkpoint_is_a_user_error(tmp_path, target, kind):
    folder = tmp_path / kind
    fragment = corrupt(folder, kind)
    with pytest.raises(UserError) as ei:
        load_draft_head(folder, target[2])
    msg = str(ei.value)
    assert fragment.lower() in msg.lower(), msg
    assert "\n" not in msg and len(msg) < 400


def test_broken_checkpoint_through_load_bundle(tmp_path, target):
    folder = tmp_path / "head"
    corrupt(folder, "missing-hidden-norm")
    with pytest.raises(UserError, match="EAGLE-3 layout"):
        load_bundle(target=str(target[0]), head=str(folder))
