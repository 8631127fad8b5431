"""How long a Step takes on this machine, from the click to the tree drawn, and where the time goes.

    python scripts/step_latency.py --steps 8 --out benchmarks/step-latency

Two measurements at the page's default settings for this device (ui.session.defaults), with the
dashboard's default panels open (ui.dashboard.OPEN):
1. In a real browser (Debian's Chromium under Playwright, `python app.py` on localhost): the
   time from clicking Step to the new cycle's tree drawn, per step (the first step, which also
   prefills the prompt, is reported apart). A script in the page splits it: the click to the
   server's answer arriving (the handler's work, Gradio's queue and transport), then the answer
   to the tree drawn and to every figure settled in Plotly; it also counts the outputs the
   answer updates (the others are gr.skip()), the figures redrawn and the main-thread time
   inside Plotly.react.
2. In this process, the same handler work step by step: the three decoders' own time (target
   forwards + drafting, from their traces), building the figures (`ui.dashboard.render`),
   serialising them to JSON, and the payload's size.
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
PROMPT = "Explain why the sky is blue to a ten-year-old."

# Installed in the page before its own scripts. Times are performance.now() in the page:
# `click` when Step is clicked; `answers`, each answer of the queue's event stream (its size, its
# outputs, and how many are more than a bare "no update"); `draws`, each Plotly.react and
# Plots.resize call (gr.Plot's drawing; its resize settles after a 100 ms timer): the element,
# start, main-thread time, when it settled.
PAGE_PROBE = r"""
(() => {
  const log = window.__stepLog = {click: null, answers: [], draws: []};
  const bare = o => o && typeof o === "object" && o.__type__ === "update" && Object.keys(o).length === 1;
  function readAnswers(stream) {
    const reader = stream.getReader(), dec = new TextDecoder();
    let buf = "";
    (async () => {
      for (;;) {
        const {done, value} = await reader.read();
        if (done) return;
        buf += dec.decode(value, {stream: true});
        for (let i; (i = buf.indexOf("\n\n")) >= 0; buf = buf.slice(i + 2)) {
          const data = buf.slice(0, i).split("\n").filter(l => l.startsWith("data:")).map(l => l.slice(5)).join("\n");
          let msg;
          try { msg = JSON.parse(data); } catch (e) { continue; }
          if (msg.msg !== "process_completed" && msg.msg !== "process_generating") continue;
          const out = (msg.output && msg.output.data) || [];
          log.answers.push({t: performance.now(), bytes: data.length, outputs: out.length,
                            updated: out.filter(o => o !== null && !bare(o)).length});
        }
      }
    })();
  }
  const fetch0 = window.fetch;
  window.fetch = async function (input, init) {   // Gradio's client reads the queue's stream by fetch
    const r = await fetch0.call(this, input, init);
    const url = typeof input === "string" ? input : (input && input.url) || "";
    if (url.includes("queue/data") && r.body && ((init || {}).method || "GET") === "GET") {
      const [mine, theirs] = r.body.tee();
      readAnswers(mine);
      return new Response(theirs, {status: r.status, statusText: r.statusText, headers: r.headers});
    }
    return r;
  };
  function timeDraws(P) {
    for (const [obj, name] of [[P, "react"], [P.Plots, "resize"]]) {
      const f = obj && obj[name];
      if (!f || f.__timed) continue;
      obj[name] = function (gd, ...rest) {
        const el = gd && gd.closest && gd.closest("[id]");
        const rec = {what: name, id: el ? el.id : "", t0: performance.now()};
        const p = f.call(this, gd, ...rest);
        rec.sync = performance.now() - rec.t0;
        log.draws.push(rec);
        Promise.resolve(p).finally(() => { rec.t1 = performance.now(); });
        return p;
      };
      obj[name].__timed = true;
    }
  }
  let plotly;   // gr.Plot loads Plotly on demand and sets window.Plotly
  Object.defineProperty(window, "Plotly", {configurable: true, get() { return plotly; },
                                           set(v) { plotly = v; if (v) timeDraws(v); }});
  document.addEventListener("click", e => {
    if (e.target.closest && e.target.closest("#step-btn")) log.click = performance.now();
  }, true);
})();
"""
TREE_DRAWN = ("(c) => { const el = document.querySelector('#live-tree .js-plotly-plot');"
              " const t = el && el.layout && el.layout.title;"
              " return t && (t.text || '').startsWith('Cycle ' + c + ' '); }")
SETTLED = "() => window.__stepLog.draws.every(d => d.t1 !== undefined)"


def page_split(log: dict) -> dict:
    """One step's browser-side split, from the page's log (PAGE_PROBE)."""
    click, answers, draws = log["click"], log["answers"], log["draws"]
    last = answers[-1] if answers else None
    reacts = [d for d in draws if d["what"] == "react"]
    tree = [d["t0"] + d["sync"] for d in reacts if d["id"] == "live-tree"]
    return {"answer_s": (last["t"] - click) / 1e3 if last else None,
            "tree_drawn_s": (max(tree) - last["t"]) / 1e3 if last and tree else None,
            "settled_s": (max(d["t1"] for d in draws) - last["t"]) / 1e3 if last and draws else 0.0,
            "outputs": last["outputs"] if last else 0, "outputs_updated": last["updated"] if last else 0,
            "answer_bytes": last["bytes"] if last else 0,
            "figures_redrawn": len({d["id"] for d in reacts}), "react_calls": len(reacts),
            "react_main_thread_s": sum(d["sync"] for d in reacts) / 1e3}


def browser_steps(n: int, log: Path) -> list[dict]:
    from ui.screenshot import chromium, serve_app, wait_model_ready, wait_status
    out = []
    with serve_app(log) as url, chromium() as browser:
        ctx = browser.new_context(viewport={"width": 1440, "height": 900})
        ctx.add_init_script(PAGE_PROBE)
        page = ctx.new_page()
        page.set_default_timeout(60_000)
        page.goto(url)
        page.wait_for_selector("#live-tree .js-plotly-plot", state="attached")
        wait_model_ready(page)
        page.locator("#prompt textarea").fill(PROMPT)
        for i in range(1, n + 1):
            page.evaluate("() => { const l = window.__stepLog; l.click = null; l.answers = []; l.draws = []; }")
            t0 = time.perf_counter()
            page.locator("#step-btn").click()
            wait_status(page, f"cycle {i} ·")
            page.wait_for_function(TREE_DRAWN, arg=i)
            row = {"step": i, "click_to_tree_s": time.perf_counter() - t0}
            page.wait_for_function(SETTLED)
            out.append(row | page_split(page.evaluate("() => window.__stepLog")))
        ctx.close()
    return out


FORWARD: list[str] = []  # which forward the in-process measurement ran


def handler_steps(n: int, threads: int) -> list[dict]:
    import plotly.utils
    import torch
    torch.set_num_threads(threads)
    from eagle2.model.loading import load_bundle
    from ui.dashboard import OPEN, render
    from ui.session import Session, defaults
    bundle = load_bundle()
    FORWARD.append(bundle.description)  # as the page serves: the default backend
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
        values = render(sess.view(), panels=OPEN)
        t2 = time.perf_counter()
        payload, figures = 0, 0
        for v in values.values():
            if hasattr(v, "to_plotly_json"):
                payload += len(json.dumps(v.to_plotly_json(), cls=plotly.utils.PlotlyJSONEncoder))
                figures += 1
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
                    "payload_bytes": payload, "figures_built": figures,
                    "verified": sum(m.tree.kept) if m.tree is not None else 1})
    return out


def median(rows, key):
    vals = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(vals) if vals else None


IN_PROCESS = ("decode_s", "main_s", "compare_s", "plain_s", "preview_and_overhead_s", "target_forwards_main_s",
              "drafting_main_s", "render_s", "serialise_s")
IN_BROWSER = ("answer_s", "tree_drawn_s", "settled_s", "react_main_thread_s")


def summarise(rows: list[dict], clicks: list[dict], steps: int, argv) -> dict:
    steady, csteady = rows[1:], clicks[1:]
    times = [c["click_to_tree_s"] for c in clicks]
    return {
        "command": "python scripts/step_latency.py " + " ".join(argv if argv is not None else sys.argv[1:]),
        "date": time.strftime("%Y-%m-%d %H:%M:%S"), "machine": f"{platform.machine()} {platform.processor()}".strip(),
        "prompt": PROMPT, "steps": steps,
        "browser_click_to_tree_s": {"first": times[0], "median": statistics.median(times[1:]),
                                    "min": min(times[1:]), "max": max(times[1:]), "all": times},
        "browser_median_s": {k: median(csteady, k) for k in IN_BROWSER},
        "browser_per_step": clicks,
        "outputs_updated_median": median(csteady, "outputs_updated"),
        "outputs": clicks[-1]["outputs"],
        "figures_redrawn_median": median(csteady, "figures_redrawn"),
        "answer_bytes_median": median(csteady, "answer_bytes"),
        "in_process_median_s": {k: median(steady, k) for k in IN_PROCESS},
        "payload_bytes_median": median(steady, "payload_bytes"),
        "figures_built_median": median(steady, "figures_built"),
        "verified_median": median(steady, "verified"),
        "per_step": rows,
    }


def report(s: dict) -> str:
    b, p, w = s["browser_click_to_tree_s"], s["in_process_median_s"], s["browser_median_s"]
    return "\n".join([
        f"click -> tree drawn: median {b['median']:.2f} s (first {b['first']:.2f} s) over {s['steps']} steps",
        f"  in the page: the answer arrives {w['answer_s']:.2f} s after the click ({s['outputs_updated_median']:g} "
        f"of {s['outputs']} outputs updated, {s['answer_bytes_median'] / 1e3:.0f} KB); the tree is drawn "
        f"{w['tree_drawn_s']:.2f} s later, every figure settled {w['settled_s']:.2f} s later "
        f"({s['figures_redrawn_median']:g} figures redrawn, {w['react_main_thread_s']:.2f} s inside Plotly.react)",
        f"  in-process: decoders {p['decode_s']:.2f} s (main {p['main_s']:.2f}: forwards "
        f"{p['target_forwards_main_s']:.2f}, drafting {p['drafting_main_s']:.2f}; compare {p['compare_s']:.2f}; "
        f"plain {p['plain_s']:.2f}; side-by-side preview + overhead {p['preview_and_overhead_s']:.2f})",
        f"  figures {p['render_s']:.2f} s ({s['figures_built_median']:g} built), serialising {p['serialise_s']:.3f} s, "
        f"payload {s['payload_bytes_median'] / 1e3:.0f} KB; the rest of the answer's time, {s['transport_s']:.2f} s: "
        f"Gradio's queue and transport, and the decoders running slower in the app, beside the browser, "
        f"than alone"])


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
    summary = summarise(rows, clicks, a.steps, argv)
    p = summary["in_process_median_s"]
    summary["transport_s"] = summary["browser_median_s"]["answer_s"] - p["decode_s"] - p["render_s"] - p["serialise_s"]
    summary["forward_in_process"] = FORWARD[0] if FORWARD else None
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    print(report(summary))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
