"""eagle2/files.py: atomic replacement (never half a file, no temporary left behind) and the
t(N) cache's locked read-modify-write, which two processes updating it at once both survive."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from eagle2.files import atomic_path, atomic_write, locked_update

ROOT = Path(__file__).resolve().parent.parent


def test_atomic_write_replaces_and_leaves_nothing_behind(tmp_path):
    p = tmp_path / "sub" / "f.json"
    atomic_write(p, "one")
    atomic_write(p, b"two")
    assert p.read_bytes() == b"two" and os.listdir(p.parent) == ["f.json"]
    umask = os.umask(0)
    os.umask(umask)
    assert p.stat().st_mode & 0o777 == 0o666 & ~umask               # as open() makes it, not mkstemp's 0600
    with pytest.raises(RuntimeError):
        with atomic_path(p) as tmp:
            tmp.write_text("half")
            raise RuntimeError("the writer failed")
    assert p.read_text() == "two" and os.listdir(p.parent) == ["f.json"]
    with atomic_path(p, suffix=".part.pt2") as tmp:
        assert tmp.name.endswith(".part.pt2") and tmp.parent == p.parent
        tmp.write_text("three")
    assert p.read_text() == "three"


def test_locked_update_keeps_other_keys_and_recovers_from_a_corrupt_file(tmp_path):
    p = tmp_path / "t.json"
    assert locked_update(p, lambda d: {**d, "a": 1}) == {"a": 1}
    assert locked_update(p, lambda d: {**d, "b": 2}) == {"a": 1, "b": 2}
    p.write_text("{not json")
    assert locked_update(p, lambda d: {**d, "c": 3}) == {"c": 3}
    assert json.loads(p.read_text()) == {"c": 3}


WRITER = """
import os, sys, time
from pathlib import Path
from eagle2.model import calibration
go, tag = Path(sys.argv[1]), sys.argv[2]
(go.parent / f"ready-{tag}").touch()
while not go.exists():
    time.sleep(0.01)
for i in range(50):
    calibration.store_table(f"{tag}-{i}", {1: 0.01, 2: 0.02 + i})
"""


@pytest.mark.slow   # the full suite's: two processes (the fast tier stays under two minutes)
def test_two_processes_storing_timings_at_once_keep_every_key(tmp_path):
    cache = tmp_path / "verify_times.json"
    cache.write_text(json.dumps({"earlier": {"1": 0.5}}))
    go = tmp_path / "go"
    env = dict(os.environ, EAGLE2_TIMING_CACHE=str(cache), PYTHONPATH=str(ROOT))
    procs = [subprocess.Popen([sys.executable, "-c", WRITER, str(go), tag], cwd=ROOT, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True) for tag in ("a", "b")]
    deadline = time.monotonic() + 300
    while not all((tmp_path / f"ready-{t}").exists() for t in "ab") and time.monotonic() < deadline:
        time.sleep(0.05)
    go.touch()  # both imported: they write at the same time
    for p in procs:
        out, err = p.communicate(timeout=300)
        assert p.returncode == 0, err[-2000:]
    table = json.loads(cache.read_text())
    assert set(table) == {"earlier"} | {f"{t}-{i}" for t in "ab" for i in range(50)}
    assert table["b-7"] == {"1": 0.01, "2": 7.02}
    assert sorted(os.listdir(tmp_path)) == ["go", "ready-a", "ready-b", "verify_times.json",
                                          "verify_times.json.lock"]
