"""Training EAGLE-3 heads through `python -m eagle2_train train --head-kind eagle3` (docs/algorithms.md §1),
on a tiny random 8-layer Llama target with a word-level chat template: the features stage stores
the target's aux-layer states in its own cache and resumes; training lowers the loss; the unrolled
training-time-test pass equals decoding a chain with forward_cached; the saved head has the
official layout, reloads through load_draft_head / load_bundle and decodes greedy output identical
to plain greedy decoding; --init of the other kind is a clear UserError."""
from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file

from eagle2.decoding.decoder import Decoder
from eagle2.errors import UserError
from eagle2.model.head import EagleHead, save_head
from eagle2.model.head3 import Eagle3Head
from eagle2.model.llama import LlamaArgs
from eagle2.model.loading import load_bundle, load_draft_head, load_target
from eagle2_train.selfdistill import load_features
from eagle2_train.train import build_parser, train_head
from eagle2_train.train import main as train_main

H, V, LAYERS = 64, 97, 8
AUX = (2, 4, 5)  # the default (2, L//2, L-3) for L = 8
TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"  # each message's words, in order


@pytest.fixture(scope="module")
def target(tiny_target):
    from transformers import AutoTokenizer
    folder, hf = tiny_target("train3-target", vocab=V, hidden=H, layers=LAYERS, lm_std=0.3)
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(folder))
    return folder, hf


def words(rng: random.Random, n: int) -> str:
    return " ".join(f"w{rng.randrange(1, V)}" for _ in range(n))


def write_data(path, n: int, seed: int, start: int = 0) -> None:
    """n conversations in the data stage's format (user words, then assistant words), appended."""
    rng = random.Random(seed)
    with open(path, "a") as f:
        for i in range(start, start + n):
            msgs = [{"role": "user", "content": words(rng, rng.randrange(4, 9))},
                    {"role": "assistant", "content": words(rng, rng.randrange(20, 40))}]
            f.write(json.dumps({"id": i, "variant": "greedy", "messages": msgs}) + "\n")


def cli(folder, out, *extra) -> int:
    return train_main(["--target", str(folder), "--out", str(out), "--threads", "1", "--head-kind", "eagle3",
                       *map(str, extra)])


@pytest.fixture(scope="module")
def run(target, tmp_path_factory):
    """A run folder whose features and a short training (2 training-time-test steps) are done."""
    out = tmp_path_factory.mktemp("train3-run")
    write_data(out / "data_train.jsonl", 24, seed=1)
    write_data(out / "data_heldout.jsonl", 6, seed=2, start=1000)
    assert cli(target[0], out, "--stages", "features,train", "--epochs", 6, "--batch-tokens", 256,
               "--draft-vocab", 48, "--lr", 3e-3, "--ttt-steps", 2, "--patience", 0) == 0
    return out


def test_features_stage_writes_the_aux_cache_and_resumes(target, tmp_path):
    folder, hf = target
    out = tmp_path / "run"
    out.mkdir()
    write_data(out / "data_train.jsonl", 3, seed=3)
    write_data(out / "data_heldout.jsonl", 2, seed=4, start=1000)
    assert cli(folder, out, "--stages", "features") == 0
    cache = out / "features3_train"
    assert not (out / "features_train").exists()  # an EAGLE-1/2 cache is not touched
    index = json.loads((cache / "index.json").read_text())
    assert index["aux_layers"] == list(AUX) and len(index["done"]) == 3 and len(index["shards"]) == 1
    shard = load_file(str(cache / index["shards"][0]))
    assert shard["aux"].dtype == shard["feat"].dtype == torch.float16
    assert shard["aux"].shape == (shard["ids"].numel(), 3 * H) and shard["feat"].shape[1] == H
    # the aux columns are transformers' hidden states entering layers 2, 4, 5, side by side
    n = int(shard["lens"][0])
    with torch.no_grad():
        hs = hf(input_ids=shard["ids"][:n][None], output_hidden_states=True).hidden_states
    ref = torch.cat([hs[i][0] for i in AUX], dim=-1)
    assert (shard["aux"][:n].float() - ref).abs().max().item() < 2e-2 * ref.abs().max().item()
    # resuming: finished conversations are skipped, new ones land in a new shard
    first = (cache / index["shards"][0]).read_bytes()
    write_data(out / "data_train.jsonl", 2, seed=5, start=100)
    assert cli(folder, out, "--stages", "features") == 0
    index = json.loads((cache / "index.json").read_text())
    assert len(index["done"]) == 5 and len(index["shards"]) == 2
    assert (cache / index["shards"][0]).read_bytes() == first
    with pytest.raises(UserError, match="aux-layers"):  # a cache holds one set of layers
        cli(folder, out, "--stages", "features", "--aux-layers", "1,3,6")


