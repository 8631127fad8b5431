"""The engine on a CUDA GPU (the `cuda` cases skip where torch sees none; scripts/gpu_check.sh runs
them on a lent GPU). Greedy speculative decoding emits plain greedy decoding's tokens, on the tiny
model and the real one, in fp32 and bf16, for every lossless policy; where a tree's answer departs
from plain decoding's, it must be at a near-tie the precision cannot separate: the target's two
candidates there lie closer than the rounding difference between its one-row forward (plain
decoding's) and its many-row one (a tree's verification) at that very position. Sampling runs on
the device with the decoders' CPU generators, and the record button's race runs there whole.

The CPU cases run the same checks on the tiny model everywhere, so the checks themselves are tested
where no GPU is. With EAGLE2_CUDA_REPORT set, each comparison is appended to that file as one JSON
line (the GPU check keeps it: which prompts were identical, where and by how much the others left).
"""
from __future__ import annotations

import json
import math
import os

import pytest
import torch

from eagle2.decoding.decoder import Decoder
from eagle2.model.loading import load_bundle
from eagle2.policies.registry import PLAIN, TRACES, make_policy, names
from lossless_cases import PROMPTS

HAS_CUDA = torch.cuda.is_available()
ON_CUDA = [pytest.mark.cuda, pytest.mark.skipif(not HAS_CUDA, reason="no CUDA GPU here")]
# the CPU cases check the checks (a few seconds each: the full suite runs them, and the GPU check's CPU mode)
DEVICES = [pytest.param("cpu", id="cpu", marks=pytest.mark.slow), pytest.param("cuda", id="cuda", marks=ON_CUDA)]
DTYPES = ("float32", "bfloat16")
LOSSLESS = [n for n in names() if not make_policy(n).lossy]
TINY_PROMPTS = ["w1 w2 w3 w4 w5", "w9 w8 w7", "w40 w41 w3 w3 w3 w2"]
ULPS = 4   # besides the rounding difference measured, a few units in the last place of the top logit


def report(**row) -> None:
    path = os.environ.get("EAGLE2_CUDA_REPORT")
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(row) + "\n")


def ulp(x: float, dtype: torch.dtype) -> float:
    """One unit in the last place of |x| in `dtype`."""
    bits = {torch.float32: 23, torch.bfloat16: 7, torch.float16: 10}[dtype]
    return 2.0 ** (math.floor(math.log2(max(abs(x), 1e-30))) - bits)


