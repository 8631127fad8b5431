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

from eagle2.config import Config as _Config

# On a 2-core machine shared with other jobs, two OpenMP threads spin against each other and
# make small matmuls/attention 5-10x slower than one thread; override with EAGLE2_TEST_THREADS.
# EAGLE2_THREADS says the same to the commands the tests run in-process (a command without
# --threads sets torch's threads: eagle2/threads.py) and to the processes they start.
if _os.environ.get("EAGLE2_TEST_THREADS"):
    _torch.set_num_threads(int(_os.environ["EAGLE2_TEST_THREADS"]))
    _os.environ["EAGLE2_THREADS"] = _os.environ["EAGLE2_TEST_THREADS"]
elif (_os.cpu_count() or 1) <= 2:
    _torch.set_num_threads(1)
    _os.environ["EAGLE2_THREADS"] = "1"


# ---------------------------------------------------------------------------------------------
# The user's cache (~/.cache/eagle2, or $EAGLE2_CACHE) is never written by the tests. Every test
# gets an empty cache folder of its own (EAGLE2_CACHE; the t(N) tables follow it, as
# EAGLE2_TIMING_CACHE is unset), but for the q4_1 kernels' build, shared by the session
# (share_kernel_build); the tests marked `real_model` (those using real_folder or
# real_bundle get the mark at collection) share one session folder that mirrors the user's cache
# as symlinks, so they read the fetched model without copying it, and whatever they write (a
# table, a kernel build) replaces a link in the mirror, not the user's file.
# Outside the tests (collection, module fixtures) EAGLE2_CACHE names a folder of the session's
# own, set before any test module is imported. Subprocesses (the app, the CLI) inherit the
# variables. The background t(N) measurer writes where the configuration points when its
# measurement ends, so none may outlive the cache it was asked under: each test has a measurer of
# its own, closed at its end, and the process's one is closed at the session's end, before the
# variables are given back (a measurement of a test's tiny model that ended after the session
# wrote into the user's verify_times.json). A test that changed the user's cache, by itself or by
# its measurer, fails; at the end of the session the user's cache is compared with a snapshot
# taken at its start: any change fails the run.
# ---------------------------------------------------------------------------------------------
USER_CACHE = _Config.from_env().cache_dir   # the configuration's own default, before the tests move it
_REAL_MODEL_FIXTURES = {"real_model_cache", "real_folder", "real_bundle"}
_AT_START: dict = {}   # the user's cache and the variables as the session found them


def pytest_configure(config):
    import tempfile
    _AT_START.update(cache=_snapshot(USER_CACHE),
                     env={k: _os.environ.get(k) for k in ("EAGLE2_CACHE", "EAGLE2_TIMING_CACHE")})
    _os.environ["EAGLE2_CACHE"] = _AT_START["session_cache"] = tempfile.mkdtemp(prefix="eagle2-test-cache-")
    _os.environ.pop("EAGLE2_TIMING_CACHE", None)


def pytest_unconfigure(config):
    import shutil
    if "session_cache" not in _AT_START:
        return
    shutil.rmtree(_AT_START.pop("session_cache"), ignore_errors=True)
    for k, v in _AT_START["env"].items():
        if v is None:
            _os.environ.pop(k, None)
        else:
            _os.environ[k] = v


def pytest_collection_modifyitems(config, items):
    for item in items:
        if _REAL_MODEL_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(_pytest.mark.real_model)


def _snapshot(folder: _Path) -> dict:
    """(kind, size, mtime) of `folder` and of everything under it, links not followed."""
    found = {}
    if not folder.exists():
        return found
    for path in [folder, *folder.rglob("*")]:
        st = path.lstat()
        found[str(path.relative_to(folder))] = (st.st_mode, st.st_size, st.st_mtime_ns)
    return found


def _changes(before: dict, after: dict) -> str:
    """The user's cache's paths that differ between two snapshots, each with how ('' if none)."""
    changed = sorted(k for k in before.keys() | after.keys() if before.get(k) != after.get(k))
    return ", ".join(f"{USER_CACHE / k} ({'added' if k not in before else 'removed' if k not in after else 'changed'})"
                     for k in changed)


@_pytest.fixture(scope="session", autouse=True)
def _user_cache_untouched():
    """Fails the session (an error at the last test's teardown) where the user's cache is not
    exactly as the session found it. The process's measurer is closed first: a measurement asked
    for outside any test (a module fixture) lands now, in the session's folder."""
    import sys
    yield
    if "eagle2.model.measurer" in sys.modules:
        sys.modules["eagle2.model.measurer"].MEASURER.close()
    changed = _changes(_AT_START["cache"], _snapshot(USER_CACHE))
    if changed:
        _pytest.fail(f"the tests wrote into the user's cache: {changed}", pytrace=False)


