""""Record on the GPU": the page's race for the prompt, run on a GPU in one call and opened in Replay.

On a Hugging Face Space with ZeroGPU hardware the live page runs in the Space's main process, on
its CPU, and a GPU exists only inside functions decorated with `@spaces.GPU`: each call runs in a
worker process that gets a GPU for its duration; its arguments and its result cross as pickles and
nothing stays on the GPU between calls. `record_on_gpu` is that function, defined when this module
is imported (the page imports it before launch, as ZeroGPU requires): it loads the model on the
GPU, runs the whole race there (decoding/recorded_race.py) and sends back the trace file's text.
Off ZeroGPU the decorator leaves the function as it is: with a local CUDA GPU the button runs it in
this process; with none, it says so in one line. Whatever goes wrong (the visitor's quota spent,
no GPU free in time, a duration refused, the worker killed) is one line beside the button; the live
page and its sessions are untouched.
"""
from __future__ import annotations

import logging
import re
import time

import gradio as gr

import viz
from eagle2 import config
from eagle2.decoding.recorded_race import DIGITS, record
from eagle2.errors import UserError
from eagle2.policies.registry import TRACES
from eagle2.cycle.trace import VIZ_KEY

from .model import MODEL
from .outputs import REPLAY, skip
from .view import View

log = logging.getLogger(__name__)

try:   # the `space` extra; where it is missing (or broken), the button says so and nothing else changes
    import spaces
    SPACES_ERROR = None
except Exception as e:  # noqa: BLE001  (ImportError, or its own check of a ZeroGPU variable set by mistake)
    spaces, SPACES_ERROR = None, f"{type(e).__name__}: {e}"

DEVICE = "cuda"          # where the button records (the tests record on the CPU)
MAX_TOKENS = 256         # new tokens a GPU record runs at most, whatever the page's slider says
# ZeroGPU's duration for one call, in seconds: the worker's start, loading the model and its t(N),
# then about 0.15 s a token for the three decoders; within its default 60 s a call. A shorter one
# waits less in its queue and asks less of the visitor's daily quota (a few minutes).
BASE_S, PER_TOKEN_S, MAX_S = 20, 0.15, 60


def gpu_seconds(prompt=None, max_new_tokens=64, *rest, **kw) -> int:
    """ZeroGPU's duration for a call of record_on_gpu with these arguments (never raises: ZeroGPU
    asks it before the call, whatever the arguments are)."""
    try:
        n = min(MAX_TOKENS, max(1, int(float(max_new_tokens))))
    except (TypeError, ValueError, OverflowError):
        n = MAX_TOKENS
    return int(min(MAX_S, BASE_S + n * PER_TOKEN_S))


def _in_place(duration=None):
    """The decorator where `spaces` is not installed: the function as it is (as spaces.GPU itself
    leaves it off ZeroGPU)."""
    return lambda fn: fn


GPU = spaces.GPU if spaces is not None else _in_place


@GPU(duration=gpu_seconds)
def record_on_gpu(prompt: str, max_new_tokens: int, temperature: float, top_p: float, seed: int,
                  target: str | None = None, head: str | None = None, device: str = DEVICE) -> dict:
    """The race for `prompt` on `device`, run to the end: {"trace": the trace file's text} or
    {"error": one line}. Plain data both ways: on ZeroGPU this runs in a worker process."""
    try:
        tr = record(prompt, device, target, head, None, max_new_tokens, temperature, top_p, seed)
    except UserError as e:
        return {"error": str(e)}
    except Exception as e:   # noqa: BLE001  (a failure on the GPU: the log has the traceback, the page a line)
        log.exception("recording on %s failed", device)
        return {"error": f"The GPU run failed ({type(e).__name__}: {str(e)[:200]})."}
    return {"trace": tr.to_json(digits=DIGITS)}


def why_no_gpu() -> str | None:
    """None where the button can record on a GPU; else the line saying why not. A ZeroGPU Space is
    known by SPACES_ZERO_GPU: its main process reports CUDA (emulated) while it has no GPU."""
    if config.current().zero_gpu:
        if spaces is None:
            return f"This is a ZeroGPU Space, but the `spaces` package cannot be imported ({SPACES_ERROR})."
        return None
    import torch
    if torch.cuda.is_available():
        return None
    return ("No GPU here: this server has no CUDA device. On a Hugging Face Space with ZeroGPU hardware "
            "this button records the race on the Space's GPU; the live page runs on the CPU either way.")


def where() -> str:
    """The line beside the button before any record: where a record would run."""
    why = why_no_gpu()
    if why:
        return why
    if config.current().zero_gpu:
        return (f"Runs this prompt's race on this Space's GPU (ZeroGPU, up to {MAX_S} s a call from your "
                f"daily GPU quota) and opens it in Replay.")
    import torch
    return f"Runs this prompt's race on this machine's {torch.cuda.get_device_name()} and opens it in Replay."


# ZeroGPU's refusals, told apart by the title and message of the gr.Error its client raises
# (spaces/zero/client.py, wrappers.py), each as one line for the visitor
NO_GPU = "No GPU was available"   # after a minute in the queue, or none at all
SPACE_LIMIT = "Space app has reached its GPU limit"   # the Space's own quota (visitors without a token)


