"""Training curves (viz/train_report.py) from train_log.json files: each run keeps its colour in
every chart, the epoch kept in head/ is starred and marked in the table, and a missing or empty log
is one clear error."""
from __future__ import annotations

import json

from viz import train_report


def log(losses, heldout, top1):
    return {"steps_per_epoch": len(losses) // len(heldout), "step_losses": losses,
            "epochs": [{"epoch": i + 1, "train_loss": losses[(i + 1) * len(losses) // len(heldout) - 1],
                        "heldout_loss": h, "heldout_top1": t, "heldout_top1_step2": t - 0.1,
                        "heldout_top1_step3": t - 0.2, "wall_s": 60.0 * (i + 1)}
                       for i, (h, t) in enumerate(zip(heldout, top1))]}


def test_curves_and_table_of_two_runs(tmp_path, capsys):
    runs = {"e3": log([9.0, 8.0, 7.5, 7.0, 6.8, 6.9], [6.0, 5.5, 5.6], [0.4, 0.5, 0.49]),
            "e12": log([5.0, 4.0, 3.5, 3.0], [4.0, 3.0], [0.45, 0.55])}
    for k, v in runs.items():
        (tmp_path / k).mkdir()
        (tmp_path / k / "train_log.json").write_text(json.dumps(v))
    out = tmp_path / "curves.html"
    assert train_report.main([f"{k}={tmp_path / k}" for k in runs] + ["--out", str(out), "--markdown"]) == 0
    page = out.read_text()
    assert page.count("plotly") > 0 and "Held-out top-1 agreement" in page
    text = capsys.readouterr().out
    assert "| 2 (kept) | 7.000 | 5.500 | 0.500 | 0.400 | 0.300 | 2 |" in text  # e3's best held-out loss
    assert "| 2 (kept) |" in text.split("e12 epoch")[1]

    logs = {k: train_report.read_log(tmp_path / k) for k in runs}
    steps, held, agree = (f(logs) for f in (train_report.step_loss_chart, train_report.heldout_loss_chart,
                                            train_report.agreement_chart))
    assert [t.x[-1] for t in steps.data] == [3.0, 2.0]  # x in epochs
    stars = [t for t in held.data if t.marker.symbol == "star"]
    assert [(t.x[0], t.y[0]) for t in stars] == [(2, 5.5), (2, 3.0)]
    by_run = {}
    for t in list(held.data) + list(agree.data):
        by_run.setdefault(t.name.split(" ")[0] if t.name else None, set()).add(t.line.color or t.marker.color)
    assert len(by_run["e3"]) == 1 and len(by_run["e12"]) == 1 and by_run["e3"] != by_run["e12"]
    assert len(agree.data) == 6  # 2 runs x depths 1-3


def test_a_missing_or_unfinished_log_is_a_clear_error(tmp_path, capsys):
    assert train_report.main([f"x={tmp_path / 'nope'}", "--out", str(tmp_path / "o.html")]) == 2
    assert "no readable train_log.json" in capsys.readouterr().err
    (tmp_path / "train_log.json").write_text(json.dumps({"epochs": []}))
    assert train_report.main([f"x={tmp_path}", "--out", str(tmp_path / "o.html")]) == 2
    assert "no finished epoch" in capsys.readouterr().err
