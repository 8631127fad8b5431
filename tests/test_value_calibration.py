"""scripts/value_calibration.py's bins: each node counted once, in the bin of its value, with the
bin's mean value and the share accepted."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parent.parent


def test_bins_count_each_node_once_with_its_bins_means():
    spec = importlib.util.spec_from_file_location("value_calibration", REPO / "scripts" / "value_calibration.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    pred = np.array([0.005, 0.25, 0.26, 0.55, 1.0, 0.95])
    obs = np.array([0.0, 1.0, 0.0, 1.0, 1.0, 1.0])
    rows = mod.bins(pred, obs)
    assert sum(r["n"] for r in rows) == len(pred)
    by = {tuple(r["bin"]): r for r in rows}
    assert by[(0.2, 0.3)] == {"bin": [0.2, 0.3], "n": 2, "predicted": 0.255, "accepted": 0.5}
    assert by[(0.9, 1.0)]["n"] == 2 and by[(0.9, 1.0)]["predicted"] == 0.975   # a value of 1 is in the last bin
    assert [r["bin"][0] for r in rows] == [0.0, 0.2, 0.5, 0.9]