@torch.no_grad()
def both_forwards(bundle, ids: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
    """The target's logits for the token after `ids`, as plain decoding computes them (the context
    in the cache, the last token alone in a one-row forward) and as a many-row forward does (every
    token of `ids` in one forward, as a tree's verification runs its rows)."""
    t, dev = bundle.target, bundle.device
    cache = t.new_cache(len(ids) + 4)
    t.forward_cached(cache, torch.tensor(ids[:-1], device=dev), torch.arange(len(ids) - 1, device=dev))
    cache.advance(len(ids) - 1)
    one = t.logits(t.forward_cached(cache, torch.tensor(ids[-1:], device=dev), torch.tensor([len(ids) - 1], device=dev)))
    many = t.logits(t.forward_cached(t.new_cache(len(ids) + 4), torch.tensor(ids, device=dev),
                                     torch.arange(len(ids), device=dev)))
    return one[-1].float().cpu(), many[-1].float().cpu()


def decode(bundle, policy, prompt: str, n: int, raw: bool = False, **kw) -> Decoder:
    d = Decoder(bundle, policy, max_new_tokens=n, record=False, **kw)
    d.start(prompt, raw=raw)
    d.generate()
    return d


def same_or_near_tie(bundle, plain: Decoder, other: Decoder, what: dict) -> None:
    """`other`'s tokens are plain's, or leave them at a near-tie (module docstring); one report line."""
    ref, got = plain.generated, other.generated
    i = next((j for j, (a, b) in enumerate(zip(ref, got)) if a != b), None)
    row = dict(what, device=str(bundle.device), dtype=str(bundle.dtype).removeprefix("torch."),
               policy=other.policy_name, tokens=len(ref), tau=round(other.tau, 3))
    if i is None:
        assert len(got) == len(ref) or other.finished == plain.finished, (row, len(got), len(ref))
        report(**row, identical=True)
        return
    one, many = both_forwards(bundle, plain.prompt_ids + ref[:i])
    gap = float(one[ref[i]] - one[got[i]])          # plain's choice over the tree's, in plain's own logits
    rounding = float((one - many).abs().max())      # what the two forwards differ by at this position
    tol = 2 * rounding + ULPS * ulp(float(one.max()), bundle.dtype)
    report(**row, identical=False, at=i, gap=gap, rounding=rounding, tolerance=tol)
    assert gap <= tol, (f"{other.policy_name} left plain decoding at token {i} ({got[i]} for {ref[i]}) where "
                        f"plain's logits differ by {gap:.3g}, beyond the rounding between its forwards "
                        f"({rounding:.3g}; tolerance {tol:.3g}): {row}")


@pytest.fixture(scope="module")
def tiny_folder(tiny_target):
    folder, _ = tiny_target("cuda", vocab=97, max_pos=256)
    return str(folder)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", DEVICES)
def test_greedy_trees_reproduce_plain_decoding_tiny(tiny_folder, device, dtype):
    """Every lossless policy, a random head (trees mostly rejected: many cycles, every path)."""
    b = load_bundle(tiny_folder, "random", device, dtype)
    for prompt in TINY_PROMPTS:
        plain = decode(b, PLAIN, prompt, 40)
        for name in LOSSLESS:
            same_or_near_tie(b, plain, decode(b, name, prompt, 40), dict(model="tiny", prompt=prompt))


@pytest.mark.parametrize("device", DEVICES)
def test_sampling_runs_on_the_device_and_repeats_with_its_seed(tiny_folder, device):
    """Sampled decoding draws with the decoders' CPU generators from the device's logits, for every
    policy (DySpec also samples its drafts); the same seed gives the same tokens where the tree does
    not follow measured costs (a budget's trees, and so its draws, follow the clock)."""
    from eagle2.cycle.sampling import SamplingParams
    from eagle2.policies.registry import uses_costs
    b = load_bundle(tiny_folder, "random", device, "float32")
    for name in names():
        runs = [decode(b, name, TINY_PROMPTS[0], 24, sampling=SamplingParams(temperature=0.8, top_p=0.9, seed=5))
                for _ in range(2)]
        assert len(runs[0].generated) == len(runs[1].generated) == 24, name
        assert uses_costs(name) or runs[0].generated == runs[1].generated, name


@pytest.mark.real_model
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=ON_CUDA)])
def test_greedy_trees_reproduce_plain_decoding_real_model(real_folder, device, dtype):
    """The default model and head, 5 prompts x 64 tokens, the GPU's tree (EAGLE-2 at (60, 5, 10)),
    the static tree and the hardware-aware budget."""
    b = load_bundle(None, None, device, dtype)
    for p in PROMPTS:
        plain = decode(b, PLAIN, p["prompt"], 64, raw=p.get("raw", False))
        for name in ("eagle2", "static", "eagle2-auto"):
            same_or_near_tie(b, plain, decode(b, name, p["prompt"], 64, raw=p.get("raw", False)),
                             dict(model="real", prompt=p["prompt"][:40]))


@pytest.mark.real_model
@pytest.mark.parametrize("device", [pytest.param("cuda", marks=ON_CUDA)])
def test_the_record_runs_whole_on_the_device(real_folder, device):
    """The record button's race (recorded_race.record) on the GPU: a trace the page reads back,
    titled with the GPU's name, with the GPU's t(N)."""
    from eagle2.decoding.recorded_race import DEVICE_NAME, DIGITS, record
    from eagle2.model.verify_times import RECORD_KEY
    tr = record("Explain speculative decoding in two sentences.", device, max_new_tokens=48)
    back = TRACES.from_json(tr.to_json(digits=DIGITS))
    assert back.meta[DEVICE_NAME] == torch.cuda.get_device_name() and back.meta[RECORD_KEY]
    last = back.steps[-1]
    assert len(back.meta["viz"]["series"]) == 2 and last.finished in ("eos", "max_new_tokens")
    assert last.cumulative["tokens"] == sum(len(st.new_tokens) for st in back.steps) <= 48
    assert last.finished == "eos" or last.cumulative["tokens"] == 48
    report(model="real", device=device, record_title=back.meta["viz"]["title"], cycles=len(back.steps),
           seconds=tr.meta["record_s"])
