"""Refresh the README's screenshot: serve `python app.py`, Step a prompt in Debian's Chromium, save.

    python -m ui.screenshot                       # docs/screenshot.png, 1600 x 1000, after 3 steps
    python -m ui.screenshot --out test-artifacts/narrow.png --width 390 --height 844 --full-page

Playwright drives the system Chromium (pip's playwright; never `playwright install`). The
real-browser test (tests/test_browser.py) serves and opens the page with the same functions.
"""
from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from eagle2 import config

ROOT = Path(__file__).resolve().parent.parent
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
README_SHOT = ROOT / "docs" / "screenshot.png"
PROMPT = "Write a haiku about the sea."


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def stop_group(proc: subprocess.Popen, grace: float = 15.0) -> None:
    """Stop a process started with start_new_session=True and everything it started: SIGTERM to
    the group, SIGKILL after `grace` seconds."""
    if proc.poll() is not None:
        return
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()


@contextlib.contextmanager
def serve_app(log_path: Path, timeout: float = 120.0, threads: int = 1):
    """`python app.py` on a free localhost port, its output in `log_path`; yields the page's URL
    once it answers, and stops the server (its whole process group) on exit."""
    port = free_port()
    log_path.parent.mkdir(parents=True, exist_ok=True)
    env = config.child_env(GRADIO_ANALYTICS_ENABLED="False", EAGLE2_THREADS=str(threads), PYTHONUNBUFFERED="1")
    with open(log_path, "w") as log:
        proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(port)],
                                cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        url = f"http://127.0.0.1:{port}/"
        try:
            deadline = time.time() + timeout
            while True:
                if proc.poll() is not None:
                    raise RuntimeError(f"app.py exited with {proc.returncode}; see {log_path}")
                try:
                    with urllib.request.urlopen(url, timeout=2) as r:
                        if r.status == 200:
                            break
                except OSError:
                    pass
                if time.time() > deadline:
                    raise RuntimeError(f"app.py did not start serving within {timeout:.0f} s; see {log_path}")
                time.sleep(0.5)
            yield url
        finally:
            stop_group(proc)


@contextlib.contextmanager
def chromium():
    """Debian's Chromium under Playwright (the configuration's CHROMIUM names another)."""
    path = config.current().chromium
    if not Path(path).exists():
        raise RuntimeError(f"Chromium not found at {path}: install Debian's chromium (apt-get install "
                           f"chromium); tests/run.sh does it.")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=path, args=CHROMIUM_ARGS)
        try:
            yield b
        finally:
            b.close()


def open_page(browser, url: str, width: int = 1600, height: int = 1000):
    """A new page at `url`, once the first draft tree (the recorded trace) is drawn. Returns
    (context, page); close the context when done."""
    ctx = browser.new_context(viewport={"width": width, "height": height})
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    pg.goto(url)
    pg.wait_for_selector("#live-tree .js-plotly-plot", state="attached")
    return ctx, pg


def wait_model_ready(page, timeout=180_000) -> None:
    page.wait_for_function("() => document.querySelector('#modelinfo').innerText.includes('ready')", timeout=timeout)


def wait_status(page, text: str, timeout=180_000) -> None:
    page.wait_for_function("(t) => (document.querySelector('#live-status')||{}).innerText?.includes(t)", arg=text,
                           timeout=timeout)


def step(page, prompt: str, times: int, done: int = 0) -> list[int]:
    """Fill the prompt and press Step `times` times, each time until the cycle is drawn; returns the
    token count of the stream after each step. `done`: the cycles of this prompt the page has drawn
    already. The waits name the cycle each press makes, never one already on the page: a wait for
    a drawn cycle passes at once and then races the next one's drawing."""
    page.locator("#prompt textarea").fill(prompt)
    counts = []
    if times == 0:   # the page as it opens: its recorded trace
        return counts
    before = page.locator("#live-tokens .tok").count() if done else 0
    for i in range(done + 1, done + times + 1):
        page.locator("#step-btn").click()
        wait_status(page, f"cycle {i} ·")
        page.wait_for_function("(n) => document.querySelectorAll('#live-tokens .tok').length > n",
                               arg=counts[-1] if counts else before)
        counts.append(page.locator("#live-tokens .tok").count())
    page.wait_for_function("(c) => { const el = document.querySelector('#live-tree .js-plotly-plot');"
                           " return el && el.layout.title.text.startsWith('Cycle ' + c + ' '); }", arg=done + times)
    return counts


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, default=README_SHOT, help=f"default: {README_SHOT.relative_to(ROOT)}")
    ap.add_argument("--width", type=int, default=1600)
    ap.add_argument("--height", type=int, default=1000)
    ap.add_argument("--steps", type=int, default=3, help="Step presses before the screenshot")
    ap.add_argument("--prompt", default=PROMPT)
    ap.add_argument("--full-page", action="store_true", help="the whole page, not only the viewport")
    ap.add_argument("--log", type=Path, default=ROOT / "test-artifacts" / "screenshot-server.log")
    a = ap.parse_args(argv)
    with serve_app(a.log) as url, chromium() as browser:
        ctx, page = open_page(browser, url, a.width, a.height)
        try:
            wait_model_ready(page)
            step(page, a.prompt, a.steps)
            page.wait_for_timeout(500)
            a.out.parent.mkdir(parents=True, exist_ok=True)
            page.screenshot(path=str(a.out), full_page=a.full_page)
        finally:
            ctx.close()
    print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
