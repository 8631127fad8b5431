"""The shipped heads are real draft models: EAGLE-2 accepts several tokens per target forward with
them (tau is a property of the head and the target, not a timing); the EAGLE-3 one loads by
default, the EAGLE-1/2 one with --head."""
import json
from pathlib import Path

import pytest

from eagle2.decoding.decoder import Decoder
from eagle2.model.loading import head_label
from eagle2.model.weights import ASSETS, PRESETS

HEAD = Path(PRESETS["smollm2-135m"].head)


def heldout(n):
    rows = [json.loads(l) for l in (ASSETS / "prompts" / "heldout.jsonl").read_text().splitlines() if l.strip()]
    return [r["turns"][0] for r in rows[:n]]


def test_shipped_head_is_present_and_loaded_by_default(real_bundle):
    assert (HEAD / "config.json").exists() and (HEAD / "model.safetensors").exists()
    assert real_bundle.head_name == "smollm2-135m (shipped EAGLE-3 head)"  # named, not a machine path
    assert real_bundle.head_name == head_label(str(HEAD), PRESETS["smollm2-135m"])
    assert real_bundle.head.draft_ids is not None  # reduced draft vocabulary recorded in the checkpoint
    assert type(real_bundle.head).__name__ == "Eagle3Head" and real_bundle.target.aux_layers == (2, 15, 27)


@pytest.mark.parametrize("policy", ["eagle2"])
@pytest.mark.slow
def test_shipped_head_tau_on_heldout_prompts(real_bundle, policy):
    toks = fwds = 0
    for p in heldout(3):
        d = Decoder(real_bundle, policy, max_new_tokens=64, record=False, total_tokens=60, depth=5, top_k=10)
        d.start(p)
        d.generate()
        toks += len(d.generated)
        fwds += d.target_forwards
    tau = toks / fwds
    # a random head gives tau = 1.00 here; the default EAGLE-3 head measured 3.00 on these prompts,
    # the EAGLE-1/2 heads before it 2.56 (the last), 2.59-2.60, 2.53 and 2.31. The bar is 2.8.
    assert tau >= 2.8, f"EAGLE-2 tau with the default head is {tau:.2f} (< 2.8)"


@pytest.mark.slow
@pytest.mark.real_model
def test_the_shipped_eagle12_head_loads_and_is_lossless():
    """assets/heads/smollm2-135m (the EAGLE-1/2 head, `--head` to use it) reads the target's final
    features; greedy EAGLE-2 and the static tree with it equal plain decoding."""
    from eagle2.model.loading import load_bundle
    bundle = load_bundle(head=str(ASSETS / "heads" / "smollm2-135m"))
    assert type(bundle.head).__name__ == "EagleHead" and not bundle.head.aux_layers
    toks = fwds = 0
    for p in heldout(2):
        out = {}
        for policy in ("plain", "eagle2", "static"):
            d = Decoder(bundle, policy, max_new_tokens=48, record=False)
            d.start(p)
            d.generate()
            out[policy] = d.generated
            if policy == "eagle2":
                toks, fwds = toks + len(d.generated), fwds + d.target_forwards
        assert out["eagle2"] == out["plain"] and out["static"] == out["plain"]
    # 2.74 here (2.67 over all 60 held-out prompts, its model card); a random head gives 1.00
    assert toks / fwds >= 2.5, f"EAGLE-2 tau with the shipped EAGLE-1/2 head is {toks / fwds:.2f}"
