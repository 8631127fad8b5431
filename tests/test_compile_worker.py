"""The background compile ends with the app: it exits when its stdin (whose write end only the app
holds) reaches end of file, however the app ended."""
from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CHILD = "from eagle2.tools.compile import exit_with_parent; import time; exit_with_parent(); print('up', flush=True); time.sleep(120)"


@pytest.mark.slow   # the full suite's: a worker process and its wait (the fast tier stays under two minutes)
def test_the_worker_exits_when_its_parent_is_gone():
    # the parent starts the worker the way CompiledTarget.start_background does, then dies at once
    parent = (f"import subprocess, sys, time; p = subprocess.Popen([sys.executable, '-c', {CHILD!r}], "
              f"stdin=subprocess.PIPE); print(p.pid, flush=True); time.sleep(1.5)")
    # the worker shares the captured stdout, so run() returns only once the worker has exited too:
    # a worker outliving its parent fails this by the timeout
    out = subprocess.run([sys.executable, "-c", parent], cwd=ROOT, capture_output=True, text=True, timeout=60)
    lines = out.stdout.split()
    assert "up" in lines, out.stdout + out.stderr
    pid = int(lines[0])
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline and Path(f"/proc/{pid}").exists() \
            and "zombie" not in Path(f"/proc/{pid}/status").read_text().lower():
        time.sleep(0.2)
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text().lower(), \
        "the worker outlived its parent"