def failure_line(e: BaseException, seconds: int) -> str:
    """A failed GPU call as one line. `seconds`: the duration asked for it."""
    title = str(getattr(e, "title", "") or "").lower()
    msg = " ".join(str(getattr(e, "message", None) or e).split())
    if "illegal duration" in title:
        return (f"The GPU refused a run of {seconds} s (longer than this Space allows a call): lower "
                f"Max new tokens and try again.")
    if "queue timeout" in title or NO_GPU in msg:
        return "No GPU came free in time (ZeroGPU's queue): try again in a minute."
    if SPACE_LIMIT in msg:
        return "This Space has used its GPU time for now: try again later. The live page goes on on the CPU."
    if "quota" in title or "credits" in title:
        told = re.search(r"\(([^()]*requested vs\.[^()]*left)\)", msg)
        again = re.search(r"Try again in ([0-9:]+)", msg)
        return ("Your GPU quota is spent" + (f" ({told.group(1)})" if told else "") +
                (f"; it refills in {again.group(1)}" if again else "; try again later") +
                ". The live page goes on on the CPU.")
    if "worker error" in title and "aborted" in msg.lower():
        return (f"The GPU run was stopped before it finished (past its {seconds} s, or its worker was "
                f"killed): try fewer new tokens.")
    if "worker error" in title or "client error" in title:
        return f"The GPU run failed ({msg[:200] or 'ZeroGPU gave no reason'}); try again in a moment."
    return f"The GPU run failed ({type(e).__name__}: {msg[:200]})."


class GpuRecord:
    """The button's handler: `replay` draws into the Replay tab (a handlers.Replay made with its
    outputs), `line` is the line beside the button, `tabs` the page's tabs (Replay is selected once
    a record has landed)."""

    def __init__(self, replay, line, tabs):
        self.replay, self.line, self.tabs = replay, line, tabs

    def outputs(self) -> list:
        return [*self.replay.outputs(REPLAY), self.line, self.tabs]

    def said(self, line: str) -> dict:
        """Only the line changes: Replay and the tab stay as they were."""
        return {**skip(REPLAY, self.replay.out), self.line: line, self.tabs: gr.skip()}

    def on_record(self, prompt, max_new_tokens, temperature, top_p, seed, colour_by, show_dropped,
                  panels=None, accept=None) -> dict:
        """Record the race for the prompt box's prompt on the GPU and open it in Replay; any failure
        is the line, and nothing else changes. Outputs: REPLAY, the line, the tabs."""
        why = why_no_gpu()
        if why:
            return self.said(why)
        try:
            n = int(float(max_new_tokens))
        except (TypeError, ValueError, OverflowError):
            return self.said(f"Max new tokens must be a whole number (got {max_new_tokens!r}).")
        capped = f" (capped at {MAX_TOKENS} new tokens)" if n > MAX_TOKENS else ""
        n = min(n, MAX_TOKENS)
        opts, t0 = MODEL.options, time.perf_counter()
        try:
            got = record_on_gpu(prompt, n, float(temperature or 0.0), float(1.0 if top_p is None else top_p),
                                int(float(seed or 0)), opts.get("target"), opts.get("head"), DEVICE)
        except Exception as e:   # noqa: BLE001  (ZeroGPU's refusals and whatever else the call raised)
            log.warning("record on the GPU failed: %s", e)
            return self.said(failure_line(e, gpu_seconds(prompt, n)))
        if "error" in got:
            return self.said(got["error"])
        try:
            view = View.from_trace(TRACES.from_json(got["trace"]), "recorded on the GPU")
        except UserError as e:
            return self.said(f"The GPU's trace could not be read: {e}")
        took = time.perf_counter() - t0
        title = (view.meta.get(VIZ_KEY) or {}).get("title", "Recorded")
        line = f"{title}, in {took:.0f} s{capped}{speedups(view)}. Opened in Replay."
        shown = self.replay.loaded(view, colour_by, show_dropped, panels, accept)
        return {**shown, self.line: line, self.tabs: gr.Tabs(selected="replay")}


def speedups(view: View) -> str:
    """": eagle2 2.31x plain, 1.42x static": the main decoder against the others, on that device."""
    m = viz.charts.metrics(view.series[0], view.series[1:])
    parts = [f"{sp:.2f}x {label}" for label, sp in m["speedups"].items() if sp is not None]
    return f": {view.series[0]['label']} " + ", ".join(parts) if parts else ""


def wire(button: gr.Button, line, tabs, replay, inputs: list) -> None:
    """The button's event: `inputs` the prompt, max new tokens, temperature, top-p, seed, then
    Replay's colour, dropped-nodes and panels controls. A queue of its own (the live page's Steps
    never wait behind a GPU call); on ZeroGPU a few at once, each its own GPU; locally one."""
    rec = GpuRecord(replay, line, tabs)
    button.click(rec.on_record, inputs, rec.outputs(), concurrency_id="gpu-record",
                 concurrency_limit=4 if config.current().zero_gpu else 1, show_progress_on=line,
                 api_name="record_on_gpu")
