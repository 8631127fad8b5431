"""How long a Step takes on this machine, from the click to the tree drawn, and where the time goes.

    python scripts/step_latency.py --steps 8 --out benchmarks/step-latency

Two measurements at the page's default settings for this device (ui.session.defaults):
1. In a real browser (Debian's Chromium under Playwright, `python app.py` on localhost): the
   time from clicking Step to the new cycle's tree drawn, per step (the first step, which also
   prefills the prompt, is reported apart).
2. In this process, the same handler work step by step: the three decoders' own time (target
   forwards + drafting, from their traces), building the figures (`ui.dashboard.render`),
   serialising them to JSON, and the payload's size. What the browser time adds on top of those
   is Gradio's transport and Plotly drawing.
A measurement script, not a test: its figures are recorded under benchmarks/ with the command.
"""
from __future__ import annotations

import argparse
import json
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
PROMPT = "Explain why the sky is blue to a ten-year-old."


def browser_steps(n: int, log: Path) -> list[float]:
    from ui.screenshot import chromium, open_page, serve_app, wait_model_ready, wait_status
    out = []
    with serve_app(log) as url, chromium() as browser:
        ctx, page = open_page(browser, url, 1440, 900)
        wait_model_ready(page)
        page.locator("#prompt textarea").fill(PROMPT)
        for i in range(1, n + 1):
            t0 = time.perf_counter()
            page.locator("#step-btn").click()
            wait_status(page, f"cycle {i} ·")
            page.wait_for_function("(c) => { const el = document.querySelector('#live-tree .js-plotly-plot');"
                                   " const t = el && el.layout && el.layout.title;"
                                   " return t && (t.text || '').startsWith('Cycle ' + c + ' '); }", arg=i)
            out.append(time.perf_counter() - t0)
        ctx.close()
    return out


def handler_steps(n: int, threads: int) -> list[dict]:
    import plotly.utils
    import torch
    torch.set_num_threads(threads)
    from eagle2.model.loading import load_bundle
    from ui.dashboard import render
    from ui.session import Session, defaults
    bundle = load_bundle()
    sess = Session()
    out = []
    for i in range(n):
        before = [d.wall if d is not None else 0.0 for d in (sess.main, sess.cmp, sess.plain)]
        t0 = time.perf_counter()
        if i == 0:
            sess.start(bundle, PROMPT, defaults("cpu"))
            before = [0.0, 0.0, 0.0]
        sess.tick()
        t1 = time.perf_counter()
        values = render(sess.view())
        t2 = time.perf_counter()
        payload = 0
        for v in values.values():
            if hasattr(v, "to_plotly_json"):
                payload += len(json.dumps(v.to_plotly_json(), cls=plotly.utils.PlotlyJSONEncoder))
            elif hasattr(v, "to_json"):
                payload += len(v.to_json())
            elif isinstance(v, str):
                payload += len(v)
        t3 = time.perf_counter()
        own = [d.wall - b for d, b in zip((sess.main, sess.cmp, sess.plain), before)]
        m = sess.main.trace.steps[-1]
        out.append({"step": i + 1, "decode_s": t1 - t0, "main_s": own[0], "compare_s": own[1], "plain_s": own[2],
                    "preview_and_overhead_s": (t1 - t0) - sum(own), "target_forwards_main_s": m.timings["verify_s"],
                    "drafting_main_s": m.timings["draft_s"], "render_s": t2 - t1, "serialise_s": t3 - t2,
                    "payload_bytes": payload, "verified": sum(m.tree.kept) if m.tree is not None else 1})
    return out


def median(rows, key):
    return statistics.median(r[key] for r in rows)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--steps", type=int, default=8, help="Steps after the first (which also prefills)")
    ap.add_argument("--out", default=str(ROOT / "benchmarks" / "step-latency"))
    ap.add_argument("--threads", type=int, default=1, help="torch threads in-process (the page's default here: 1)")
    a = ap.parse_args(argv)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    rows = handler_steps(a.steps + 1, a.threads)
    clicks = browser_steps(a.steps + 1, ROOT / "test-artifacts" / "step-latency-server.log")
    steady = rows[1:]
    summary = {
        "command": "python scripts/step_latency.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": f"{platform.machine()} {platform.processor()}".strip(),
        "prompt": PROMPT, "steps": a.steps,
        "browser_click_to_tree_s": {"first": clicks[0], "median": statistics.median(clicks[1:]),
                                    "min": min(clicks[1:]), "max": max(clicks[1:]), "all": clicks},
        "in_process_median_s": {k: median(steady, k) for k in
                                ("decode_s", "main_s", "compare_s", "plain_s", "preview_and_overhead_s",
                                 "target_forwards_main_s", "drafting_main_s", "render_s", "serialise_s")},
        "payload_bytes_median": median(steady, "payload_bytes"),
        "verified_median": median(steady, "verified"),
        "per_step": rows,
    }
    b, p = summary["browser_click_to_tree_s"], summary["in_process_median_s"]
    summary["transport_and_drawing_s"] = b["median"] - p["decode_s"] - p["render_s"] - p["serialise_s"]
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(f"click -> tree drawn: median {b['median']:.2f} s (first {b['first']:.2f} s) over {a.steps} steps")
    print(f"  decoders {p['decode_s']:.2f} s (main {p['main_s']:.2f}: forwards {p['target_forwards_main_s']:.2f}, "
          f"drafting {p['drafting_main_s']:.2f}; compare {p['compare_s']:.2f}; plain {p['plain_s']:.2f}; "
          f"side-by-side preview + overhead {p['preview_and_overhead_s']:.2f})")
    print(f"  figures {p['render_s']:.2f} s, serialising {p['serialise_s']:.2f} s, "
          f"payload {summary['payload_bytes_median'] / 1e6:.2f} MB, transport + drawing {summary['transport_and_drawing_s']:.2f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