def rand_head3(args: LlamaArgs, seed: int) -> Eagle3Head:
    torch.manual_seed(seed)
    head = Eagle3Head(args, AUX)
    with torch.no_grad():
        for name, p in head.named_parameters():
            p.copy_(1.0 + 0.2 * torch.randn(p.shape) if "norm" in name else 0.1 * torch.randn(p.shape))
    return head.eval()


def test_unrolled_passes_match_decoding_a_chain(target):
    """forward_train_unrolled's pass s, row j must be what decoding computes for the depth-s node at
    position j: the true pairs (fused states) up to j-s+1 in the head's cache, then the chain of
    drafted pairs, each reading its parent's output (D wide: fc skipped) under the tree mask."""
    args = LlamaArgs.from_hf(json.loads((target[0] / "config.json").read_text()))
    head = rand_head3(args, 5)
    T, S = 7, 4
    feats, toks = torch.randn(1, T, 3 * H), torch.randint(0, V, (1, T))
    with torch.no_grad():
        g1 = head.forward_train(feats, toks)
        passes = [g1[0]] + [g[0] for g in head.forward_train_unrolled(feats, toks, g1, S)]
    for s in range(2, S + 1):
        for j in range(s - 1, T):
            c = j - s + 2  # true pairs 0..c-1 are committed
            cache = head.new_cache(32)
            g0 = head.forward_cached(cache, feats[0, :c], toks[0, :c], torch.arange(c), 0)
            cache.advance(c)
            assert (g0 - g1[0, :c]).abs().max().item() < 1e-5  # the teacher-forced pass is the absorb
            g = g0[-1:]  # the root's prediction, read by the depth-2 node
            for d in range(2, s + 1):
                pos = c + d - 2
                mask = torch.ones(1, d - 1, dtype=torch.bool)  # ancestors in the tree part, and itself
                g = head.forward_cached(cache, g, toks[0, pos:pos + 1], torch.tensor([pos]), c + d - 2, mask)
            assert (g[0] - passes[s - 1][j]).abs().max().item() < 1e-5, (s, j)
    assert (passes[1][1:] - g1[0, 1:]).abs().max().item() > 1e-3  # it reads its own outputs
    # EAGLE-3 lets gradients flow through the fed-back outputs (the EAGLE-1/2 head stops them)
    fed = g1.detach().requires_grad_(True)
    head.forward_train_unrolled(feats, toks, fed, 2)[0].sum().backward()
    assert fed.grad is not None and fed.grad.abs().sum() > 0


