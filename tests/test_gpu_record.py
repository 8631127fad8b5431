"""Record on the GPU (ui/gpu_record.py; the engine's part in eagle2/decoding/recorded_race.py and
`python -m eagle2 record`): the page's race run to the end in one call and opened in Replay,
recorded here on the tiny model on the CPU; a ZeroGPU Space known by SPACES_ZERO_GPU alone, the
live page there on the CPU; each of ZeroGPU's refusals one line, the page otherwise untouched and
still stepping; the page the same with `spaces` installed (off ZeroGPU its decorator leaves the
function as it is) and without it."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import gradio as gr
import pytest
import torch

import app
from eagle2 import threads
from eagle2.config import Config
from eagle2.decoding.decoder import Decoder
from eagle2.decoding.recorded_race import DEVICE_NAME, SECONDS, device_name, record_settings, run_race
from eagle2.model.loading import load_bundle
from eagle2.model.verify_times import RECORD_KEY
from eagle2.policies.registry import PLAIN, TRACES
from eagle2.tools.cli import main as cli_main
from ui import gpu_record, handlers
from ui.model import MODEL
from ui.outputs import REPLAY
from ui.page import build_app
from ui.traces import read_upload
from ui.view import View
from page_controls import ui

REPO = Path(__file__).resolve().parent.parent
SKIP = type(gr.skip())
PROMPT = "w1 w2 w3 w4 w5"


@pytest.fixture(scope="module")
def tiny(tiny_target) -> str:
    folder, _ = tiny_target("gpu-record", vocab=97, max_pos=128)
    return str(folder)


def no_cuda_question():
    raise AssertionError("torch.cuda was asked whether a GPU exists")


# ------------------------------------------------------------------ where the page runs

def test_zero_gpu_is_known_by_its_variable_alone(monkeypatch):
    """SPACES_ZERO_GPU as the `spaces` package reads it; torch's CUDA (emulated there) is never asked."""
    for value, want in (("true", True), ("True", True), ("1", True), ("t", True), ("false", False),
                        ("0", False), ("", False)):
        assert Config.from_env({"SPACES_ZERO_GPU": value}).zero_gpu is want, value
    assert Config.from_env({}).zero_gpu is False
    monkeypatch.setattr(torch.cuda, "is_available", no_cuda_question)
    monkeypatch.setenv("SPACES_ZERO_GPU", "true")
    why = gpu_record.why_no_gpu()
    assert why is None if gpu_record.spaces is not None else "`spaces`" in why
    # the live page decodes on the CPU there, whatever device was asked
    on_zero = Config(zero_gpu=True)
    assert app.live_device(on_zero, "cuda") == "cpu" and app.live_device(on_zero, "cpu") == "cpu"
    assert app.live_device(Config(), "cuda") == "cuda"


def test_off_zero_gpu_a_local_gpu_records_and_none_says_why(monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    why = gpu_record.why_no_gpu()
    assert why.startswith("No GPU here") and "\n" not in why and gpu_record.where() == why
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda *a: "NVIDIA Test GPU")
    assert gpu_record.why_no_gpu() is None and "NVIDIA Test GPU" in gpu_record.where()


