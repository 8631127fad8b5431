"""A training run stops and resumes cleanly (`python -m eagle2_train train`, eagle2_train/checkpoint.py):
killed mid-epoch, the same command continues from the last finished epoch and ends with exactly the
head and log of an uninterrupted run; a changed flag or a corrupt checkpoint is a clear UserError;
training stops by the held-out loss and keeps the best epoch's head. On a tiny random target."""
from __future__ import annotations

import json
import random

import pytest
import torch
from safetensors.torch import load_file

import eagle2_train.train as train_mod
from eagle2.errors import UserError

H, V, LAYERS = 64, 97, 8
TEMPLATE = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
FLAGS = ["--stages", "train", "--epochs", 3, "--batch-tokens", 256, "--draft-vocab", 48, "--lr", 3e-3,
         "--ttt-steps", 2, "--patience", 0]


@pytest.fixture(scope="module")
def feats(tiny_target, tmp_path_factory):
    """(target folder, run folder holding EAGLE-1/2 feature caches)."""
    from transformers import AutoTokenizer
    folder, _ = tiny_target("resume-target", vocab=V, hidden=H, layers=LAYERS, lm_std=0.3)
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.chat_template = TEMPLATE
    tok.save_pretrained(str(folder))
    out = tmp_path_factory.mktemp("resume-feats")
    rng = random.Random(1)
    for split, n, start in (("train", 24, 0), ("heldout", 6, 1000)):
        with open(out / f"data_{split}.jsonl", "w") as f:
            for i in range(start, start + n):
                msgs = [{"role": "user", "content": " ".join(f"w{rng.randrange(1, V)}" for _ in range(6))},
                        {"role": "assistant", "content": " ".join(f"w{rng.randrange(1, V)}" for _ in range(30))}]
                f.write(json.dumps({"id": i, "variant": "greedy", "messages": msgs}) + "\n")
    assert cli(folder, out, "--stages", "features") == 0
    return folder, out


def cli(folder, out, *extra) -> int:
    return train_mod.main(["--target", str(folder), "--out", str(out), "--threads", "1", *map(str, extra)])


def run(feats, out, *extra) -> int:
    return cli(feats[0], out, "--features", feats[1], *FLAGS, *extra)


def head_tensors(out) -> dict:
    return load_file(str(out / "head" / "model.safetensors"))


def epochs(out) -> list[dict]:
    return [{k: v for k, v in e.items() if k != "wall_s"} for e in json.loads((out / "train_log.json").read_text())
            ["epochs"]]