def test_training_lowers_the_loss_and_saves_the_official_layout(run, target):
    log = json.loads((run / "train_log.json").read_text())
    steps = log["step_losses"]
    first, last = sum(steps[:3]) / 3, sum(steps[-3:]) / 3
    assert last < 0.85 * first, f"loss did not decrease: {first:.3f} -> {last:.3f}"
    assert len(log["epochs"]) == 6
    assert all(0.0 <= e[k] <= 1.0 for e in log["epochs"] for k in ("heldout_top1", "heldout_top1_step2"))
    head_dir = run / "head"
    cfg = json.loads((head_dir / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["draft_vocab_size"] == 48
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == [i - 1 for i in AUX]
    st = load_file(str(head_dir / "model.safetensors"))
    assert st["fc.weight"].shape == (H, 3 * H) and st["fc.weight"].dtype == torch.float16
    assert st["lm_head.weight"].shape == (48, H) and "embed_tokens.weight" not in st
    assert st["t2d"].dtype == torch.bool and int(st["t2d"].sum()) == 48
    ids = st["d2t"] + torch.arange(48)
    assert torch.equal(st["t2d"].nonzero().flatten(), ids)
    tgt = load_target(target[0], torch.device("cpu"), torch.float32)
    assert (st["lm_head.weight"].float() - tgt.lm_head.weight[ids]).abs().max() > 1e-3  # the LM head trained
    assert "EAGLE-3 draft head" in (head_dir / "README.md").read_text()
    # resuming a finished run is a no-op that keeps the log
    assert cli(target[0], run, "--stages", "train", "--epochs", 6, "--batch-tokens", 256, "--draft-vocab", 48,
               "--lr", 3e-3, "--ttt-steps", 2, "--patience", 0) == 0
    assert len(json.loads((run / "train_log.json").read_text())["epochs"]) == 6


def test_saved_head_reloads_and_greedy_decoding_is_lossless(run, target):
    tgt = load_target(target[0], torch.device("cpu"), torch.float32)
    head, own = load_draft_head(run / "head", tgt.args)
    assert isinstance(head, Eagle3Head) and head.aux_layers == AUX and own.shape == (48, H)
    b = load_bundle(target=str(target[0]), head=str(run / "head"))
    assert isinstance(b.head, Eagle3Head) and b.target.aux_layers == AUX
    for prompt in ([5, 17, 33, 2, 71, 64, 8], [1, 2, 3, 4, 5, 6, 7, 8, 9], [40, 41, 40, 41, 40]):
        plain = Decoder(b, "plain", max_new_tokens=24, record=False)
        plain.start(input_ids=prompt)
        plain.generate()
        for policy, kw in (("static", {}), ("eagle2", {"total_tokens": 12, "depth": 3, "top_k": 3})):
            dec = Decoder(b, policy, max_new_tokens=24, record=False, **kw)
            dec.start(input_ids=prompt)
            dec.generate()
            assert dec.generated == plain.generated, (prompt, policy)


def test_init_fine_tunes_an_eagle3_folder(run, target, tmp_path):
    out = tmp_path / "tuned"
    # --input-scale 1: the fine-tune trains fc on unit-scale states; the start (and, below, the saved
    # head's evaluation) shows the folding keeps the function
    assert cli(target[0], out, "--features", run, "--stages", "train", "--init", run / "head", "--epochs", 2,
               "--batch-tokens", 256, "--lr", 1e-3, "--ttt-steps", 3, "--input-scale", 1) == 0
    log = json.loads((out / "train_log.json").read_text())
    # head/ holds the best epoch's head (held-out loss)
    before = min(json.loads((run / "train_log.json").read_text())["epochs"], key=lambda e: e["heldout_loss"])
    start = log["epochs"][0]
    assert start["epoch"] == 0 and abs(start["heldout_loss"] - before["heldout_loss"]) < 2e-2  # that head, in fp16
    assert "heldout_top1_step3" in log["epochs"][-1]
    tuned = load_file(str(out / "head" / "model.safetensors"))
    assert torch.equal(tuned["d2t"], load_file(str(run / "head" / "model.safetensors"))["d2t"])  # vocabulary kept
    # --epochs 0 evaluates a head on the held-out cache and stops (how heads are compared)
    ev = tmp_path / "eval"
    assert cli(target[0], ev, "--features", run, "--stages", "train", "--init", out / "head", "--epochs", 0,
               "--batch-tokens", 256, "--ttt-steps", 3) == 0
    only = json.loads((ev / "train_log.json").read_text())["epochs"]
    assert len(only) == 1 and only[0]["epoch"] == 0 and "heldout_top1_step3" in only[0]
    best = min(log["epochs"], key=lambda e: e["heldout_loss"])  # head/ is the best epoch's (the start included)
    assert abs(only[0]["heldout_top1"] - best["heldout_top1"]) < 2e-2


def test_eagle12_head_trains_on_the_eagle3_cache(run, target, tmp_path):
    """One pass of the target serves both kinds: the EAGLE-3 cache holds the final features too."""
    out = tmp_path / "eagle12"
    assert train_main(["--target", str(target[0]), "--out", str(out), "--threads", "1", "--features", str(run),
                       "--stages", "train", "--epochs", "2", "--batch-tokens", "256", "--draft-vocab", "48"]) == 0
    cfg = json.loads((out / "head" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLM"]
    assert load_file(str(out / "head" / "model.safetensors"))["fc.weight"].shape == (H, 2 * H)
    convs = load_features(run / "features3_train", aux=False)
    assert convs and all("aux" not in c for c in convs)
    assert len(json.loads((out / "train_log.json").read_text())["epochs"]) == 2


def test_init_of_the_other_kind_is_a_user_error(run, target, tmp_path):
    tgt = load_target(target[0], torch.device("cpu"), torch.float32)
    eagle = tmp_path / "eagle-head"
    save_head(EagleHead(tgt.args), eagle)
    a = build_parser().parse_args(["--out", str(tmp_path / "o1"), "--head-kind", "eagle3", "--init", str(eagle)])
    with pytest.raises(UserError, match=r"EAGLE-1/2 head.*--head-kind eagle\b"):
        train_head(a, tgt, [], [], torch.device("cpu"), AUX)
    a = build_parser().parse_args(["--out", str(tmp_path / "o2"), "--init", str(run / "head")])
    with pytest.raises(UserError, match="EAGLE-3 head.*--head-kind eagle3"):
        train_head(a, tgt, [], [], torch.device("cpu"))
    a = build_parser().parse_args(["--out", str(tmp_path / "o3"), "--head-kind", "eagle3", "--init", "last-layer"])
    with pytest.raises(UserError, match="last-layer"):
        train_head(a, tgt, [], [], torch.device("cpu"), AUX)
    convs = load_features(run / "features3_train")  # they hold f too: an EAGLE-1/2 head could train on them
    a = build_parser().parse_args(["--out", str(run), "--draft-vocab", "48"])
    with pytest.raises(UserError, match="resumes an EAGLE-3 head, not EAGLE-1/2"):
        train_head(a, tgt, convs, convs, torch.device("cpu"))
    with pytest.raises(UserError, match="--epochs 0 evaluates the head folder given with --init"):
        train_main(["--out", str(tmp_path / "o7"), "--epochs", "0"])
    with pytest.raises(UserError, match="--epochs must be >= 0"):
        train_main(["--out", str(tmp_path / "o8"), "--epochs", "-1", "--init", str(run / "head")])
    with pytest.raises(UserError, match="--aux-layers is for --head-kind eagle3"):
        train_main(["--out", str(tmp_path / "o4"), "--aux-layers", "1,2,3"])
    with pytest.raises(UserError, match="--aux-layers must name"):
        cli(target[0], tmp_path / "o5", "--stages", "features", "--aux-layers", "3,3,9")
    with pytest.raises(UserError, match="No train feature cache for --head-kind eagle3"):
        cli(target[0], tmp_path / "o6", "--stages", "train")


def test_input_scale_trains_on_unit_states_and_saves_the_raw_state_weight(target, tmp_path):
    """The aux states' huge channels are scaled away for training; the saved fc reads raw states."""
    from eagle2_train.train_heads import save, scale_fc_inputs
    tgt = load_target(target[0], torch.device("cpu"), torch.float32)
    head = rand_head3(tgt.args, seed=3)
    head.attach(tgt.lm_head.weight.detach())
    convs = [{"aux": torch.randn(12, 3 * H) * torch.where(torch.arange(3 * H) == 5, 2e4, 1.0)} for _ in range(4)]
    scale_fc_inputs(head, convs, fresh=True)
    assert head.input_scale[5] < 1e-3 and 0.5 < float(head.input_scale[0]) < 2.0
    trained = head.fc.weight.detach().clone()
    a = build_parser().parse_args(["--out", str(tmp_path), "--head-kind", "eagle3"])
    save(a, head, tmp_path / "head", "card")
    assert torch.equal(head.fc.weight, trained)  # the trained weight is back, bit for bit
    saved = load_file(str(tmp_path / "head" / "model.safetensors"))["fc.weight"].float()
    x = convs[0]["aux"]
    assert torch.allclose(x @ saved.T, (x * head.input_scale) @ trained.T, rtol=2e-2, atol=2e-2)
    fine = rand_head3(tgt.args, seed=3)  # a fine-tune starts from the same function
    fine.fc.weight.data.copy_(saved)
    scale_fc_inputs(fine, convs, fresh=False)
    assert torch.allclose((x * fine.input_scale) @ fine.fc.weight.T, x @ saved.T, rtol=1e-4, atol=1e-3)


@pytest.mark.slow
def test_the_compiled_loss_matches_the_eager_one(run, target):
    """train --compile's loss_core through torch.compile gives the eager loss, agreements and
    gradients of an EAGLE-3 head with unrolled passes, to float rounding, over batches of
    different shapes (one compiled graph serves them all)."""
    from eagle2_train.train import batches, compiled_core
    from eagle2_train.train_heads import build_head, objective
    from eagle2_train.train_loss import collate, head_loss
    a = build_parser().parse_args(["--out", str(run), "--head-kind", "eagle3", "--ttt-steps", "3",
                                   "--init", str(run / "head")])
    tgt = load_target(target[0], torch.device("cpu"), torch.float32)
    for p in tgt.parameters():
        p.requires_grad_(False)
    convs = load_features(run / "features3_train")
    head, _ = build_head(a, tgt, convs, torch.device("cpu"), AUX)
    head.train()
    obj = objective(a, tgt.lm_head.weight.detach()[head.draft_ids])
    params = [p for p in head.parameters() if p.requires_grad]
    for batch in list(batches(convs, 256, True, random.Random(0)))[:3]:
        x = collate(batch, torch.device("cpu"), "aux")
        (l1, s1), (l2, s2) = (head_loss(head, *x, obj, ttt_steps=3, core=c) for c in (None, compiled_core()))
        assert abs(float(l1) - float(l2)) <= 1e-4 * abs(float(l1)) and s1["n"] == s2["n"]
        assert all(abs(s1[k] - s2[k]) <= 1e-6 + 1.0 / s1["n"] for k in s1)
        g1, g2 = torch.autograd.grad(l1, params), torch.autograd.grad(l2, params)
        assert all((u - v).norm() <= 1e-3 * (u.norm() + 1e-6) for u, v in zip(g1, g2))
