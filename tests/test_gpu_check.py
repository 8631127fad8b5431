"""The prepared GPU check (scripts/gpu_check.sh), whose GPU part runs only where a GPU is lent: its
steps in order within the budget, the wheels it is given at the versions the project pins, and its
whole run on the CPU on the tiny model (GPU_CHECK_DEVICE=cpu): every step ends well and leaves its
outputs, the traces open in Replay."""
from __future__ import annotations

import json
import os
import re
import subprocess
from pathlib import Path

import pytest

from ui.traces import read_upload

REPO = Path(__file__).resolve().parent.parent
SCRIPT = REPO / "scripts" / "gpu_check.sh"
STEPS = ["nvidia-smi", "environment", "fetch", "tests", "bench-bfloat16", "bench-float32", "profile-bfloat16",
         "profile-float32", "record-writing-greedy", "record-math-greedy"]


def run(tmp_path, timeout: float, **env) -> subprocess.CompletedProcess:
    full = {k: v for k, v in os.environ.items() if not k.startswith("GPU_CHECK_")}
    full.update(OUT=str(tmp_path / "out"), **env)
    return subprocess.run(["bash", str(SCRIPT)], cwd=tmp_path, env=full, capture_output=True, text=True,
                          timeout=timeout)


def test_the_steps_in_order_on_cuda_within_the_budget(tmp_path):
    r = run(tmp_path, 60, GPU_CHECK_DRY_RUN="1")
    assert r.returncode == 0, r.stderr
    lines = r.stdout.strip().splitlines()
    assert [ln.split(" (")[0] for ln in lines] == STEPS
    caps = [int(re.search(r"\((\d+)s\)", ln).group(1)) for ln in lines]
    assert 0 < sum(caps) and all(c <= 150 for c in caps)
    steps = dict(zip(STEPS, lines))
    assert "-m cuda" in steps["tests"] and "EAGLE2_CUDA_REPORT=" in steps["tests"]
    for name in STEPS[4:]:
        assert "--device cuda" in steps[name], name
    assert "plain\\,eagle2\\,static\\,eagle2-auto" in steps["bench-float32"]
    assert "--out" in steps["record-writing-greedy"] and "traces/gpu-writing-greedy.json" in steps["record-writing-greedy"]


def test_a_spent_budget_skips_every_step_at_once(tmp_path):
    """Past its budget the check starts nothing: each step is written down as skipped and the run
    ends in seconds (a lent GPU's minutes are never spent waiting on a step that cannot finish)."""
    r = run(tmp_path, 60, GPU_CHECK_BUDGET="4")
    assert r.returncode == 0, r.stderr
    rows = [ln.split("\t") for ln in (tmp_path / "out" / "steps.tsv").read_text().splitlines()[1:]]
    assert [row[0] for row in rows] == STEPS and all(row[1] == "skipped" for row in rows), rows
    assert not list((tmp_path / "out" / "logs").iterdir())


def test_the_carried_wheels_are_the_pinned_versions():
    pins = {}
    for line in (REPO / "constraints.txt").read_text().splitlines():
        if "==" in line and not line.startswith("#"):
            name, version = line.split("==")
            pins[name.lower().replace("_", "-")] = version.strip()
    wheels = [ln.strip() for ln in (REPO / "scripts" / "gpu_wheels.txt").read_text().splitlines()
              if ln.strip() and not ln.startswith("#")]
    names = set()
    for w in wheels:
        name, version = w.split("==")
        key = name.lower().replace("_", "-")
        assert pins.get(key) == version, f"{w}: constraints.txt pins {pins.get(key)}"
        names.add(key)
    # what the engine imports that the GPU machine lacks (its trace types, the GGUF reader) and the test runner
    assert {"pydantic", "pydantic-core", "annotated-types", "typing-inspection", "gguf", "pytest"} <= names


@pytest.mark.slow
def test_the_whole_check_runs_on_the_cpu(tmp_path, tiny_target):
    folder, _ = tiny_target("gpu-check", vocab=97, max_pos=256)
    r = run(tmp_path, 600, GPU_CHECK_DEVICE="cpu", GPU_CHECK_TARGET=str(folder), GPU_CHECK_HEAD="random",
            EAGLE2_THREADS="1")
    out = tmp_path / "out"
    assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
    rows = [ln.split("\t") for ln in (out / "steps.tsv").read_text().splitlines()[1:]]
    done = {name: rc for name, rc, *_ in rows}
    want = ["environment", "tests", "bench-float32", "profile-float32", "record-writing-greedy", "record-math-greedy"]
    assert all(done[n] == "0" for n in want), (done, r.stdout[-3000:])
    assert "3 passed" in (out / "logs" / "tests.log").read_text()
    assert json.loads((out / "bench-float32" / "summary.json").read_text())
    assert json.loads((out / "profile-float32.json").read_text())["verify_s"]
    for name in ("writing-greedy", "math-greedy"):
        view = read_upload(out / "traces" / f"gpu-{name}.json")
        assert len(view.series) == 3 and view.meta["viz"]["title"].startswith("Recorded on")
    readme = (out / "README.md").read_text()
    assert "| tests | 0 |" in readme and "trace: gpu-writing-greedy.json" in readme