def test_threads_follow_the_cores_this_process_may_use(monkeypatch):
    """Its affinity mask, capped by its cgroup's quota (a Space's container on a larger host)."""
    monkeypatch.setattr(threads.os, "sched_getaffinity", lambda pid: set(range(16)))
    for quota, want in ((2, 2), (None, 16), (32, 16)):
        monkeypatch.setattr(threads, "cgroup_cpus", lambda q=quota: q)
        assert threads.available_cpus() == want
        assert threads.threads_per_decode(None, 2) == max(1, want // 2)


def test_gpu_seconds_grow_with_the_tokens_and_stay_within_a_call():
    assert gpu_record.gpu_seconds("p", 64) == 29
    assert gpu_record.gpu_seconds("p", 1) < gpu_record.gpu_seconds("p", 128) <= gpu_record.MAX_S
    for junk in (10 ** 9, "junk", None, float("nan")):
        assert gpu_record.gpu_seconds("p", junk) <= gpu_record.MAX_S   # never raises: ZeroGPU asks first


# ------------------------------------------------------------------ the record, on the CPU here

def test_the_gpu_preset_race_is_lossless_to_the_end(tiny):
    """The race a record runs (EAGLE-2 at (60, 5, 10) vs the static tree vs plain), greedy: the
    three decoders' tokens are the same."""
    s = record_settings("cuda", max_new_tokens=24)
    assert (s.total_tokens, s.depth, s.top_k) == (60, 5, 10) and s.policy != s.compare
    race = run_race(load_bundle(tiny, "random", "cpu"), PROMPT, s)
    main, cmp, plain = race.decoders
    assert race.finished and main.generated == plain.generated and cmp.generated[:len(main.generated)] == main.generated


def test_the_record_is_a_trace_that_opens_in_replay(tiny, monkeypatch):
    got = gpu_record.record_on_gpu(PROMPT, 12, 0.0, 1.0, 0, tiny, "random", "cpu")
    assert set(got) == {"trace"} and isinstance(got["trace"], str)   # plain data: it crosses a process
    tr = TRACES.from_json(got["trace"])
    view = View.from_trace(tr, "recorded")
    assert [s["role"] for s in view.series] == ["main", "compare", PLAIN]
    assert all(s["tokens"][-1] >= 12 or s["finished"] for s in view.series)
    assert tr.meta[DEVICE_NAME] == device_name("cpu") and tr.meta["viz"]["title"].startswith(f"Recorded on {device_name('cpu')}")
    assert 1 in {int(k) for k in tr.meta[RECORD_KEY]} and set(tr.meta[SECONDS]) == {"load", "costs", "race"}
    drawn = handlers.Replay().loaded(view, "path value", False, None)
    assert drawn["view"] is view and "Recorded on" in drawn["info"]
    assert f"wall clock,<br>{device_name('cpu')}" in drawn["metrics"]   # timed there, not on this server
    # the button's own path (here on the CPU): Replay shows it, its tab is selected, the line says how it went
    monkeypatch.setattr(gpu_record, "DEVICE", "cpu")
    monkeypatch.setattr(gpu_record, "why_no_gpu", lambda: None)
    monkeypatch.setattr(MODEL, "options", {"target": tiny, "head": "random"})
    out = gpu_record.GpuRecord(handlers.Replay(), "line", "tabs").on_record(PROMPT, 12, 0, 1, 0, "path value", False)
    assert isinstance(out["view"], View) and out["view"].meta[DEVICE_NAME] == device_name("cpu")
    assert isinstance(out["tabs"], gr.Tabs) and out["tabs"].selected == "replay"
    assert out["line"].startswith("Recorded on") and "Opened in Replay" in out["line"] and "\n" not in out["line"]


def test_bad_input_is_one_line_before_any_model_work(tiny, monkeypatch):
    for args, fragment in (((" ", 8, 0.0, 1.0, 0), "prompt is empty"), ((PROMPT, 8, -1.0, 1.0, 0), "temperature"),
                           ((PROMPT, 0, 0.0, 1.0, 0), "max new tokens")):
        got = gpu_record.record_on_gpu(*args, tiny, "random", "cpu")
        assert set(got) == {"error"} and fragment in got["error"].lower() and "\n" not in got["error"]
    if not torch.cuda.is_available():
        got = gpu_record.record_on_gpu(PROMPT, 8, 0.0, 1.0, 0, tiny, "random", "cuda")
        assert "no GPU is available" in got["error"]
    rec = gpu_record.GpuRecord(handlers.Replay(), "line", "tabs")
    monkeypatch.setattr(gpu_record, "why_no_gpu", lambda: None)
    out = rec.on_record(PROMPT, "many", 0, 1, 0, "path value", False)
    assert "whole number" in out["line"] and all(isinstance(out[n], SKIP) for n in REPLAY)


# ------------------------------------------------------------------ ZeroGPU's refusals, one line each

def zero_gpu_error(title: str, message: str) -> Exception:
    """The error ZeroGPU's client raises (spaces.zero.gradio.error where `spaces` is installed)."""
    try:
        from spaces.zero.gradio import error
    except ImportError:
        return gr.Error(message, title=title)
    return error(title, message)


REFUSALS = [   # (title, message, as spaces 0.51's client words them; what the line says)
    ("ZeroGPU quota exceeded", "You have exceeded your free ZeroGPU quota (29s requested vs. 12s left). "
     "Try again in 2:01:00. ", "Your GPU quota is spent (29s requested vs. 12s left); it refills in 2:01:00"),
    ("ZeroGPU quota exceeded", "You have exceeded your ZeroGPU runs limit. ", "Your GPU quota is spent; try again later"),
    ("ZeroGPU quota exceeded", "Space app has reached its GPU limit. Try re-running outside of examples if it "
     "happened after clicking one", "This Space has used its GPU time"),
    ("ZeroGPU quota exceeded", "No GPU was available after 60s. Try re-running outside of examples", "No GPU came free"),
    ("ZeroGPU queue timeout", "No GPU was available after 60s [Create a free account](https://huggingface.co/join) "
     "to get a higher priority in ZeroGPU queues.", "No GPU came free"),
    ("ZeroGPU client error", "No GPU was available", "No GPU came free"),
    ("ZeroGPU illegal duration", "The requested GPU duration (29s) is larger than the maximum allowed",
     "refused a run of 29 s"),
    ("ZeroGPU worker error", "GPU task aborted", "stopped before it finished (past its 29 s, or its worker was killed)"),
    ("ZeroGPU worker error", "OutOfMemoryError", "The GPU run failed (OutOfMemoryError)"),
]


@pytest.mark.parametrize("title,message,says", REFUSALS, ids=[f"{r[0][8:]}-{i}" for i, r in enumerate(REFUSALS)])
def test_each_refusal_is_one_line(title, message, says):
    line = gpu_record.failure_line(zero_gpu_error(title, message), 29)
    assert says in line and "\n" not in line and "Traceback" not in line, line


def test_a_refused_record_changes_only_its_line_and_the_page_keeps_stepping(tiny, monkeypatch):
    monkeypatch.setattr(MODEL, "loading", None)
    MODEL.set(load_bundle(tiny, "random", "cpu"))
    monkeypatch.setattr(gpu_record, "why_no_gpu", lambda: None)
    live, rec = handlers.Live(), gpu_record.GpuRecord(handlers.Replay(), "line", "tabs")
    first = live.on_step(None, PROMPT, *ui())
    sess = first["session"]
    assert sess.race.main.cycle == 2
    for title, message, says in REFUSALS + [(None, "the worker vanished", "RuntimeError: the worker vanished")]:
        def refused(*a, **k):
            raise zero_gpu_error(title, message) if title else RuntimeError(message)
        monkeypatch.setattr(gpu_record, "record_on_gpu", refused)
        out = rec.on_record(PROMPT, 64, 0, 1, 0, "path value", False)
        assert says in out["line"] and "\n" not in out["line"]
        assert isinstance(out["tabs"], SKIP) and all(isinstance(out[n], SKIP) for n in REPLAY)
    monkeypatch.setattr(gpu_record, "record_on_gpu", lambda *a, **k: {"error": "The prompt is empty: type something first."})
    assert rec.on_record("", 64, 0, 1, 0, "path value", False)["line"].startswith("The prompt is empty")
    after = live.on_step(sess, PROMPT, *ui())
    assert after["session"] is sess and sess.race.main.cycle == 3   # the live race went on where it was


def test_without_a_gpu_the_button_says_why_and_nothing_else(monkeypatch):
    monkeypatch.delenv("SPACES_ZERO_GPU", raising=False)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.setattr(gpu_record, "record_on_gpu", lambda *a, **k: pytest.fail("recorded without a GPU"))
    out = gpu_record.GpuRecord(handlers.Replay(), "line", "tabs").on_record(PROMPT, 64, 0, 1, 0, "path value", False)
    assert out["line"].startswith("No GPU here") and isinstance(out["tabs"], SKIP)
    assert all(isinstance(out[n], SKIP) for n in REPLAY)


# ------------------------------------------------------------------ the page, with and without `spaces`

def page_shape(demo) -> dict:
    """What a page is made of: its components' element ids and its events' API names and queues."""
    def queue(f):   # a named queue (Gradio names the others by the function's id)
        return f.concurrency_id if not str(f.concurrency_id).isdigit() else "own"
    return {"ids": sorted(c["props"].get("elem_id") or "" for c in demo.config["components"]),
            "events": sorted(f"{f.api_name}|{queue(f)}|{f.concurrency_limit}" for f in demo.fns.values())}


def test_the_page_wires_the_button_to_replay():
    demo = build_app(preload_trace=False, device="cpu")
    cfg = demo.config
    comps = {c["id"]: c for c in cfg["components"]}
    (dep,) = [d for d in cfg["dependencies"] if d.get("api_name") == "record_on_gpu"]
    assert comps[dep["targets"][0][0]]["props"]["elem_id"] == "gpu-record-btn"
    (fn,) = [f for f in demo.fns.values() if f.api_name == "record_on_gpu"]
    assert fn.concurrency_id == "gpu-record" and fn.concurrency_limit == 1   # never a decoding slot of the live page
    ids = [comps[i]["props"].get("elem_id") for i in dep["outputs"]]
    assert "trace-info" in ids and "replay-tree" in ids and "gpu-line" in ids and comps[dep["outputs"][-1]]["type"] == "tabs"
    assert [comps[i]["props"].get("elem_id") for i in dep["inputs"]][0] == "prompt"


def test_spaces_installed_leaves_the_page_and_the_function_as_they_are():
    """Off ZeroGPU `spaces.GPU` returns the function itself, and nothing registers with ZeroGPU."""
    spaces = pytest.importorskip("spaces")
    from spaces.zero.decorator import decorated_cache

    def fn(x):
        return x
    assert gpu_record.GPU is spaces.GPU and spaces.GPU(duration=5)(fn) is fn
    assert gpu_record.record_on_gpu.__module__ == "ui.gpu_record" and not hasattr(gpu_record.record_on_gpu, "zerogpu")
    assert gpu_record.record_on_gpu not in decorated_cache


SHAPE_WITHOUT_SPACES = """
import json, sys
sys.modules["spaces"] = None          # `import spaces` fails, as where it is not installed
from ui import gpu_record
from ui.page import build_app
from test_gpu_record import page_shape
assert gpu_record.spaces is None and gpu_record.GPU is gpu_record._in_place, gpu_record.GPU
print(json.dumps(page_shape(build_app(preload_trace=False, device="cpu"))))
"""


@pytest.mark.slow
def test_without_spaces_the_page_is_the_same():
    r = subprocess.run([sys.executable, "-c", SHAPE_WITHOUT_SPACES], cwd=REPO / "tests", capture_output=True,
                       text=True, timeout=300, env={**os.environ, "PYTHONPATH": f"{REPO}:{REPO / 'tests'}"})
    assert r.returncode == 0, r.stderr[-3000:]
    without = json.loads(r.stdout.strip().splitlines()[-1])
    assert without == page_shape(build_app(preload_trace=False, device="cpu"))


# ------------------------------------------------------------------ python -m eagle2 record

def test_the_record_command_writes_a_trace_replay_reads(tiny, tmp_path, capsys):
    out = tmp_path / "gpu" / "trace.json"
    code = cli_main(["record", "--prompt", PROMPT, "--device", "cpu", "--target", tiny, "--head", "random",
                     "--max-new-tokens", "10", "--out", str(out)])
    std = capsys.readouterr()
    assert code == 0, std.err
    view = read_upload(out)
    assert len(view.series) == 3 and view.meta[DEVICE_NAME] == device_name("cpu")
    assert "tok/s" in std.out and f"x {PLAIN}" in std.out and f"wrote {out}" in std.err
    for argv, fragment in ((["--prompt", " ", "--out", str(out)], "prompt is empty"),
                           (["--prompt", PROMPT, "--out", str(tmp_path)], "is a folder")):
        code = cli_main(["record", "--device", "cpu", "--target", tiny, "--head", "random", *argv])
        err = capsys.readouterr().err
        assert code == 2 and err.startswith("error: ") and fragment in err and "Traceback" not in err


# ------------------------------------------------------------------ a ZeroGPU Space, rehearsed

class FakeZeroGPU:
    """ZeroGPU's device API as the `spaces` package speaks to it (spaces/zero/api.py), on a local
    port: the start-up report, then each /schedule answered as `answers` says, in turn."""

    ANSWERS = {   # status, headers, body: as the API answers a refusal (or a grant)
        "quota": (429, {"X-Authenticated": "regular", "Content-Type": "application/json"}, '{"left": 12, "wait": 7260}'),
        "duration": (429, {"Content-Type": "application/json"}, '{"left": 12, "wait": -1}'),
        "busy": (503, {}, ""),
        "queue": (200, {"Content-Type": "text/event-stream"}, "event: failed\n\n"),
        "grant": (200, {"Content-Type": "application/json"},
                  '{"idle": false, "nvidiaIndex": 0, "nvidiaUUID": "GPU-00000000-fake", "allowToken": "t"}'),
    }

    def __init__(self):
        import http.server
        import threading
        self.calls, self.answers = [], []
        fake = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                path = self.path.split("?")[0]
                fake.calls.append(self.path)
                status, headers, body = (fake.ANSWERS[fake.answers.pop(0)] if path == "/schedule" and fake.answers
                                         else (503, {}, "") if path == "/schedule" else (200, {}, ""))
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body.encode())

            def log_message(self, *a):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()


