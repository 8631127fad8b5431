"""Real-browser test: Debian's Chromium driven by Playwright (pip; never `playwright install`)
against `python app.py` on a free localhost port. Screenshots go to test-artifacts/ (gitignored);
the live one is also copied to docs/screenshot.png for the README."""
from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
CHROMIUM = os.environ.get("CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
VIEWPORT = {"width": 1600, "height": 1000}


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def server():
    port = free_port()
    ARTIFACTS.mkdir(exist_ok=True)
    log = open(ARTIFACTS / "app-server.log", "w")
    env = dict(os.environ, GRADIO_ANALYTICS_ENABLED="False", EAGLE2_THREADS="1", PYTHONUNBUFFERED="1")
    proc = subprocess.Popen([sys.executable, str(ROOT / "app.py"), "--host", "127.0.0.1", "--port", str(port)],
                            cwd=ROOT, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
    url = f"http://127.0.0.1:{port}/"
    try:
        deadline = time.time() + 120
        while True:
            if proc.poll() is not None:
                pytest.fail(f"app.py exited with {proc.returncode}; see {ARTIFACTS / 'app-server.log'}")
            try:
                with urllib.request.urlopen(url, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            if time.time() > deadline:
                pytest.fail("app.py did not start serving within 120 s")
            time.sleep(0.5)
        yield url
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(timeout=15)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
        log.close()


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.fail(f"Chromium not found at {CHROMIUM}: install Debian's chromium (apt-get install chromium); "
                    f"tests/run.sh does it.")
    from playwright.sync_api import sync_playwright
    with sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield b
        b.close()


@pytest.fixture
def page(browser, server):
    ctx = browser.new_context(viewport=VIEWPORT)
    pg = ctx.new_page()
    pg.set_default_timeout(60_000)
    pg.goto(server)
    pg.wait_for_selector("#live-tree .js-plotly-plot", state="attached")
    yield pg
    ctx.close()


def plot_traces(page, elem_id: str) -> dict:
    """{trace name: number of points} of the Plotly figure inside a gr.Plot."""
    return page.evaluate(
        """(id) => {
            const el = document.querySelector('#' + id + ' .js-plotly-plot');
            if (!el || !el.data) return null;
            const out = {};
            for (const t of el.data) out[t.name || ''] = (t.x || []).filter(v => v !== null).length;
            return out;
        }""", elem_id)


def plot_title(page, elem_id: str) -> str:
    return page.evaluate("""(id) => { const el = document.querySelector('#' + id + ' .js-plotly-plot');
        const t = el && el.layout && el.layout.title; return t ? (t.text || '') : ''; }""", elem_id)


def wait_status(page, text: str, timeout=180_000):
    page.wait_for_function("(t) => (document.querySelector('#live-status')||{}).innerText?.includes(t)", arg=text,
                           timeout=timeout)


def test_replay_of_a_shipped_trace(page):
    page.get_by_role("tab", name="Replay").click()
    page.wait_for_function("() => { const el = document.querySelector('#replay-tree .js-plotly-plot');"
                           " return el && el.data && el.data.some(t => t.name === 'draft nodes'); }")
    tr = plot_traces(page, "replay-tree")
    assert tr["draft nodes"] > 10 and tr["bonus token"] == 1 and tr["accepted path"] >= 2
    assert "Prompt:" in page.locator("#trace-info").inner_text()
    first = plot_title(page, "replay-tree")
    # browse one cycle back with the keyboard on the slider
    page.locator("#replay-cycle input[type=range]").focus()
    page.keyboard.press("ArrowLeft")
    page.wait_for_function("(t) => { const el = document.querySelector('#replay-tree .js-plotly-plot');"
                           " return el && el.layout.title.text !== t; }", arg=first)
    n_first, n_now = int(first.split()[1]), int(plot_title(page, "replay-tree").split()[1])
    assert n_now == n_first - 1
    assert page.locator("#replay-tokens .tok.hl").count() >= 1           # the browsed cycle is outlined
    assert plot_traces(page, "replay-race")                                # three decoders recorded
    page.screenshot(path=str(ARTIFACTS / "replay.png"))


def test_errors_show_warnings_and_keep_the_page(page, tmp_path):
    page.locator("#prompt textarea").fill("   ")
    page.locator("#step-btn").click()
    page.get_by_text("The prompt is empty").first.wait_for(timeout=30_000)
    page.get_by_role("tab", name="Replay").click()
    bad = tmp_path / "not-a-trace.json"
    bad.write_text("{oops")
    page.locator("#trace-upload input[type=file]").set_input_files(str(bad))
    page.get_by_text("not valid JSON").first.wait_for(timeout=30_000)
    assert plot_traces(page, "replay-tree")["draft nodes"] > 0              # the replay view is intact
    page.screenshot(path=str(ARTIFACTS / "error-warning.png"))


def test_step_three_times(page):
    page.wait_for_function("() => document.querySelector('#modelinfo').innerText.includes('ready')",
                           timeout=180_000)
    page.locator("#prompt textarea").fill("Write a haiku about the sea.")
    counts = []
    for i in range(1, 4):
        page.locator("#step-btn").click()
        wait_status(page, f"cycle {i} ·")
        page.wait_for_function("(n) => document.querySelectorAll('#live-tokens .tok').length > n",
                               arg=counts[-1] if counts else 0)
        counts.append(page.locator("#live-tokens .tok").count())
    assert counts[0] < counts[1] < counts[2], counts                         # the token stream grew
    page.wait_for_function("() => { const el = document.querySelector('#live-tree .js-plotly-plot');"
                           " return el && el.layout.title.text.startsWith('Cycle 3 '); }")
    tree = plot_traces(page, "live-tree")
    assert tree["draft nodes"] >= 20, tree                                   # N=60 by default
    assert tree["accepted path"] >= 2 and tree["bonus token"] == 1, tree     # highlighted path + bonus
    assert plot_traces(page, "live-cmp")["draft nodes"] >= 10                # the static tree beside it
    speed = plot_traces(page, "live-speedup")
    assert speed and sum(speed.values()) >= 2, speed                         # the speedup chart has data
    assert set(speed) >= {"vs static", "vs plain"}
    assert "vs static" in page.locator("#live-metrics").inner_text()
    assert plot_traces(page, "live-race")                                    # the race chart too
    titles = page.locator("#live-tokens .tok").first.get_attribute("title")
    assert titles.startswith("cycle 0")
    page.wait_for_timeout(500)
    shot = ARTIFACTS / "live-step3.png"
    page.screenshot(path=str(shot))
    page.screenshot(path=str(ARTIFACTS / "live-step3-full.png"), full_page=True)
    (ROOT / "docs").mkdir(exist_ok=True)
    shutil.copyfile(shot, ROOT / "docs" / "screenshot.png")
