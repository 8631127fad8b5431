"""The page's race as a visitor sees it, beside the bench on the same prompt: serve `python app.py`
at its defaults (the q4_1 forward), press Step N times on the page's default prompt in Debian's
Chromium, save what the metric cards say, the "Where the time goes" chart at 1440 and 390 px (ui.screenshot's
helpers) and the exported trace; then, with the server stopped, run the bench on the same prompt,
policies, threads and number of new tokens, and compare each decoder's ms per generated token,
phase by phase (eagle2/phases.py; the prefill included on both sides, as the wall-clock speedup
counts it), and the speedups.

    python scripts/page_race.py --client api --runs 3 --out benchmarks/page-vs-bench/api

Page and bench alternate --runs times (the machine's speed drifts by minutes), and the means are
compared. Writes per run OUT/run-K/ (page-trace.json, the bench's bench/summary.json and
per_prompt.csv, comparison.json; with the browser also metrics.txt and phases-{1440,390}.png),
and OUT/comparison.json for the means; prints each comparison.
"""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from eagle2.cycle.series import series  # noqa: E402
from eagle2.cycle.trace import VIZ_KEY  # noqa: E402
from eagle2.phases import PHASES  # noqa: E402
from eagle2.policies.registry import TRACES  # noqa: E402
from ui.screenshot import chromium, open_page, serve_app, step, wait_model_ready  # noqa: E402
from viz.phase_chart import per_token_ms  # noqa: E402

# a phase below this share of its decoder's time is printed but not judged (0.02 ms of 7 is noise)
JUDGED_SHARE = 0.05
PHASE_TOLERANCE, SPEEDUP_TOLERANCE = 0.15, 0.10   # the page within these of the bench (issue: the page tells the engine's story)


def page_costs(trace) -> dict:
    """Each decoder of a race's trace: its policy, tokens and ms per token in each phase."""
    main = series(trace.meta.get("policy", "main"), trace.steps, "main")
    out = {}
    for s in [main, *trace.meta[VIZ_KEY]["series"]]:
        ms = per_token_ms(s)
        if ms is None:
            raise SystemExit(f"the page's {s['role']} decoder has cycles without phases")
        out[s["role"]] = {"policy": s["policy"], "tokens": s["tokens"][-1], "ms_per_token": ms}
    return out


def bench_costs(summary: dict, labels: dict[str, str]) -> dict:
    """The bench's decoders, keyed by the page's roles (`labels`: role -> the bench row's label)."""
    out = {}
    for role, label in labels.items():
        p = summary["policies"][label]
        per_cycle = p["phase_ms_per_cycle"]
        out[role] = {"policy": label, "tokens": p["new_tokens"] / summary["repeats"],
                     "ms_per_token": {k: v * p["target_forwards"] / p["new_tokens"] for k, v in per_cycle.items()}}
    return out


def compare(page: dict, bench: dict) -> dict:
    """Page over bench, per decoder and phase, and the speedups over plain on each side."""
    rows = {}
    for role, pg in page.items():
        b = bench[role]
        total_p, total_b = sum(pg["ms_per_token"].values()), sum(b["ms_per_token"].values())
        phases = {}
        for ph in PHASES:
            vp, vb = pg["ms_per_token"][ph], b["ms_per_token"][ph]
            judged = max(vp / total_p, vb / total_b) >= JUDGED_SHARE
            phases[ph] = {"page": vp, "bench": vb, "ratio": vp / vb if vb > 0 else None, "judged": judged,
                          "within": (not judged) or (vb > 0 and abs(vp / vb - 1) <= PHASE_TOLERANCE)}
        rows[role] = {"policy": pg["policy"], "page_ms": total_p, "bench_ms": total_b, "ratio": total_p / total_b,
                      "page_tokens": pg["tokens"], "bench_tokens": b["tokens"], "phases": phases}
    plain_p, plain_b = rows["plain"]["page_ms"], rows["plain"]["bench_ms"]
    speed = {role: {"page": plain_p / r["page_ms"], "bench": plain_b / r["bench_ms"]} for role, r in rows.items()
             if role != "plain"}
    for v in speed.values():
        v["ratio"] = v["page"] / v["bench"]
        v["within"] = abs(v["ratio"] - 1) <= SPEEDUP_TOLERANCE
    return {"decoders": rows, "speedup": speed,
            "within": all(p["within"] for r in rows.values() for p in r["phases"].values())
            and all(v["within"] for v in speed.values())}