@pytest.mark.slow
@pytest.mark.skipif(torch.version.cuda is None, reason="spaces stands in for CUDA only with a CUDA build of torch")
def test_a_zero_gpu_space_steps_on_the_cpu_and_says_each_refusal(tmp_path, tiny):
    """The app as a ZeroGPU Space starts it (SPACES_ZERO_GPU, `spaces` speaking to a stand-in of
    ZeroGPU's API here): it reports its GPU function at start-up (defined before launch), decodes
    on the CPU (torch there reports an emulated GPU), and each refusal of the real `spaces` client
    (quota, duration, no GPU, the queue) and a call granted on a machine without a GPU (its worker
    cannot start) are one line each, the live race stepping on between them."""
    pytest.importorskip("spaces")
    from gradio_client import Client
    from app_process import App
    from page_controls import STEP_API
    from spaces.zero.config import get_config
    fake = FakeZeroGPU()
    app = App(tmp_path, "--target", tiny, "--head", "random", "--device", "cuda",
              env={"SPACES_ZERO_GPU": "true", "SPACES_ZERO_DEVICE_API_URL": fake.url})
    try:
        app.wait_for("ready at", 0, timeout=300)
        err = app.text()[1]
        assert "/startup-report" in fake.calls, (fake.calls, err[-2000:])
        assert "decodes on the CPU (--device cuda ignored)" in err
        client = Client(app.url + "/", verbose=False, download_files=False, headers={"X-IP-Token": "visitor"})

        def status_after_step() -> str:
            return dict(zip(STEP_API, client.predict("w1 w2 w3", *ui(), api_name="/step")))["status"]
        assert "cycle 1" in status_after_step()
        params = client.view_api(return_format="dict")["named_endpoints"]["/record_on_gpu"]["parameters"]
        args = {p["parameter_name"]: p.get("parameter_default") for p in params}
        args.update(prompt="w1 w2 w3", max_new_tokens=64)
        asked = round(gpu_record.gpu_seconds("", 64) * get_config()["duration_factor"])   # as ZeroGPU is asked
        says = {"quota": f"Your GPU quota is spent ({asked}s requested vs. 12s left); it refills in 2:01:00",
                "duration": f"refused a run of {asked} s", "busy": "No GPU came free", "queue": "No GPU came free",
                "grant": "The GPU run failed"}
        for answer, line in says.items():
            fake.answers.append(answer)
            got = client.predict(**args, api_name="/record_on_gpu")
            assert [o for o in got if isinstance(o, str) and line in o], (answer, got, app.text()[1][-2000:])
        scheduled = [c for c in fake.calls if c.startswith("/schedule")]
        assert len(scheduled) == len(says) and all(f"durationSeconds={asked}" in c for c in scheduled), scheduled
        assert "cycle 2" in status_after_step()   # the live race went on
    finally:
        app.stop()
        fake.server.shutdown()


