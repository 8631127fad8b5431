"""A class following one presenter: the presenter Steps while F followers poll once a second, over
the page's HTTP API, against a real `python app.py` started by this script.

    python scripts/classroom_follow.py --followers 0,10,40,100 --steps 10 --out benchmarks/classroom-follow/q4_1

For each F: the presenter Steps `--steps` times, `--pause` seconds apart (a teacher explains each
tree), while F followers (each its own Gradio session, following the presenter's code) do what a
follower's tab does: /follow_tick once after following, then the classroom's mark route
(GET /classroom/mark) once a second, and /follow_frame when the mark changes. Measured: the presenter's Step
latency (p50 against F = 0, from the same server), each follower's lag from a Step's answer to
the poll that brought that cycle, the server's CPU (its process and children, seconds per second)
and RSS, and errors. Every wait is bounded (`--timeout`); the run ends with a check that the
server still answers. The followers' clients run in this process, on the same CPU: their own CPU
use is recorded beside the server's. A measurement script, not a test: its figures are recorded
under benchmarks/classroom-follow/ with the command.
"""
from __future__ import annotations

import argparse
import json
import os
import random
import sys
import threading
import time
from pathlib import Path

import httpx
import psutil

from classroom import Server, forward_line, machine, pct, rss_mb, step_args  # scripts/ beside this file

PROMPT = "Explain how a rainbow forms."


def cycle_of(status) -> int | None:
    if not isinstance(status, str) or "cycle " not in status:
        return None
    return int(status.split("cycle ")[1].split(" ")[0])


class Poller:
    """One follower: its own Gradio session (a session hash), calling the page's follow events by
    name, as a browser tab's follow timer does."""

    def __init__(self, url: str, fns: dict[str, int], timeout: float):
        self.url, self.fns, self.timeout = url.rstrip("/") + "/gradio_api/", fns, timeout
        self.root = url.rstrip("/") + "/"
        self.session = f"follower-{random.getrandbits(64):016x}"
        self.http = httpx.Client(timeout=timeout)

    def mark(self, code: str) -> str:
        """The classroom's mark route, as the page's follow timer asks it (ui/tabs/live.py)."""
        r = self.http.get(self.root + "classroom/mark", params={"code": code, "tab": self.session})
        r.raise_for_status()
        return r.json()["mark"]

    def call(self, api_name: str, *data) -> list:
        """One event, as the page calls the follow events: directly, one request (no queue)."""
        r = self.http.post(self.url + f"run/{api_name}", json={"data": list(data), "session_hash": self.session,
                                                               "fn_index": self.fns[api_name]})
        r.raise_for_status()
        return r.json()["data"]


def fn_indices(url: str) -> dict[str, int]:
    """The page's events by API name -> their fn index (the page's config)."""
    cfg = httpx.get(url.rstrip("/") + "/config", timeout=60).json()
    return {d["api_name"]: d["id"] for d in cfg["dependencies"] if d.get("api_name")}


def cpu_s(proc: psutil.Process) -> float:
    """CPU seconds of a process and its children."""
    t = proc.cpu_times()
    total = t.user + t.system
    for ch in proc.children(recursive=True):
        try:
            c = ch.cpu_times()
            total += c.user + c.system
        except psutil.Error:
            pass
    return total