def print_comparison(c: dict) -> None:
    print(f"\nms per generated token (the prefill included), page / bench; * = judged (>= {JUDGED_SHARE:.0%} of the decoder's time)")
    print(f"{'decoder':24s} {'tokens':>9s} " + " ".join(f"{p[:14]:>20s}" for p in PHASES) + f" {'total':>20s}")
    for role, r in c["decoders"].items():
        cells = []
        for ph in PHASES:
            x = r["phases"][ph]
            mark = ("*" if x["judged"] else " ") + ("" if x["within"] else "!")
            cells.append(f"{x['page']:6.2f}/{x['bench']:5.2f} {mark:2s}".rjust(20))
        print(f"{role + ' ' + r['policy']:24s} {r['page_tokens']:4.0f}/{r['bench_tokens']:<4.0f} " + " ".join(cells)
              + f" {r['page_ms']:6.2f}/{r['bench_ms']:5.2f} x{r['ratio']:.2f}".rjust(21))
    for role, v in c["speedup"].items():
        print(f"speedup of {role} over plain: page {v['page']:.2f}x, bench {v['bench']:.2f}x "
              f"(page/bench {v['ratio']:.2f}{'' if v['within'] else ', NOT within 10%'})")
    print("all within the tolerances" if c["within"] else "not all within the tolerances (! marks a phase)")


def exported(out: Path, body: bytes):
    """The race's exported trace file, kept as OUT/page-trace.json and read."""
    (out / "page-trace.json").write_bytes(body)
    return TRACES.from_json(body)


def run_page(out: Path, steps: int, threads: int) -> tuple[str, object]:
    """The page's race: N Steps of the default prompt in Chromium; returns (prompt, exported trace)."""
    with serve_app(out / "server.log", timeout=300, threads=threads) as url, chromium() as browser:
        ctx, page = open_page(browser, url, 1440, 1000)
        try:
            wait_model_ready(page, 400_000)
            prompt = page.locator("#prompt textarea").input_value()
            t0 = time.time()
            step(page, prompt, steps)
            page.wait_for_timeout(800)
            text = (f"prompt: {prompt}\nsteps: {steps} in {time.time() - t0:.1f} s\n\n"
                    + page.locator("#live-metrics").inner_text())
            (out / "metrics.txt").write_text(text)
            print(text)
            for width in (1440, 390):
                page.set_viewport_size({"width": width, "height": 1000 if width > 400 else 844})
                page.wait_for_timeout(1500)
                page.locator("#live-phases").scroll_into_view_if_needed()
                page.wait_for_timeout(500)
                page.locator("#live-phases").screenshot(path=str(out / f"phases-{width}.png"))
            page.set_viewport_size({"width": 1440, "height": 1000})
            page.locator("#live-downloads").get_by_text("Downloads").click()
            page.locator("#live-export").click()
            link = page.locator("#live-files a[href*='.json']").first
            link.wait_for(state="attached", timeout=60_000)
            body = page.request.get(link.get_attribute("href")).body()
        finally:
            ctx.close()
    return prompt, exported(out, body)


