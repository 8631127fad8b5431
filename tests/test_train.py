"""The training CLI end to end on a tiny configuration of the real default target: data by
self-distillation, fp16 feature cache, training whose loss decreases, a loadable head."""
import json

import pytest
import torch

from eagle2.model.loading import load_draft_head
from eagle2.model.loading import load_target
from eagle2_train.train import main as train_main
from eagle2.model.weights import resolve_target

pytestmark = pytest.mark.real_model  # the training CLI's default target


@pytest.mark.slow
def test_tiny_training_run_learns_and_saves_a_loadable_head(tmp_path):
    out = tmp_path / "run"
    rc = train_main(["--out", str(out), "--limit-prompts", "6", "--max-new-tokens", "24", "--gen-batch", "6",
                     "--variants", "greedy", "--epochs", "6", "--batch-tokens", "512", "--draft-vocab", "1024",
                     "--lr", "2e-3", "--noise", "0.0", "--patience", "0"])
    assert rc == 0
    rates = [json.loads(l) for l in (out / "data_rate.jsonl").read_text().splitlines()]  # the data stage's rate
    assert [r["split"] for r in rates] == ["heldout", "train"] and all(r["tokens"] > 0 for r in rates)
    assert all(r["tokens_per_s"] == pytest.approx(r["tokens"] / r["seconds"]) and r["batch"] == 6 for r in rates)
    log = json.loads((out / "train_log.json").read_text())
    steps = log["step_losses"]
    assert len(steps) >= 6
    first, last = sum(steps[:2]) / 2, sum(steps[-2:]) / 2
    assert last < 0.9 * first, f"loss did not decrease: {first:.3f} -> {last:.3f}"
    assert len(log["epochs"]) == 6 and 0.0 <= log["epochs"][-1]["heldout_top1"] <= 1.0
    # features are stored compactly (fp16) and the head loads in the official layout with its vocab map
    shard = next((out / "features_train").glob("shard*.safetensors"))
    from safetensors.torch import load_file
    assert load_file(str(shard))["feat"].dtype == torch.float16
    target = load_target(resolve_target("smollm2-135m"), torch.device("cpu"), torch.float32)
    head, own_lm = load_draft_head(out / "head", target.args)
    assert head.draft_ids is not None and head.draft_ids.numel() == 1024
    assert own_lm is None
    # resuming a finished run is a no-op that keeps the log
    assert train_main(["--out", str(out), "--limit-prompts", "6", "--max-new-tokens", "24", "--variants", "greedy",
                       "--epochs", "6", "--batch-tokens", "512", "--draft-vocab", "1024", "--lr", "2e-3", "--noise", "0.0",
                       "--patience", "0", "--stages", "train"]) == 0
    assert len(json.loads((out / "train_log.json").read_text())["epochs"]) == 6
    # fine-tuning that head with two training-time-test passes (the head reading its own features)
    tuned = tmp_path / "tuned"
    assert train_main(["--out", str(tuned), "--features", str(out), "--stages", "train", "--limit-prompts", "6",
                       "--init", str(out / "head"),
                       "--ttt-steps", "3", "--epochs", "4", "--batch-tokens", "512", "--lr", "5e-4",
                       "--noise", "0.0"]) == 0
    log2 = json.loads((tuned / "train_log.json").read_text())
    start, end = log2["epochs"][0], log2["epochs"][-1]
    assert start["epoch"] == 0 and start["init"] == str(out / "head")
    best = min(log["epochs"], key=lambda e: e["heldout_loss"])  # head/ is the best epoch's head
    assert abs(start["heldout_top1"] - best["heldout_top1"]) < 1e-6  # it starts from that head
    assert all(0.0 <= e[f"heldout_top1_step{s}"] <= 1.0 for e in log2["epochs"] for s in (2, 3))
    s2 = log2["step_losses"]  # 2 batches per epoch: the first and last epochs see the same data
    assert sum(s2[-2:]) < 0.7 * sum(s2[:2]), f"the unrolled fine-tune did not lower its loss: {s2}"
    head2, _ = load_draft_head(tuned / "head", target.args)
    assert torch.equal(head2.draft_ids, head.draft_ids)  # the draft vocabulary is kept
    # a point of a data-scaling curve: the first N conversations of the cache, stated on the card;
    # more than the cache holds is refused with the count it holds
    from eagle2.errors import UserError
    part = tmp_path / "part"
    tiny = ["--features", str(out), "--stages", "train", "--limit-prompts", "6", "--epochs", "1",
            "--batch-tokens", "512", "--draft-vocab", "1024", "--noise", "0.0"]
    assert train_main(["--out", str(part), *tiny, "--train-limit", "3"]) == 0
    assert "| data | 3 self-distilled conversations" in (part / "head" / "README.md").read_text()
    with pytest.raises(UserError, match="holds only 6 training conversations"):
        train_main(["--out", str(tmp_path / "too-many"), *tiny, "--train-limit", "7"])


def test_init_must_be_a_head_folder(tmp_path):
    import pytest
    from eagle2.errors import UserError
    from eagle2_train.train import build_parser, train_head
    a = build_parser().parse_args(["--out", str(tmp_path), "--init", str(tmp_path / "nope")])
    target = load_target(resolve_target("smollm2-135m"), torch.device("cpu"), torch.float32)
    with pytest.raises(UserError, match="head folder"):
        train_head(a, target, [], [], torch.device("cpu"))
    with pytest.raises(UserError, match="No train feature cache"):
        train_main(["--out", str(tmp_path), "--stages", "train", "--features", str(tmp_path / "none")])
    with pytest.raises(UserError, match="--ttt-steps"):
        train_main(["--out", str(tmp_path), "--ttt-steps", "0"])
    with pytest.raises(UserError, match="--train-limit"):  # refused before any cache is read
        train_main(["--out", str(tmp_path), "--stages", "train", "--train-limit", "-1"])


@pytest.mark.slow  # the real model answers in two dtypes
def test_the_data_stage_answers_in_the_chosen_dtype(tmp_path):
    """--gen-dtype sets the target's dtype for the answers only (recorded with the rate); the
    feature and train stages load the fp32 target again. An unknown stage is refused."""
    from eagle2.errors import UserError
    out = tmp_path / "run"
    assert train_main(["--out", str(out), "--stages", "data", "--limit-prompts", "2", "--max-new-tokens", "4",
                       "--variants", "greedy", "--gen-dtype", "bf16", "--threads", "1"]) == 0
    rates = [json.loads(l) for l in (out / "data_rate.jsonl").read_text().splitlines()]
    assert [r["dtype"] for r in rates] == ["bfloat16", "bfloat16"] and all(r["tokens"] > 0 for r in rates)
    assert len((out / "data_train.jsonl").read_text().splitlines()) == 2
    assert train_main(["--out", str(out), "--stages", "features", "--limit-prompts", "2", "--threads", "1"]) == 0
    from safetensors.torch import load_file
    assert load_file(str(next((out / "features_train").glob("shard*.safetensors"))))["feat"].dtype == torch.float16
    with pytest.raises(UserError, match="--stages"):
        train_main(["--out", str(out), "--stages", "data,nope"])
