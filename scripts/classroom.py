"""A class pressing Step at once: K students x S Steps over the page's HTTP API, against a real
`python app.py` started by this script, and the server's memory before, during and after.

    python scripts/classroom.py --students 1,4,16,32 --steps 10 --out benchmarks/classroom/q4_1
    python scripts/classroom.py --students 0 --churn 300 --out benchmarks/classroom/churn   # memory
    python scripts/classroom.py --report benchmarks/classroom/q4_1 benchmarks/classroom/churn  # a table

Each student is its own Gradio session (a `gradio_client.Client`), started together; a Step's
latency is measured by the student from submitting to the answer, so it includes the wait in the
queue. Students press Step again as soon as the last one answered (a class hammering the button:
the worst case). Every wait is bounded (`--timeout` per Step): a Step with no answer is an error,
and the run ends with a check that the server still answers. `--churn N` then has N sessions
Step once each and leave, and records the server's RSS after they are gone (their decoders are
freed when they stay idle, ui/session.py). A measurement script, not a test: its figures are
recorded under benchmarks/classroom/ with the command.
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

from eagle2.machine import cpu_info
from ui.screenshot import free_port, stop_group  # the installed project (pip install -e .)

ROOT = Path(__file__).resolve().parent.parent
PROMPTS = ["Write a haiku about the sea.", "Explain photosynthesis in two sentences.",
           "Give three tips for learning to code.", "What is a prime number?",
           "Describe a cat to someone who has never seen one.", "Why is the sky blue?",
           "Name four planets and one fact about each.", "How do I boil an egg?"]


def rss_mb(pid: int) -> float:
    """Resident memory of the server process, in MB."""
    import psutil
    return psutil.Process(pid).memory_info().rss / 2**20


class Server:
    def __init__(self, args: list[str], log: Path, env: dict):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = log
        with open(log, "w") as f:
            self.proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--port", str(self.port), *args],
                                         cwd=ROOT, stdout=f, stderr=subprocess.STDOUT, start_new_session=True,
                                         env=dict(os.environ, PYTHONUNBUFFERED="1", GRADIO_ANALYTICS_ENABLED="False",
                                                  **env))

    def wait_ready(self, timeout: float = 600) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            text = self.log.read_text()
            line = next((ln for ln in text.splitlines() if ln.startswith(("ready at", "error:"))), None)
            if line:
                return line
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        raise SystemExit(f"the server did not get ready:\n{self.log.read_text()[-3000:]}")

    def answers(self) -> bool:
        try:
            with urllib.request.urlopen(self.url + "/gradio_api/info", timeout=15) as r:
                return r.status == 200
        except OSError:
            return False

    def stop(self) -> None:
        stop_group(self.proc, grace=20)


class Peak:
    """Samples the server's RSS every 0.2 s in a thread; `.peak` is the largest seen."""

    def __init__(self, pid: int):
        self.pid, self.peak, self._stop = pid, rss_mb(pid), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()

    def _run(self):
        while not self._stop.wait(0.2):
            try:
                self.peak = max(self.peak, rss_mb(self.pid))
            except Exception:
                return

    def stop(self) -> float:
        self._stop.set()
        self._t.join(5)
        return self.peak


def forward_line(server: Server) -> str:
    """Which forward the server runs now (its model line, as the page shows it)."""
    try:
        from gradio_client import Client
        c = Client(server.url + "/", verbose=False, download_files=False)
        return str(c.predict(api_name="/model_status")[0])[-300:]
    except Exception as e:  # the figure is a note, not a result
        return f"unknown ({type(e).__name__})"


def step_args(prompt: str, max_new_tokens: int) -> list:
    """/step's parameters at the page's defaults for a CPU, as a browser sends them."""
    from ui.session import defaults
    d = defaults("cpu")
    return [prompt, d.policy, d.compare, d.total_tokens, d.depth, d.top_k, d.temperature, d.top_p, d.seed,
            max_new_tokens, d.side_by_side, "path value", False]


def pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(round(q * (len(xs) - 1))))] if xs else float("nan")


def classroom(server: Server, K: int, S: int, timeout: float, max_new_tokens: int) -> dict:
    from gradio_client import Client
    lat, errors = [], []
    lock = threading.Lock()
    barrier = threading.Barrier(K, timeout=120)

    def student(i):
        try:
            c = Client(server.url + "/", verbose=False, download_files=False)
            barrier.wait()
            args = step_args(PROMPTS[i % len(PROMPTS)] + ("" if i < len(PROMPTS) else f" ({i})"), max_new_tokens)
            for _ in range(S):
                t0 = time.perf_counter()
                try:
                    c.submit(*args, api_name="/step").result(timeout=timeout)
                except Exception as e:
                    with lock:
                        errors.append(f"{type(e).__name__}: {e}"[:200])
                    continue
                with lock:
                    lat.append(time.perf_counter() - t0)
        except Exception as e:
            with lock:
                errors.append(f"client: {type(e).__name__}: {e}"[:200])

    before = rss_mb(server.proc.pid)
    peak = Peak(server.proc.pid)
    t0 = time.perf_counter()
    th = [threading.Thread(target=student, args=(i,), daemon=True) for i in range(K)]
    for t in th:
        t.start()
    deadline = time.monotonic() + S * timeout + 180
    for t in th:
        t.join(max(0.0, deadline - time.monotonic()))
    hung = sum(t.is_alive() for t in th)
    wall = time.perf_counter() - t0
    top = peak.stop()
    return {"students": K, "steps_each": S, "steps_answered": len(lat), "errors": len(errors),
            "error_samples": sorted(set(errors))[:5], "students_hung": hung, "wall_s": round(wall, 1),
            "steps_per_s": round(len(lat) / wall, 2),
            "p50_s": round(pct(lat, 0.5), 2), "p90_s": round(pct(lat, 0.9), 2), "max_s": round(max(lat, default=0), 2),
            "rss_before_mb": round(before), "rss_peak_mb": round(top), "rss_after_mb": round(rss_mb(server.proc.pid)),
            "server_answers_after": server.answers()}


