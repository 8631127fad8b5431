"""Real-browser test: Debian's Chromium driven by Playwright (pip; never `playwright install`)
against `python app.py` on a free localhost port, both started by ui/screenshot.py's functions.
Screenshots and the server log go to test-artifacts/ (gitignored) only; `python -m ui.screenshot`
refreshes the README's docs/screenshot.png."""
from __future__ import annotations

from pathlib import Path

import pytest

from eagle2.cycle.race import RaceSettings
from ui.screenshot import chromium, open_page, serve_app, step, wait_model_ready, wait_status

ROOT = Path(__file__).resolve().parent.parent
ARTIFACTS = ROOT / "test-artifacts"
VIEWPORT = {"width": 1600, "height": 1000}


@pytest.fixture(scope="module")
def server():
    try:
        with serve_app(ARTIFACTS / "app-server.log") as url:
            yield url
    except RuntimeError as e:   # app.py exited or never answered
        pytest.fail(str(e))


@pytest.fixture(scope="module")
def browser():
    try:
        with chromium() as b:
            yield b
    except RuntimeError as e:   # no Chromium
        pytest.fail(str(e))


@pytest.fixture
def page(browser, server):
    ctx, pg = open_page(browser, server, **VIEWPORT)
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


def control_value(page, elem_id: str) -> str:
    return page.locator(f"#{elem_id} input").first.input_value()


def test_step_three_times(page):
    wait_model_ready(page)
    cpu = RaceSettings.for_device("cpu")                                     # app.py's default --device
    assert control_value(page, "policy") == cpu.policy                       # the hardware-aware budget
    counts = step(page, "Write a haiku about the sea.", 3)                   # each step drawn before the next
    assert counts[0] < counts[1] < counts[2], counts                         # the token stream grew
    wait_status(page, f"{cpu.policy} vs {cpu.compare} vs plain")
    wait_status(page, "cycle 3 ·")
    tree = plot_traces(page, "live-tree")
    assert tree["draft nodes"] >= 1, tree                                    # a small tree pays here
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
    page.screenshot(path=str(ARTIFACTS / "live-step3.png"))
    page.screenshot(path=str(ARTIFACTS / "live-step3-full.png"), full_page=True)


def test_the_fixed_large_tree_is_one_click_away(page):
    """The GPU default (EAGLE-2 at 60, 5, 10) is one click on a CPU page, with the reason beside it."""
    wait_model_ready(page)
    gpu = RaceSettings.for_device("cuda")
    assert "EAGLE-2 (60, 5, 10) wins" in page.locator("#presets-help").inner_text()
    page.locator("#preset-cuda").click()
    page.wait_for_function("(v) => document.querySelector('#policy input').value === v", arg=gpu.policy)
    step(page, "Write a haiku about the sea.", 1)
    wait_status(page, f"{gpu.policy} vs {gpu.compare} vs plain")
    assert plot_traces(page, "live-tree")["draft nodes"] >= 20                # N = 60
    page.screenshot(path=str(ARTIFACTS / "live-gpu-preset.png"))