@_pytest.fixture(scope="session")
def real_model_cache(tmp_path_factory):
    """A cache folder holding the user's fetched default model: the user's cache as a tree of real
    folders and symlinked files (lock files left out). The engine writes by renaming a finished
    file over its target, which replaces a link here and leaves the user's file alone."""
    import shutil
    from eagle2.model.weights import DEFAULT_PRESET, PRESETS
    key = PRESETS[DEFAULT_PRESET].target.split(":", 1)[1]
    if not (USER_CACHE / "models" / key / "model.safetensors").is_file():
        _pytest.fail(f"the default model is not in {USER_CACHE}: run `python -m eagle2 fetch` first "
                     f"(tests/run.sh does), or leave these tests out with -m 'not real_model'", pytrace=False)
    mirror = tmp_path_factory.mktemp("eagle2-cache-real") / "eagle2"
    shutil.copytree(USER_CACHE, mirror, symlinks=True, ignore=shutil.ignore_patterns("*.lock"),
                    copy_function=lambda src, dst: _os.symlink(_os.path.abspath(src), dst))
    return mirror


def share_kernel_build(cache: _Path) -> None:
    """The q4_1 kernels' build folder in `cache` a link to the session's own: built once a session
    (about 5 s each time), not once for every test that loads the kernels into an empty cache. Only
    that library: a test building another (test_cache_tidy) builds it in its own folder."""
    from eagle2.model.qlib import NAME
    shared = _Path(_AT_START["session_cache"]) / "native" / NAME
    shared.mkdir(parents=True, exist_ok=True)
    (cache / "native").mkdir(exist_ok=True)
    (cache / "native" / NAME).symlink_to(shared, target_is_directory=True)


@_pytest.fixture(autouse=True)
def _own_cache(request, monkeypatch, tmp_path_factory):
    """This test's EAGLE2_CACHE: a new empty folder, or for a `real_model` test the session's
    mirror of the user's cache (the real model's t(N) tables are then measured once a session).
    A test not marked `real_model` that fetched the default model into its empty folder (half a
    minute, and the network) fails: it reads the real model without saying so. A test that
    changed the user's cache fails (checked after its measurer is closed: _own_measurer)."""
    user_cache = _snapshot(USER_CACHE)
    real = request.node.get_closest_marker("real_model") is not None
    cache = request.getfixturevalue("real_model_cache") if real else tmp_path_factory.mktemp("eagle2-cache")
    if not real:
        share_kernel_build(cache)
    monkeypatch.setenv("EAGLE2_CACHE", str(cache))
    monkeypatch.delenv("EAGLE2_TIMING_CACHE", raising=False)
    yield cache
    fetched = [d for d in ("wheels", "gguf", "models") if (cache / d).exists()]
    if fetched and not real:
        _pytest.fail(f"{request.node.nodeid} fetched the default model ({', '.join(fetched)} in its "
                     f"cache {cache}): mark it real_model", pytrace=False)
    changed = _changes(user_cache, _snapshot(USER_CACHE))
    if changed:
        _pytest.fail(f"{request.node.nodeid} wrote into the user's cache: {changed}", pytrace=False)


@_pytest.fixture(autouse=True)
def _own_measurer(_own_cache, monkeypatch):
    """This test's background t(N) measurer (model/measurer.py), closed at its end while the test's
    EAGLE2_CACHE still holds: whatever it measures lands in this test's cache, never in the next
    test's, nor after the session in the user's."""
    from eagle2.model import measurer
    own = measurer.Measurer()
    monkeypatch.setattr(measurer, "MEASURER", own)
    yield own
    own.close()


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
def real_folder(real_model_cache):
    """The converted default model folder, in the mirror of the user's cache."""
    from eagle2.model.weights import resolve_target
    with _pytest.MonkeyPatch.context() as mp:  # session fixtures are set up before _own_cache
        mp.setenv("EAGLE2_CACHE", str(real_model_cache))
        return resolve_target("smollm2-135m")


@_pytest.fixture(scope="session")
def real_bundle(real_model_cache, real_folder):
    """The default model and head in fp32, loaded once per session."""
    from eagle2.model.loading import load_bundle
    with _pytest.MonkeyPatch.context() as mp:
        mp.setenv("EAGLE2_CACHE", str(real_model_cache))
        return load_bundle(dtype="float32")  # the fp32 engine (eager, prepacked weights);
        # the default, q4_1, has its own fixture (test_quantized.real_q4)


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