def churn(server: Server, n: int, timeout: float, settle: float, max_new_tokens: int) -> dict:
    """n sessions, a few at a time, each Steps once and leaves; RSS before, at peak, and once the
    idle sessions have been freed (after `settle` seconds)."""
    from gradio_client import Client
    before = rss_mb(server.proc.pid)
    peak = Peak(server.proc.pid)
    errors, done = [], 0
    lock = threading.Lock()

    def visitor(i):
        nonlocal done
        try:
            c = Client(server.url + "/", verbose=False, download_files=False)
            c.submit(*step_args(PROMPTS[i % len(PROMPTS)], max_new_tokens), api_name="/step").result(timeout=timeout)
            with lock:
                done += 1
        except Exception as e:
            with lock:
                errors.append(f"{type(e).__name__}: {e}"[:200])

    t0 = time.perf_counter()
    for start in range(0, n, 4):
        th = [threading.Thread(target=visitor, args=(i,), daemon=True) for i in range(start, min(n, start + 4))]
        for t in th:
            t.start()
        for t in th:
            t.join(timeout + 60)
    wall = time.perf_counter() - t0
    at_end = rss_mb(server.proc.pid)
    time.sleep(settle)
    server.answers()
    time.sleep(2)
    return {"sessions": n, "answered": done, "errors": len(errors), "error_samples": sorted(set(errors))[:5],
            "wall_s": round(wall, 1), "rss_before_mb": round(before), "rss_peak_mb": round(peak.stop()),
            "rss_at_end_mb": round(at_end), "settle_s": settle, "rss_after_settle_mb": round(rss_mb(server.proc.pid)),
            "server_answers_after": server.answers()}


def machine() -> dict:
    return {**cpu_info(), "python": platform.python_version()}


def report(folders: list[str]) -> str:
    """The load runs of `folders` (each with a summary.json) as one markdown table."""
    rows = ["| run | students x Steps | answered | errors | p50 s | p90 s | max s | Steps/s | RSS before / peak / after MB |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for f in folders:
        d = json.loads((Path(f) / "summary.json").read_text())
        for r in d.get("runs", []):
            rows.append(f"| {Path(f).name} | {r['students']} x {r['steps_each']} | {r['steps_answered']} | {r['errors']} | "
                        f"{r['p50_s']} | {r['p90_s']} | {r['max_s']} | {r['steps_per_s']} | "
                        f"{r['rss_before_mb']} / {r['rss_peak_mb']} / {r['rss_after_mb']} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    if argv is None and sys.argv[1:2] == ["--report"] or argv and argv[:1] == ["--report"]:
        print(report((argv or sys.argv[1:])[1:]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--students", default="1,4,16,32", help="comma-separated K; 0 for none")
    ap.add_argument("--steps", type=int, default=10)
    ap.add_argument("--timeout", type=float, default=300.0, help="seconds one Step may take, queue included")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--concurrency", type=int, default=None, help="app.py --concurrency (default: the app's)")
    ap.add_argument("--threads", type=int, default=None, help="app.py --threads (default: the app's)")
    ap.add_argument("--space", action="store_true",
                    help="serve as a Hugging Face Space does: 0.0.0.0:7860-style binding (a free port), "
                         "an empty cache folder (EAGLE2_CACHE in a new temporary folder: the model is fetched and converted)")
    ap.add_argument("--churn", type=int, default=0, help="then N sessions Step once and leave (memory)")
    ap.add_argument("--idle", type=float, default=None,
                    help="EAGLE2_SESSION_IDLE for the server: seconds before an idle session's decoders are freed")
    ap.add_argument("--settle", type=float, default=None, help="seconds to wait after the churn (default: idle + 10)")
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    args = []
    if a.concurrency:
        args += ["--concurrency", str(a.concurrency)]
    if a.threads:
        args += ["--threads", str(a.threads)]
    env = {"EAGLE2_SESSION_IDLE": str(a.idle)} if a.idle is not None else {}
    if a.space:
        args += ["--host", "0.0.0.0"]
        env["EAGLE2_CACHE"] = tempfile.mkdtemp(prefix="eagle2-space-cache-")
    server = Server(args, out / "server.log", env)
    result = {"command": "python scripts/classroom.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine(), "app_args": args, "env": env}
    try:
        t_start = time.perf_counter()
        result["ready"] = server.wait_ready()
        result["ready_after_s"] = round(time.perf_counter() - t_start, 1)
        time.sleep(3)
        result["rss_ready_mb"] = round(rss_mb(server.proc.pid))
        result["runs"] = []
        for K in [int(x) for x in a.students.split(",") if int(x) > 0]:
            r = classroom(server, K, a.steps, a.timeout, a.max_new_tokens)
            r["forward_after"] = forward_line(server)
            print(json.dumps(r), flush=True)
            result["runs"].append(r)
            if not r["server_answers_after"]:
                break
        if a.churn:
            settle = a.settle if a.settle is not None else (a.idle or 0) + 10
            result["churn"] = churn(server, a.churn, a.timeout, settle, a.max_new_tokens)
            print(json.dumps(result["churn"]), flush=True)
        result["forward_at_end"] = forward_line(server)
    finally:
        server.stop()
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    print(f"wrote {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
