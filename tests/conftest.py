# ---------------------------------------------------------------------------------------------
# Engine test fixtures (test_model, test_head_ckpt, test_tree, test_lossless, test_cli_errors).
# Tiny randomly initialised HF checkpoints (+ a word-level tokenizer) written to temp folders,
# and the real default bundle, loaded once per session.
# ---------------------------------------------------------------------------------------------
# eagle2, ui and viz come from the installed project (pip install -e ".[dev]", tests/run.sh);
# scripts/ from pyproject.toml's pytest `pythonpath`.
import os as _os
from pathlib import Path as _Path

import pytest as _pytest
import torch as _torch

# On a 2-core machine shared with other jobs, two OpenMP threads spin against each other and
# make small matmuls/attention 5-10x slower than one thread; override with EAGLE2_TEST_THREADS.
if _os.environ.get("EAGLE2_TEST_THREADS"):
    _torch.set_num_threads(int(_os.environ["EAGLE2_TEST_THREADS"]))
elif (_os.cpu_count() or 1) <= 2:
    _torch.set_num_threads(1)


# The t(N) cache the tests write (tiny models' tables included) is a temporary copy of the user's
# (its real-model tables keep the tests from measuring them again), never the user's own file;
# subprocesses (the app, the CLI) inherit the variable.
@_pytest.fixture(scope="session", autouse=True)
def _private_timing_cache(tmp_path_factory):
    import shutil
    from eagle2.model.timing import profile_path
    users = profile_path()
    ours = tmp_path_factory.mktemp("timing") / "verify_times.json"
    if users.is_file():
        shutil.copyfile(users, ours)
    before = _os.environ.get("EAGLE2_TIMING_CACHE")
    _os.environ["EAGLE2_TIMING_CACHE"] = str(ours)
    yield ours
    if before is None:
        _os.environ.pop("EAGLE2_TIMING_CACHE", None)
    else:
        _os.environ["EAGLE2_TIMING_CACHE"] = before


def write_word_tokenizer(folder, vocab_size: int) -> None:
    """A whitespace word-level tokenizer over "<unk>", "w1" .. "w{V-1}" (no chat template, no EOS)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {"<unk>": 0, **{f"w{i}": i for i in range(1, vocab_size)}}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    PreTrainedTokenizerFast(tokenizer_object=tk, unk_token="<unk>").save_pretrained(str(folder))


def build_tiny_target(folder, arch: str = "llama", vocab: int = 97, hidden: int = 64, layers: int = 2,
                      heads: int = 4, kv_heads: int = 2, inter: int = 128, tie: bool = False,
                      rope: dict | None = None, max_pos: int = 256, weight_std: float = 0.08,
                      lm_std: float | None = None, seed: int = 0, tokenizer: bool = True):
    """Save a randomly initialised LlamaForCausalLM / Qwen2ForCausalLM with every parameter
    (norm weights and biases included) randomised, so no term of the maths is trivially 0 or 1.
    Returns (folder, hf_model)."""
    from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM

    folder = _Path(folder)
    kw = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
              num_attention_heads=heads, num_key_value_heads=kv_heads, max_position_embeddings=max_pos,
              tie_word_embeddings=tie, bos_token_id=None, eos_token_id=None, pad_token_id=None,
              rms_norm_eps=1e-6)
    if rope is not None:
        kw["rope_parameters"] = rope
    if arch == "qwen2":
        cfg, cls = Qwen2Config(**kw), Qwen2ForCausalLM
    else:
        cfg, cls = LlamaConfig(**kw), LlamaForCausalLM
    g = _torch.Generator().manual_seed(seed)
    model = cls(cfg).float().eval()
    with _torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(1.0 + 0.2 * _torch.randn(p.shape, generator=g))
            elif name.endswith("bias"):
                p.copy_(0.2 * _torch.randn(p.shape, generator=g))
            elif "lm_head" in name or (tie and "embed_tokens" in name):
                p.copy_((lm_std or weight_std) * _torch.randn(p.shape, generator=g))
            else:
                p.copy_(weight_std * _torch.randn(p.shape, generator=g))
    folder.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(str(folder))
    if tokenizer:
        write_word_tokenizer(folder, vocab)
    return folder, model


@_pytest.fixture(scope="session")
def tiny_target(tmp_path_factory):
    """Factory: tiny_target(name, **build_tiny_target kwargs) -> (folder, hf_model), cached by name."""
    made = {}

    def make(name: str = "llama", **kw):
        if name not in made:
            made[name] = build_tiny_target(tmp_path_factory.mktemp(f"tiny-{name}"), **kw)
        return made[name]

    return make


@_pytest.fixture(scope="session")
def real_folder():
    """The converted default model folder (fetched and converted once if needed)."""
    from eagle2.model.weights import resolve_target
    return resolve_target("smollm2-135m")


@_pytest.fixture(scope="session")
def real_bundle(real_folder):
    """The default bundle (target + whatever head the preset ships), loaded once per session."""
    from eagle2.model.loading import load_bundle
    return load_bundle()


@_pytest.fixture(scope="module")
def sampling_setup(tiny_target):
    """(bundle, logits) for the sampling losslessness tests (test_lossless, test_budget): a tiny
    random Llama (vocab lossless_cases.SV) with a random head, and the target's logits of every
    prefix SPROMPT, SPROMPT+x1, SPROMPT+x1+x2 from one batched transformers run."""
    from eagle2.model.loading import load_bundle
    from lossless_cases import SPROMPT, SV
    folder, hf = tiny_target("sampling", vocab=SV, hidden=32, heads=4, kv_heads=2, inter=64, lm_std=0.5, seed=3)
    bundle = load_bundle(target=str(folder), head="random", seed_random_head=1)
    seqs = _torch.tensor([SPROMPT + [a, b] for a in range(SV) for b in range(SV)])
    with _torch.no_grad():
        logits = hf(seqs).logits.float()  # [V*V, len+2, V]
    return bundle, logits
