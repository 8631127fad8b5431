"""The page's race as a visitor sees it: serve `python app.py` at its defaults (the q4_1 forward), press
Step N times on the default prompt in Debian's Chromium, and save what the metric cards say and
the "Where the time goes" chart at 1440 and 390 px (ui.screenshot's helpers).

    python scripts/page_race.py --steps 20 --threads 1 --out benchmarks/cycle-phases/page
"""
from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ui.screenshot import chromium, open_page, serve_app, step, wait_model_ready  # noqa: E402


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--threads", type=int, default=1, help="torch threads per decode (the app's default on 2 cores: 1)")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    with serve_app(a.out / "server.log", timeout=300, threads=a.threads) as url, chromium() as browser:
        ctx, page = open_page(browser, url, 1440, 1000)
        try:
            wait_model_ready(page, 400_000)
            prompt = page.locator("#prompt textarea").input_value()
            t0 = time.time()
            step(page, prompt, a.steps)
            page.wait_for_timeout(800)
            text = (f"prompt: {prompt}\nsteps: {a.steps} in {time.time() - t0:.1f} s\n\n"
                    + page.locator("#live-metrics").inner_text())
            (a.out / "metrics.txt").write_text(text)
            print(text)
            for width in (1440, 390):
                page.set_viewport_size({"width": width, "height": 1000 if width > 400 else 844})
                page.wait_for_timeout(1500)
                page.locator("#live-phases").scroll_into_view_if_needed()
                page.wait_for_timeout(500)
                page.locator("#live-phases").screenshot(path=str(a.out / f"phases-{width}.png"))
        finally:
            ctx.close()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
