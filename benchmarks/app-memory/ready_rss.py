"""RSS of `python app.py` at its defaults once it says "ready at", and the time it took to say it.

    python benchmarks/app-memory/ready_rss.py [--runs 3] [--settle 3] [--without-ipython]

Each run starts the app on a free port in a new process, reads its stdout until the "ready at"
line (the model loaded, warmed and its t(N) read), waits --settle seconds and reads the process's
RSS. Prints one line per run and the medians as JSON. RSS in MiB (2**20 bytes). The app's root is
this checkout's, or APP_ROOT's (another checkout, measured the same way)."""
from __future__ import annotations

import argparse
import json
import os
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(os.environ.get("APP_ROOT") or Path(__file__).resolve().parents[2])


# IPython is no dependency of this project's, but Gradio imports it where it is installed (22 MiB):
# --without-ipython hides it, as on a machine that installed only the project
HIDE_IPYTHON = ("import runpy, sys; sys.modules['IPython'] = None; sys.argv = ['app.py'] + sys.argv[1:]; "
                "runpy.run_path('app.py', run_name='__main__')")


def one_run(settle: float, without_ipython: bool = False, timeout: float = 600.0) -> dict:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    t0 = time.monotonic()
    with socket.socket() as s:      # a free port (Gradio cannot serve on 0)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    entry = ["-c", HIDE_IPYTHON] if without_ipython else ["app.py"]
    proc = subprocess.Popen([sys.executable, *entry, "--port", str(port)], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        ready = None
        while time.monotonic() - t0 < timeout:
            line = proc.stdout.readline()
            if not line:
                raise RuntimeError(f"the app exited with {proc.wait()} before it was ready")
            if line.startswith("ready at"):
                ready = time.monotonic() - t0
                break
        if ready is None:
            raise RuntimeError(f"not ready in {timeout:.0f} s")
        time.sleep(settle)
        rss = psutil.Process(proc.pid).memory_info().rss / 2**20
        return {"ready_s": round(ready, 1), "rss_mib": round(rss), "line": line.strip()}
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--runs", type=int, default=3)
    ap.add_argument("--settle", type=float, default=3.0)
    ap.add_argument("--without-ipython", action="store_true", help="hide IPython from the app (see HIDE_IPYTHON)")
    a = ap.parse_args()
    runs = []
    for i in range(a.runs):
        r = one_run(a.settle, a.without_ipython)
        print(f"run {i + 1}: ready in {r['ready_s']} s, RSS {r['rss_mib']} MiB ({r['line']})", flush=True)
        runs.append(r)
    print(json.dumps({"runs": len(runs), "ready_s_median": statistics.median(r["ready_s"] for r in runs),
                      "rss_mib_median": statistics.median(r["rss_mib"] for r in runs),
                      "rss_mib": [r["rss_mib"] for r in runs], "ready_s": [r["ready_s"] for r in runs]}))


if __name__ == "__main__":
    main()
