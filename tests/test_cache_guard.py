"""The tests' own guard of the user's cache (conftest.py), run on a session of its own whose user
cache is a temporary HOME's: a background t(N) measurement still running when its test ends lands
in that test's cache, not in the user's after the session (how tiny test models' tables reached
~/.cache/eagle2/verify_times.json), and a test whose measurement writes into the user's cache
fails itself, naming the file."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent

INNER = '''
import threading
import time
from pathlib import Path
from types import SimpleNamespace

from eagle2.model import calibration, measurer

started = {"late": threading.Event(), "into-user": threading.Event()}


def slow_measurement(bundle, stop=None, **kw):   # the model's forwards, timed: here a pause
    started[bundle.name].set()
    time.sleep(3)   # longer than the rest of the session takes to end
    return {n: 0.001 * n for n in calibration.GRID}


calibration.measure_verify_times = slow_measurement


def bundle(name):
    return SimpleNamespace(name=name, device=SimpleNamespace(type="cpu"),
                           forward=SimpleNamespace(timing_id="float32"))


def test_ends_while_its_measurement_runs():
    measurer.request_measurement(bundle("late"))
    assert started["late"].wait(30)


def test_measures_into_the_users_cache(monkeypatch):
    monkeypatch.setenv("EAGLE2_TIMING_CACHE", str(Path.home() / ".cache" / "eagle2" / "verify_times.json"))
    measurer.request_measurement(bundle("into-user"))
    assert started["into-user"].wait(30)   # measuring: the test's end waits for it
'''


def test_no_measurement_outlives_its_test_and_one_into_the_users_cache_fails_its_test(tmp_path):
    inner, home, base = tmp_path / "inner", tmp_path / "home", tmp_path / "base"
    inner.mkdir()
    shutil.copy(REPO / "tests" / "conftest.py", inner / "conftest.py")
    (inner / "test_inner.py").write_text(INNER)
    env = {k: v for k, v in os.environ.items() if k not in ("EAGLE2_CACHE", "EAGLE2_TIMING_CACHE")}
    env.update(HOME=str(home), PYTHONPATH=str(REPO))
    done = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-rA", "--basetemp", str(base),
                           "test_inner.py"], cwd=inner, env=env, capture_output=True, text=True, timeout=300)
    out = done.stdout
    assert "PASSED test_inner.py::test_ends_while_its_measurement_runs" in out, out[-3000:]
    user_file = home / ".cache" / "eagle2" / "verify_times.json"
    failed = [ln for ln in out.splitlines() if "test_measures_into_the_users_cache wrote into the user's cache" in ln]
    assert failed and f"{user_file} (added)" in failed[0], out[-3000:]
    assert done.returncode == 1
    # the user's file holds the failing test's table only; the late one is in its own test's cache
    assert [k.split("|")[0] for k in json.loads(user_file.read_text())] == ["into-user"]
    late = [p for p in base.rglob("verify_times.json") if "late|" in p.read_text()]
    assert [p.parent.name.startswith("eagle2-cache") for p in late] == [True], late