# ------------------------------------------------------------------ a worker forked from the page
def _record_in_forked_worker(out, bundle, tiny: str) -> None:
    """What ZeroGPU's worker runs: forked from the page's process, it decodes (here on the q4_1
    kernels the page loaded, then the record on the CPU) and sends back plain data."""
    d = Decoder(bundle, "eagle2", max_new_tokens=6, record=False)
    d.start(input_ids=[3, 1, 4])
    d.generate()
    out.put({"tokens": d.generated, **gpu_record.record_on_gpu(PROMPT, 8, 0.0, 1.0, 0, tiny, "random", "cpu")})


def test_a_worker_forked_after_the_page_decoded_records(tiny, tiny_target, tmp_path):
    """ZeroGPU forks each @spaces.GPU worker from the page's process (multiprocessing's 'fork'),
    after visitors' Steps have run there on two threads: the kernels' OpenMP team and torch's have
    run, and the child inherits their state but none of their threads. The worker records and
    answers, within a bounded wait (it hung on its first parallel region)."""
    import multiprocessing
    import queue
    from test_serving import random_eagle3_head
    folder, _ = tiny_target("fork-e3", layers=4)
    bundle = load_bundle(str(folder), random_eagle3_head(folder, tmp_path / "head"), dtype="q4_1")
    before = torch.get_num_threads()
    torch.set_num_threads(2)
    try:
        ref = Decoder(bundle, "eagle2", max_new_tokens=6, record=False)   # the page's Steps: both teams run
        ref.start(input_ids=[3, 1, 4])
        ref.generate()
        torch.randn(300, 300) @ torch.randn(300, 300)
        ctx = multiprocessing.get_context("fork")
        out = ctx.Queue()
        worker = ctx.Process(target=_record_in_forked_worker, args=(out, bundle, tiny))
        worker.start()
        try:
            got = out.get(timeout=90)
        except queue.Empty:
            pytest.fail("the forked worker gave no answer in 90 s")
        finally:
            worker.join(timeout=10)
            if worker.is_alive():
                worker.kill()
                worker.join(timeout=10)
        assert got["tokens"] == ref.generated and set(got) == {"tokens", "trace"}
        assert TRACES.from_json(got["trace"]).steps
        assert torch.get_num_threads() == 2   # the parent keeps its threads
    finally:
        torch.set_num_threads(before)