def test_a_run_killed_mid_epoch_resumes_to_the_uninterrupted_result(feats, tmp_path, monkeypatch):
    whole = tmp_path / "whole"
    assert run(feats, whole) == 0
    steps = json.loads((whole / "train_log.json").read_text())["steps_per_epoch"]
    assert steps >= 2

    real = train_mod.head_loss
    calls = {"n": 0}

    def dies_in_epoch_2(*a, train=True, **k):
        if train:
            calls["n"] += 1
            if calls["n"] == steps + 2:  # the second training step of epoch 2
                raise KeyboardInterrupt
        return real(*a, train=train, **k)

    cut = tmp_path / "cut"
    monkeypatch.setattr(train_mod, "head_loss", dies_in_epoch_2)
    with pytest.raises(KeyboardInterrupt):
        run(feats, cut)
    monkeypatch.setattr(train_mod, "head_loss", real)
    assert [e["epoch"] for e in epochs(cut)] == [1]  # epoch 1 finished and was kept
    assert run(feats, cut) == 0  # the same command finds the resume point
    assert epochs(cut) == epochs(whole)
    a, b = head_tensors(whole), head_tensors(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    log = json.loads((cut / "train_log.json").read_text())
    assert len(log["step_losses"]) == 3 * steps


@pytest.mark.parametrize("epoch,step", [(1, 1), (2, 2)])  # in the first epoch no log exists yet
def test_a_run_killed_mid_epoch_resumes_from_its_last_save_within_the_epoch(feats, tmp_path, monkeypatch, epoch,
                                                                            step):
    """--save-minutes: the resume point is also saved within an epoch (here after every step), so
    the run continues from the step after it, not from the epoch's start, and still ends with the
    uninterrupted run's head and log."""
    whole = tmp_path / "whole"
    assert run(feats, whole, "--save-minutes", 0) == 0
    steps = json.loads((whole / "train_log.json").read_text())["steps_per_epoch"]
    assert steps >= 3

    real = train_mod.head_loss
    calls = {"n": 0}

    done = (epoch - 1) * steps + step

    def dies_in_the_step_after(*a, train=True, **k):
        if train:
            calls["n"] += 1
            if calls["n"] == done + 1:
                raise KeyboardInterrupt
        return real(*a, train=train, **k)

    cut = tmp_path / "cut"
    monkeypatch.setattr(train_mod, "head_loss", dies_in_the_step_after)
    with pytest.raises(KeyboardInterrupt):
        run(feats, cut, "--save-minutes", 1e-9)
    saved = torch.load(str(cut / "checkpoint.pt"), weights_only=True)
    assert saved["in_epoch"]["epoch"] == epoch - 1 and saved["in_epoch"]["step"] == step
    calls["n"] = 0

    def counts(*a, train=True, **k):
        calls["n"] += bool(train)
        return real(*a, train=train, **k)

    monkeypatch.setattr(train_mod, "head_loss", counts)
    assert run(feats, cut, "--save-minutes", 1e-9) == 0
    assert calls["n"] == 3 * steps - done  # only the steps not yet done
    assert epochs(cut) == epochs(whole)
    a, b = head_tensors(whole), head_tensors(cut)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    log, ref = (json.loads((o / "train_log.json").read_text()) for o in (cut, whole))
    assert log["step_losses"] == ref["step_losses"]
    with pytest.raises(UserError, match="--save-minutes"):
        run(feats, tmp_path / "bad", "--save-minutes", -1)


def test_a_changed_flag_or_a_corrupt_checkpoint_is_a_clear_error(feats, tmp_path):
    out = tmp_path / "run"
    assert cli(feats[0], out, "--features", feats[1], *FLAGS[:3], 1, *FLAGS[4:]) == 0
    with pytest.raises(UserError, match="--lr"):
        run(feats, out, "--lr", 1e-3)  # the later --lr wins
    (out / "checkpoint.pt").write_bytes(b"not a checkpoint")
    with pytest.raises(UserError, match="not a readable training checkpoint"):
        run(feats, out)


def test_training_stops_by_the_held_out_loss_and_keeps_the_best_head(feats, tmp_path, monkeypatch):
    real = train_mod.evaluate
    losses = iter([1.0, 0.5, 0.7, 0.9, 0.4])  # best at epoch 2, then two epochs without improvement

    def scripted(*a, **k):
        return {**real(*a, **k), "heldout_loss": next(losses)}

    saved = []
    real_save = train_mod.save
    monkeypatch.setattr(train_mod, "evaluate", scripted)
    monkeypatch.setattr(train_mod, "save", lambda a, head, folder, card: (saved.append(len(saved)),
                                                                         real_save(a, head, folder, card)))
    out = tmp_path / "early"
    assert cli(feats[0], out, "--features", feats[1], *FLAGS[:3], 5, *FLAGS[4:-1], 2) == 0
    ep = epochs(out)
    assert [e["epoch"] for e in ep] == [1, 2, 3, 4]  # stopped after 2 epochs without a better loss
    assert ep[-1]["best_epoch"] == 2 and len(saved) == 2  # head/ written at epochs 1 and 2 only
    assert run(feats, out, "--epochs", 5, "--patience", 2) == 0  # resuming a stopped run trains nothing more
    assert len(epochs(out)) == 4


def test_a_fine_tune_that_only_gets_worse_keeps_its_starting_head(feats, tmp_path, monkeypatch):
    first = tmp_path / "first"
    assert cli(feats[0], first, "--features", feats[1], *FLAGS[:3], 1, *FLAGS[4:]) == 0
    real = train_mod.evaluate
    losses = iter([0.3, 0.5, 0.6])  # the start, then two worse epochs

    def scripted(*a, **k):
        return {**real(*a, **k), "heldout_loss": next(losses)}

    monkeypatch.setattr(train_mod, "evaluate", scripted)
    tuned = tmp_path / "tuned"
    assert cli(feats[0], tuned, "--features", feats[1], "--stages", "train", "--init", first / "head",
               "--epochs", 4, "--patience", 2, "--batch-tokens", 256, "--lr", 3e-3, "--ttt-steps", 2) == 0
    assert [e["epoch"] for e in epochs(tuned)] == [0, 1, 2] and epochs(tuned)[-1]["best_epoch"] == 0
    a, b = head_tensors(first), head_tensors(tuned)
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_bf16_autocast_trains_the_same_run_within_rounding(feats, tmp_path):
    """--amp bf16 runs the training forward under autocast (it changes the step losses, so it is
    applied) and ends close to the fp32 run; the choice is a shaping flag; `auto` resolves by device."""
    runs = {}
    for amp in ("off", "bf16"):
        out = tmp_path / amp
        assert run(feats, out, "--amp", amp) == 0
        runs[amp] = json.loads((out / "train_log.json").read_text())
    off, bf = runs["off"]["step_losses"], runs["bf16"]["step_losses"]
    assert len(off) == len(bf) and off != bf
    assert all(abs(x - y) <= 0.05 * x for x, y in zip(off, bf))
    h_off, h_bf = runs["off"]["epochs"][-1]["heldout_loss"], runs["bf16"]["epochs"][-1]["heldout_loss"]
    assert abs(h_off - h_bf) <= 0.05 * h_off
    with pytest.raises(UserError, match="--amp"):
        run(feats, tmp_path / "off", "--amp", "bf16")
    assert train_mod.amp_dtype("off", torch.device("cpu")) is None
    assert train_mod.amp_dtype("bf16", torch.device("cpu")) is torch.bfloat16
    assert train_mod.amp_dtype("auto", torch.device("cpu")) in (None, torch.bfloat16)


@pytest.mark.slow
def test_the_compiled_step_trains_the_same_run_within_rounding(feats, tmp_path):
    """--compile runs the step's forward and loss through torch.compile (not a shaping flag: the
    same run to float rounding, so a run may resume with or without it)."""
    runs = {}
    for name, extra in (("eager", ()), ("compiled", ("--compile",))):
        out = tmp_path / name
        assert run(feats, out, "--amp", "off", "--noise", 0, *extra) == 0
        runs[name] = json.loads((out / "train_log.json").read_text())
    a, b = runs["eager"]["step_losses"], runs["compiled"]["step_losses"]
    assert len(a) == len(b) and all(abs(x - y) <= 1e-3 * x for x, y in zip(a, b))
    ea, eb = runs["eager"]["epochs"][-1], runs["compiled"]["epochs"][-1]
    assert abs(ea["heldout_loss"] - eb["heldout_loss"]) <= 1e-3 * ea["heldout_loss"]
    assert abs(ea["heldout_top1"] - eb["heldout_top1"]) <= 0.02
    # with the default input noise (drawn inside the compiled graph) and bf16 autocast it trains too
    out = tmp_path / "noisy"
    assert run(feats, out, "--compile", "--amp", "bf16") == 0
    log = json.loads((out / "train_log.json").read_text())
    assert len(log["epochs"]) == 3 and log["epochs"][-1]["heldout_loss"] < log["epochs"][0]["heldout_loss"]
