"""The head recipe's scripts: `scripts/head_recipe.py` plans every step and reports how far a run
got from its files alone; `scripts/head_table.py` builds the comparison table from an evaluation
log and a tau run (the real shipped head's tau file), refusing a tau run whose trees disagreed."""
from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest
import torch

REPO = Path(__file__).resolve().parent.parent


def script(name: str):
    spec = importlib.util.spec_from_file_location(name, REPO / "scripts" / f"{name}.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_the_recipe_plans_every_step_in_order(capsys, tmp_path):
    recipe = script("head_recipe")
    assert recipe.main(["--dry-run", "--run", str(tmp_path / "r"), "--out", str(tmp_path / "o")]) == 0
    steps = [ln.split("]")[0][1:] for ln in capsys.readouterr().out.splitlines()]
    assert list(dict.fromkeys(steps)) == ["prompts", "restore", "data", "archive", "features", "e3", "e12", "eval", "tau", "table",
                                               "curves"]
    assert recipe.main(["--steps", "data,nope", "--dry-run"]) == 2
    # EAGLE-3 from random init; the EAGLE-1/2 head of the comparison fine-tunes the shipped one
    planned = recipe.steps(tmp_path / "r", tmp_path / "o", "2")
    e3, e12 = (planned[k][0] for k in ("e3", "e12"))
    assert "--init" not in e3 and e12[e12.index("--init") + 1] == recipe.SHIPPED
    # training runs through the training package's own entry point, the tau runs through the engine's
    assert all(cmd[1:4] == ["-m", "eagle2_train", k if k == "prompts" else "train"]
               for k in ("prompts", "data", "features", "e3", "e12", "eval") for cmd in planned[k])
    assert all(cmd[1:4] == ["-m", "eagle2", "tau"] for cmd in planned["tau"])


def test_status_reads_how_far_each_step_got(capsys, tmp_path):
    recipe = script("head_recipe")
    run, out = tmp_path / "r", tmp_path / "o"
    run.mkdir()
    (run / "data_train.jsonl").write_text('{"id": 1}\n{"id": 2}\n{"id": 3}\n')
    (run / "data_heldout.jsonl").write_text('{"id": 9}\n')
    (run / "features3_train").mkdir()
    (run / "features3_train" / "index.json").write_text(json.dumps({"done": [[1, "greedy"], [2, "greedy"]]}))
    e3 = tmp_path / "r-e3"
    e3.mkdir()
    (e3 / "train_log.json").write_text(json.dumps({"epochs": [
        {"epoch": 1, "heldout_loss": 5.0, "heldout_top1": 0.3}, {"epoch": 2, "heldout_loss": 4.5, "heldout_top1": 0.4}]}))
    torch.save({"epoch": 1, "in_epoch": {"epoch": 2, "step": 17}}, str(e3 / "checkpoint.pt"))
    (out / "tau-shipped").mkdir(parents=True)
    (out / "tau-shipped" / "tau.json").write_text("{}")
    assert recipe.main(["--status", "--run", str(run), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    assert "train 3 of " in text and "held-out 1 of 60" in text
    assert "features (train): 2 of 3 conversations" in text and "features (heldout): 0 of 1" in text
    assert "e3: 2 epoch(s) done, best 2 (held-out loss 4.500, top-1 0.400); epoch 3 saved at step 17" in text
    assert "e12: not started" in text and "tau shipped: done" in text and "tau e3: not yet" in text
    e12 = tmp_path / "r-e12"  # a fine-tune: its log opens with the init's evaluation, epoch 0
    e12.mkdir()
    (e12 / "train_log.json").write_text(json.dumps({"epochs": [
        {"epoch": 0, "heldout_loss": 0.7, "heldout_top1": 0.5}, {"epoch": 1, "heldout_loss": 0.6, "heldout_top1": 0.55}]}))
    assert recipe.main(["--status", "--run", str(run), "--out", str(out)]) == 0
    assert "e12: 1 epoch(s) done, best 1 (held-out loss 0.600, top-1 0.550)" in capsys.readouterr().out


def test_the_table_is_built_from_the_runs(capsys, tmp_path):
    table = script("head_table")
    ev = tmp_path / "eval"
    ev.mkdir()
    (ev / "train_log.json").write_text(json.dumps({"epochs": [
        {"epoch": 0, "heldout_top1": 0.544, "heldout_top1_step2": 0.48, "heldout_top1_step3": 0.45}]}))
    tau = REPO / "benchmarks" / "head-r3" / "tau-shipped"
    assert table.main([f"shipped={ev},{tau}"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert len(rows) == 3 and rows[2].startswith("| shipped | 0.544 | 0.480 | 0.450 | 2.67 | 2.36 | 2.30 | 1.16x |")
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "tau.json").write_text(json.dumps({**json.loads((tau / "tau.json").read_text()), "identical": False}))
    with pytest.raises(SystemExit, match="disagreed"):
        table.main([f"shipped={ev},{bad}"])


def test_a_head_ships_with_a_card_from_the_runs_that_judged_it(tmp_path):
    ship = script("ship_head")
    run = tmp_path / "run-e3"
    head = run / "head"
    head.mkdir(parents=True)
    (head / "config.json").write_text("{}")
    (head / "model.safetensors").write_bytes(b"weights")
    (head / "README.md").write_text("# EAGLE-3 draft head\n\ntrainer's card\n")
    (run / "train_log.json").write_text(json.dumps({"epochs": [
        {"epoch": 1, "train_loss": 9.0, "heldout_loss": 2.5, "heldout_top1": 0.5, "wall_s": 600},
        {"epoch": 2, "train_loss": 8.0, "heldout_loss": 2.2, "heldout_top1": 0.61, "wall_s": 1200}]}))
    ev = tmp_path / "eval"
    ev.mkdir()
    rec = {"epoch": 0, "init": str(head), "heldout_top1": 0.61, "heldout_top1_step2": 0.55, "heldout_top1_step3": 0.5}
    (ev / "train_log.json").write_text(json.dumps({"epochs": [rec]}))
    shipped = json.loads((REPO / "benchmarks" / "head-r3" / "tau-shipped" / "tau.json").read_text())
    tau = tmp_path / "tau"
    tau.mkdir()
    (tau / "tau.json").write_text(json.dumps({**shipped, "head_sha256": ship.sha256_of(head / "model.safetensors")}))
    dest = tmp_path / "assets" / "heads" / "new"
    assert ship.main([str(head), str(dest), "--eval", str(ev), "--tau", str(tau), "--trained", "By the recipe."]) == 0
    assert (dest / "model.safetensors").read_bytes() == b"weights" and (dest / "train_log.json").exists()
    text = (dest / "README.md").read_text()
    assert text.startswith("# EAGLE-3 draft head") and "| this head | 0.610 | 0.550 | 0.500 | 2.67 |" in text
    assert "By the recipe.\n\n| this head epoch |" in text and "| 2 (kept) | 8.000 | 2.200 | 0.610 |" in text
    assert "| eagle2 (60,5,10) | **2.67** |" in text and ship.sha256_of(head / "model.safetensors") in text

    (tau / "tau.json").write_text(json.dumps(shipped))  # another head's tau: refused, DEST untouched
    (dest / "README.md").write_text("kept")
    with pytest.raises(SystemExit, match="tau run is of weights"):
        ship.main([str(head), str(dest), "--eval", str(ev), "--tau", str(tau)])
    assert (dest / "README.md").read_text() == "kept"
    (ev / "train_log.json").write_text(json.dumps({"epochs": [{**rec, "init": str(tmp_path)}]}))
    with pytest.raises(SystemExit, match="the evaluation is of"):
        ship.main([str(head), str(dest), "--eval", str(ev), "--tau", str(tau)])


def test_a_step_runs_only_for_heads_that_exist_and_tau_once_per_weights(tmp_path):
    recipe = script("head_recipe")
    run, out = tmp_path / "r", tmp_path / "o"
    plan = recipe.steps(run, out, "2")
    evals = {c[c.index("--init") + 1]: c for c in plan["eval"]}
    e12 = str(run.with_name("r-e12") / "head")
    assert recipe.at_run_time("eval", evals[e12]) == (None, f"{e12} is not trained yet")
    shipped = [c for c in plan["tau"] if c[c.index("--head") + 1] == recipe.SHIPPED][0]
    done = out / "tau-shipped" / "tau.json"
    done.parent.mkdir(parents=True)
    done.write_text(json.dumps({"head_sha256": "another head's"}))
    assert recipe.at_run_time("tau", shipped) == (shipped, "")  # other weights: measured again
    done.write_text(json.dumps({"head_sha256": recipe.sha256_of(REPO / recipe.SHIPPED / "model.safetensors")}))
    assert recipe.at_run_time("tau", shipped)[0] is None
    assert recipe.at_run_time("table", plan["table"][0]) == (None, "no head has its runs yet")
    (run.with_name("r-eval-shipped")).mkdir(parents=True)
    (run.with_name("r-eval-shipped") / "train_log.json").write_text("{}")
    cmd, why = recipe.at_run_time("table", plan["table"][0])
    assert [x.split("=")[0] for x in cmd[2:]] == ["shipped"] and why == "without e3, e12 (runs missing)"
    (run.with_name("r-e3")).mkdir()
    (run.with_name("r-e3") / "train_log.json").write_text("{}")
    cmd, why = recipe.at_run_time("curves", plan["curves"][0])
    assert [x for x in cmd if "=" in x] == [f"e3={run.with_name('r-e3')}"] and cmd[-3] == "--out"