def one_round(server: Server, F: int, steps: int, pause: float, timeout: float, max_new_tokens: int) -> dict:
    from gradio_client import Client
    srv = psutil.Process(server.proc.pid)
    me = psutil.Process()
    presenter = Client(server.url + "/", verbose=False, download_files=False)
    args = step_args(PROMPT, max_new_tokens)
    presenter.submit(*args, api_name="/step").result(timeout=timeout)     # a race to present
    code = presenter.submit(api_name="/present").result(timeout=timeout)[0]
    answered: dict[int, float] = {}      # cycle -> when the presenter's Step answered (monotonic)
    lags, errors, polls = [], [], [0]
    lock = threading.Lock()
    stop = threading.Event()
    fns = fn_indices(server.url)
    clients = [Poller(server.url, fns, timeout) for _ in range(F)]
    rss0 = rss_mb(server.proc.pid)
    for c in clients:                       # the follow event's inputs: the session (a state), the code, the panels
        c.call("follow", None, code, None)
    rss_followed = rss_mb(server.proc.pid)

    def follower(c):
        # the followers stand for browsers on other machines: on this shared CPU they run at the
        # lowest priority, so the server's figures are the server's (their CPU is recorded apart)
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 19)
        seen = set()
        try:
            last = [c.call("follow_tick", None)[0]]     # just followed: the tab asks the page once
        except Exception as e:
            with lock:
                errors.append(f"tick: {type(e).__name__}: {e}"[:200])
            return
        nxt = time.monotonic() + random.random()
        while not stop.is_set():
            stop.wait(max(0.0, nxt - time.monotonic()))
            if stop.is_set():
                return
            nxt += 1.0
            try:
                mark = c.mark(code)                  # the tick: the mark route
                n = None
                if mark != last[0]:                  # a new mark: the page draws the frame
                    last[0] = mark
                    frame = c.call("follow_frame", None, None)   # inputs: the session, the open panels
                    n = cycle_of(frame[0])
            except Exception as e:
                with lock:
                    errors.append(f"poll: {type(e).__name__}: {e}"[:200])
                continue
            got = time.monotonic()
            with lock:
                polls[0] += 1
                if n is not None and n not in seen:
                    seen.add(n)
                    if n in answered:
                        lags.append(max(0.0, got - answered[n]))

    th = [threading.Thread(target=follower, args=(c,), daemon=True) for c in clients]
    for t in th:
        t.start()
    time.sleep(2.0)                          # every follower polling before the first timed Step
    lat = []
    cpu0, me0, w0 = cpu_s(srv), cpu_s(me), time.perf_counter()
    for _ in range(steps):
        t0 = time.perf_counter()
        try:
            out = presenter.submit(*args, api_name="/step").result(timeout=timeout)
            n = cycle_of(out[0])
            with lock:
                answered[n] = time.monotonic()
            lat.append(time.perf_counter() - t0)
        except Exception as e:
            errors.append(f"step: {type(e).__name__}: {e}"[:200])
        time.sleep(pause)
    time.sleep(2.5)                          # the last cycle reaches every follower
    wall = time.perf_counter() - w0
    cpu1, me1 = cpu_s(srv), cpu_s(me)
    stop.set()
    for t in th:
        t.join(timeout + 5)
    expected = len(answered) * F
    return {"followers": F, "steps": steps, "steps_answered": len(lat), "pause_s": pause,
            "step_p50_s": round(pct(lat, 0.5), 3), "step_p90_s": round(pct(lat, 0.9), 3),
            "step_max_s": round(max(lat, default=0), 3),
            "lag_p50_s": round(pct(lags, 0.5), 3), "lag_p90_s": round(pct(lags, 0.9), 3),
            "lag_max_s": round(max(lags, default=0), 3),
            "cycles_seen": len(lags), "cycles_expected": expected, "polls": polls[0], "errors": len(errors),
            "error_samples": sorted(set(errors))[:5],
            "server_cpu_per_s": round((cpu1 - cpu0) / wall, 3), "clients_cpu_per_s": round((me1 - me0) / wall, 3),
            "rss_before_followers_mb": round(rss0), "rss_followed_mb": round(rss_followed),
            "rss_per_follower_kb": round((rss_followed - rss0) * 1024 / F, 1) if F else None,
            "threads_alive_after": sum(t.is_alive() for t in th), "server_answers_after": server.answers()}


def report(folder: str) -> str:
    d = json.loads((Path(folder) / "summary.json").read_text())
    rows = ["| followers | presenter Step p50 / p90 s | vs 0 followers | follower lag p50 / p90 / max s | "
            "cycles seen / expected | server CPU s/s | clients CPU s/s | RSS per follower KB | errors |",
            "| --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    base = next((r["step_p50_s"] for r in d["runs"] if r["followers"] == 0), None)
    for r in d["runs"]:
        ratio = f"{r['step_p50_s'] / base:.2f}x" if base else "-"
        rows.append(f"| {r['followers']} | {r['step_p50_s']} / {r['step_p90_s']} | {ratio} | "
                    f"{r['lag_p50_s']} / {r['lag_p90_s']} / {r['lag_max_s']} | {r['cycles_seen']} / {r['cycles_expected']} | "
                    f"{r['server_cpu_per_s']} | {r['clients_cpu_per_s']} | {r['rss_per_follower_kb']} | {r['errors']} |")
    return "\n".join(rows)


def main(argv=None) -> int:
    if (argv if argv is not None else sys.argv[1:])[:1] == ["--report"]:
        print(report((argv if argv is not None else sys.argv[1:])[1]))
        return 0
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--followers", default="0,10,40,100", help="comma-separated F")
    ap.add_argument("--steps", type=int, default=10, help="presenter Steps per F")
    ap.add_argument("--pause", type=float, default=2.0, help="seconds between the presenter's Steps")
    ap.add_argument("--timeout", type=float, default=120.0, help="seconds one call may take, queue included")
    ap.add_argument("--max-new-tokens", type=int, default=512)
    ap.add_argument("--out", required=True)
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    args: list[str] = []
    server = Server(args, out / "server.log", {})
    result = {"command": "python scripts/classroom_follow.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine(), "app_args": args}
    try:
        result["ready"] = server.wait_ready()
        time.sleep(3)
        result["forward"] = forward_line(server)
        result["runs"] = []
        for F in [int(x) for x in a.followers.split(",")]:
            r = one_round(server, F, a.steps, a.pause, a.timeout, a.max_new_tokens)
            print(json.dumps(r), flush=True)
            result["runs"].append(r)
            if not r["server_answers_after"]:
                break
    finally:
        server.stop()
    (out / "summary.json").write_text(json.dumps(result, indent=1))
    print(report(str(out)))
    print(f"wrote {out / 'summary.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