def run_api(out: Path, steps: int, threads: int) -> tuple[str, object]:
    """The same race over the page's HTTP API (/step, then /export), no browser on this machine:
    what the server itself charges each decoder when the visitor's browser draws elsewhere."""
    from gradio_client import Client
    from classroom import Server, step_args
    from ui.tabs.live import example_map, first_example
    from ui.traces import load_examples
    prompt = first_example(example_map(load_examples()))
    server = Server(["--threads", str(threads)], out / "server.log", {})
    try:
        server.wait_ready()
        c = Client(server.url + "/", verbose=False, download_files=tempfile.mkdtemp(prefix="page-race-"))
        for _ in range(steps):
            c.submit(*step_args(prompt, 64), api_name="/step").result(timeout=600)
        files = c.submit(api_name="/export").result(timeout=120)
    finally:
        server.stop()
    return prompt, exported(out, Path(next(f for f in files if str(f).endswith(".json"))).read_bytes())


def run_bench(out: Path, prompt: str, roles: dict[str, str], threads: int, tokens: int, repeats: int) -> dict:
    """The bench on the page's prompt, policies, threads and length; returns its summary."""
    (out / "prompt.jsonl").write_text(json.dumps({"question_id": 0, "category": "page", "turns": [prompt]}) + "\n")
    policies = ",".join(dict.fromkeys(roles.values()))
    cmd = [sys.executable, "-m", "eagle2", "bench", "--prompts", str(out / "prompt.jsonl"), "--policies", policies,
           "--threads", str(threads), "--max-new-tokens", str(tokens), "--repeats", str(repeats),
           "--out", str(out / "bench")]
    print("$", " ".join(cmd[1:]), flush=True)
    subprocess.run(cmd, cwd=ROOT, check=True, timeout=1800)   # bounded: a bench of one prompt takes a minute or two
    return json.loads((out / "bench" / "summary.json").read_text())


def mean_costs(costs: list[dict]) -> dict:
    """Several runs' costs (page_costs or bench_costs) as one: each decoder's tokens and ms per
    token in each phase, averaged over the runs."""
    return {role: {"policy": first["policy"], "tokens": sum(c[role]["tokens"] for c in costs) / len(costs),
                   "ms_per_token": {p: sum(c[role]["ms_per_token"][p] for c in costs) / len(costs) for p in PHASES}}
            for role, first in costs[0].items()}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="threads per decode (the app's default on 2 cores: 1)")
    ap.add_argument("--runs", type=int, default=3,
                    help="page and bench alternate this many times (a machine's speed drifts by minutes: the "
                         "means of alternating runs are compared)")
    ap.add_argument("--repeats", type=int, default=3, help="the bench's repeats of the prompt in each run")
    ap.add_argument("--client", choices=("browser", "api"), default="browser",
                    help="Chromium on this machine (the page as drawn), or the HTTP API (no drawing here)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    pages, benches, runs = [], [], []
    for i in range(1, a.runs + 1):
        out = a.out / f"run-{i}"
        out.mkdir(parents=True, exist_ok=True)
        prompt, trace = (run_page if a.client == "browser" else run_api)(out, a.steps, a.threads)
        page = page_costs(trace)
        roles = {role: d["policy"] for role, d in page.items()}
        summary = run_bench(out, prompt, roles, a.threads, int(page["main"]["tokens"]), a.repeats)
        bench = bench_costs(summary, roles)
        c = compare(page, bench)
        (out / "comparison.json").write_text(json.dumps(c, indent=2))
        print(f"\nrun {i}:")
        print_comparison(c)
        pages.append(page), benches.append(bench), runs.append(c)
    c = compare(mean_costs(pages), mean_costs(benches))
    c.update(prompt=prompt, client=a.client, steps=a.steps, threads=a.threads, runs=a.runs, repeats=a.repeats,
             machine=summary["machine"], per_run_speedup={role: [r["speedup"][role] for r in runs] for role in c["speedup"]},
             command="python scripts/page_race.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    (a.out / "comparison.json").write_text(json.dumps(c, indent=2))
    print(f"\nthe means of {a.runs} alternating runs:")
    print_comparison(c)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
