"""The lean target model against transformers, and KV-cache commits against a fresh prefill.

1. Our LlamaModel (loaded with eagle2.model.loading.load_target from a save_pretrained folder) gives
   transformers' logits (fp32, max abs diff < 1e-4) for a prefill and for tree steps after several
   commits: each tree node's logits equal transformers run on committed prefix + ancestor path.
   Variants: Llama with GQA (untied and tied embeddings), Qwen2 (q/k/v biases), RoPE scaling
   (llama3, linear, yarn). Plus the real default model against AutoModelForCausalLM.
2. After several speculative cycles the committed K/V in decoder.cache equal a fresh prefill of
   prompt + generated tokens, on a tiny model and on the real one.
"""
from __future__ import annotations

import random
from dataclasses import dataclass
from typing import ClassVar

import pytest
import torch

from eagle2.decoding.decoder import Decoder
from trees import tree_of
from eagle2.model.loading import load_bundle, load_target
from eagle2.policies.base import TreePolicy

ATOL = 1e-4

VARIANTS = {
    "llama-gqa-untied": dict(arch="llama", tie=False),
    "llama-gqa-tied": dict(arch="llama", tie=True),
    "qwen2-bias": dict(arch="qwen2", tie=False),
    "rope-llama3": dict(arch="llama", rope={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                            "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 16}),
    "rope-linear": dict(arch="llama", rope={"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}),
    "rope-yarn": dict(arch="llama", rope={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0,
                                          "original_max_position_embeddings": 16}),
}


def hf_last_logits(hf, seqs: list[list[int]]) -> torch.Tensor:
    """transformers' logits after the last token of each sequence (each run on its own)."""
    out = []
    with torch.no_grad():
        for s in seqs:
            out.append(hf(torch.tensor([s])).logits[0, -1].float())
    return torch.stack(out)


def random_tree(rng: random.Random, root: int, n: int, vocab: int):
    """A random tree of n nodes under root, all kept: parents precede children, siblings distinct."""
    tokens, parents, depths, ranks = [root], [-1], [0], [0]
    for i in range(1, n):
        p = rng.randrange(i)
        used = {tokens[j] for j in range(i) if parents[j] == p}
        tok = rng.choice([t for t in range(vocab) if t not in used])
        tokens.append(tok)
        parents.append(p)
        depths.append(depths[p] + 1)
        ranks.append(len(used))
    return tree_of(tokens, parents, depths, ranks)


def path_tokens(tree, i: int) -> list[int]:
    out = []
    while i >= 0:
        out.append(tree.tokens[i])
        i = tree.parents[i]
    return out[::-1]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_target_matches_transformers(tiny_target, variant):
    folder, hf = tiny_target(variant, **VARIANTS[variant])
    model = load_target(folder, torch.device("cpu"), torch.float32)
    V = model.args.vocab_size
    if VARIANTS[variant].get("tie"):
        assert model.lm_head.weight.data_ptr() == model.embed_tokens.weight.data_ptr()
    if variant == "qwen2-bias":
        assert model.layers[0].self_attn.q_proj.bias is not None
        assert model.layers[0].self_attn.q_proj.bias.abs().sum() > 0
    rng = random.Random(1)
    prompt = [rng.randrange(V) for _ in range(11)]

    # (a) prefill
    cache = model.new_cache(256)
    feats = model.forward_cached(cache, torch.tensor(prompt), torch.arange(len(prompt)))
    ours = model.logits(feats)
    with torch.no_grad():
        ref = hf(torch.tensor([prompt])).logits[0].float()
    assert ours.shape == ref.shape
    assert (ours - ref).abs().max().item() < ATOL
    cache.advance(len(prompt))
    committed = list(prompt)

    # (b) several speculative cycles: verify a random tree, commit root + one root-to-node path
    # (non-contiguous slots), then check a final tree step node by node.
    for cycle in range(4):
        root = rng.randrange(V)
        drafted = random_tree(rng, root, n=9 + cycle, vocab=V)
        tree, vb = drafted.to_tree(), drafted.layout(cache.length, torch.device("cpu"))
        assert vb.positions.tolist() == [cache.length + tree.depths[p] for p in vb.pool_idx]
        feats = model.forward_cached(cache, vb.tokens, vb.positions, vb.mask)
        ours = model.logits(feats)
        ref = hf_last_logits(hf, [committed + path_tokens(tree, p) for p in vb.pool_idx])
        diff = (ours - ref).abs().max().item()
        assert diff < ATOL, f"cycle {cycle}: tree logits differ from transformers by {diff:.2e}"
        if cycle == 3:
            break
        # accept the deepest, last node's path; commit its verify slots
        deepest = max(range(len(vb.pool_idx)), key=lambda i: (tree.depths[vb.pool_idx[i]], i))
        chain = []
        i = deepest
        while i > 0:
            chain.append(i)
            i = vb.parent_pos[i]
        keep = [0] + chain[::-1]
        L = cache.length
        cache.commit(torch.tensor([L + i for i in keep]))
        committed += [int(vb.tokens[i]) for i in keep]
        assert cache.length == len(committed)
        # the next plain step after a commit also matches (position = committed length)
        nxt = rng.randrange(V)
        f1 = model.forward_cached(cache, torch.tensor([nxt]), torch.tensor([cache.length]))
        r1 = hf_last_logits(hf, [committed + [nxt]])
        assert (model.logits(f1) - r1).abs().max().item() < ATOL


def test_rope_scaling_is_applied(tiny_target):
    """The scaled variants really differ from default RoPE (so the tests above cover scaling)."""
    from eagle2.model.llama import LlamaArgs, rope_tables
    import json
    tables = {}
    for v in ("llama-gqa-untied", "rope-llama3", "rope-linear", "rope-yarn"):
        folder, _ = tiny_target(v, **VARIANTS[v])
        args = LlamaArgs.from_hf(json.loads((folder / "config.json").read_text()))
        tables[v] = rope_tables(args, 64)
    base = tables["llama-gqa-untied"][0]
    for v in ("rope-llama3", "rope-linear", "rope-yarn"):
        assert (tables[v][0] - base).abs().max() > 1e-3, v


def test_real_model_prefill_matches_transformers(real_bundle, real_folder):
    from transformers import AutoModelForCausalLM
    tok = real_bundle.tokenizer
    ids = tok.apply_chat_template([{"role": "user", "content": "What is the capital of France?"}],
                                  add_generation_prompt=True, tokenize=True)
    if hasattr(ids, "keys"):
        ids = ids["input_ids"]
    ids = list(ids)
    hf = AutoModelForCausalLM.from_pretrained(str(real_folder), dtype=torch.float32).eval()
    with torch.no_grad():
        ref = hf(torch.tensor([ids])).logits[0].float()
    del hf
    model = real_bundle.target
    cache = model.new_cache(len(ids) + 8)
    ours = model.logits(model.forward_cached(cache, torch.tensor(ids), torch.arange(len(ids))))
    diff = (ours - ref).abs().max().item()
    # fp32 through 30 layers, logits up to ~30: allow 1e-4 per 10 units of logit scale
    assert diff < 1e-4 * max(1.0, ref.abs().max().item() / 10), f"max abs diff {diff:.2e}"
    assert ours[-1].argmax().item() == ref[-1].argmax().item()


# ------------------------------------------------------------------------------- KV commit

@dataclass
class OraclePolicy(TreePolicy):
    """A test policy that knows the greedy continuation: each tree holds the next 3 correct tokens
    as a chain below the root, placed among distractor siblings (and a distractor subtree), so every
    cycle accepts 3 nodes whose verify slots are not contiguous."""
    seq: list            # the plain greedy continuation (generated tokens)
    dec: object = None
    vocab: int = 0
    total_tokens: int = 12
    name: ClassVar[str] = "oracle"

    def draft(self, runner, root):
        n = len(self.dec.generated)
        assert self.seq[n - 1] == root
        c1, c2, c3 = self.seq[n:n + 3]
        other = lambda *ex: next(t for t in range(self.vocab) if t not in ex)  # noqa: E731
        d1, d2 = other(c1), other(c1, other(c1))
        tokens = [root, d1, c1, d2, other(c2), c2, other(), c3]
        parents = [-1, 0, 0, 0, 2, 2, 1, 5]
        ranks = [0, 0, 1, 2, 0, 1, 0, 0]
        depths = [0, 1, 1, 1, 2, 2, 2, 3]
        return tree_of(tokens, parents, depths, ranks)


def assert_cache_matches_prefill(bundle, dec):
    seq = dec.prompt_ids + dec.generated
    L = dec.state.cache.length
    assert L == len(seq) - 1  # everything but the newest root is committed
    model = bundle.target
    fresh = model.new_cache(L + 4)
    model.forward_cached(fresh, torch.tensor(seq[:L]), torch.arange(L))
    for name in ("k", "v"):
        got = getattr(dec.state.cache, name)[:, :, :, :L]
        want = getattr(fresh, name)[:, :, :, :L]
        diff = (got - want).abs().max().item()
        assert diff < ATOL, f"committed {name} differs from a fresh prefill by {diff:.2e}"


def run_kv_commit(bundle, prompt_ids, eagle2_kw, cycles, vocab):
    # plain greedy reference
    plain = Decoder(bundle, "plain", max_new_tokens=4 * cycles + 8, record=False)
    plain.start(input_ids=prompt_ids)
    plain.generate()
    # (i) EAGLE-2 cycles with the bundle's head
    dec = Decoder(bundle, "eagle2", max_new_tokens=4 * cycles + 8, record=False, **eagle2_kw)
    dec.start(input_ids=prompt_ids)
    for _ in range(cycles):
        dec.step()
    assert dec.finished is None
    assert_cache_matches_prefill(bundle, dec)
    assert dec.generated == plain.generated[:len(dec.generated)]
    # (ii) oracle trees: 3 accepted nodes per cycle at non-contiguous verify slots
    pol = OraclePolicy(seq=plain.generated, vocab=vocab)
    odec = Decoder(bundle, pol, max_new_tokens=4 * cycles + 8, record=False)
    pol.dec = odec
    odec.start(input_ids=prompt_ids)
    for _ in range(cycles):
        st = odec.step()
        assert st.accepted_len == 3
    assert len(odec.generated) == 1 + 4 * cycles
    assert odec.generated == plain.generated[:len(odec.generated)]
    assert_cache_matches_prefill(bundle, odec)


def test_kv_commit_tiny(tiny_target):
    folder, _ = tiny_target("kv", vocab=16, lm_std=0.4)
    bundle = load_bundle(target=str(folder), head="random")
    prompt = [3, 1, 4, 1, 5, 9, 2, 6]
    run_kv_commit(bundle, prompt, dict(total_tokens=24, depth=3, top_k=6), cycles=6, vocab=16)


def test_kv_commit_real(real_bundle):
    ids = real_bundle.tokenizer("The quick brown fox jumps over the lazy dog. Then")["input_ids"]
    run_kv_commit(real_bundle, ids, dict(total_tokens=16, depth=3, top_k=4), cycles=3,
                  vocab=real_bundle.target.args.vocab_size)


def test_messages_on_a_tokenizer_without_a_chat_template_read_as_plain_turns(tmp_path):
    """A bare local folder (no chat template) still takes a conversation: the bench and profile
    pass messages, and transformers alone would raise."""
    from transformers import AutoTokenizer
    from conftest import write_word_tokenizer
    from eagle2.model.chat import prompt_ids
    write_word_tokenizer(tmp_path, 16)
    tok = AutoTokenizer.from_pretrained(str(tmp_path))
    assert not getattr(tok, "chat_template", None)
    ids = prompt_ids(tok, messages=[{"role": "user", "content": "w1 w2"}])
    assert len(ids) > 0 and tok.convert_tokens_to_ids("w1") in ids
    assert prompt_ids(tok, prompt="w1 w2") == tok("w1 w2", add_special_tokens=True)["input_ids"]
