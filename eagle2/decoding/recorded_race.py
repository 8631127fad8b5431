"""A whole race in one call: the page's three decoders run to the end of the answer on one device,
and the trace they leave.

What "Record on the GPU" asks of a GPU (ui/gpu_record.py; on a ZeroGPU Space it runs in a worker
process whose arguments and result cross as pickles, so only the trace file's text goes back, no
tensor) and what `python -m eagle2 record` writes. Nothing here needs the page: the GPU check runs
it on a machine without Gradio.
"""
from __future__ import annotations

import time

from ..cycle.series import series
from ..cycle.trace import DEVICE_NAME, VIZ_KEY, Trace
from ..devices import device_kind, is_cuda
from ..errors import check
from ..machine import cpu_info
from ..model.loading import load_bundle
from ..model.calibration import measure_verify_times
from ..model.verify_times import RECORD_KEY
from .race import Race, RaceSettings

DIGITS = 4   # a recorded trace's floats, in significant digits (Trace.to_json): a third of the size
# On CUDA the race records in fp32 unless told otherwise: greedy trees reproduce plain decoding
# there, while bf16's kernels round one row and the rows of a tree differently (docs/serving.md).
CUDA_DTYPE = "float32"
SECONDS = "record_s"          # meta: where the call's seconds went (loading, t(N), the race)


def device_name(device) -> str:
    """The device as people name it: the GPU's model ("NVIDIA H100 80GB HBM3"), or the CPU's."""
    if is_cuda(device):
        import torch
        return torch.cuda.get_device_name(device)
    return cpu_info()["cpu"]


def record_settings(kind: str, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
                    seed: int = 0) -> RaceSettings:
    """The page's race as a device of `kind` runs it: that device's tree preset (on a GPU EAGLE-2
    at (60, 5, 10)) against the static tree and plain decoding, with these generation settings;
    checked (a UserError names a bad one)."""
    return RaceSettings.for_device(kind).with_(max_new_tokens=max_new_tokens, temperature=temperature,
                                               top_p=top_p, seed=seed).validate()


def run_race(bundle, prompt: str, settings: RaceSettings) -> Race:
    """The race started on `prompt` and ticked until the main decoder has finished."""
    race = Race()
    race.start(bundle, prompt, settings)
    while not race.finished:
        race.tick()
    return race


def record(prompt: str, device: str = "cuda", target: str | None = None, head: str | None = None,
           dtype: str | None = None, max_new_tokens: int = 64, temperature: float = 0.0, top_p: float = 1.0,
           seed: int = 0) -> Trace:
    """Load the model on `device`, measure its t(N) there, run the race on `prompt` to the end and
    return its trace, titled with the device's name. Everything is checked before the model
    loads; a UserError says what is wrong (no GPU, an empty prompt, a bad setting)."""
    check(isinstance(prompt, str) and prompt.strip() != "", "The prompt is empty: type something first.")
    settings = record_settings(device_kind(device), max_new_tokens, temperature, top_p, seed)
    t0 = time.perf_counter()
    bundle = load_bundle(target, head, device, dtype or (CUDA_DTYPE if is_cuda(device) else None))
    t1 = time.perf_counter()
    # this device's t(N) (its first forwards warm the device up before the race is timed), for the
    # what-if views; measured here, not through the shared cache's lock, which a process forked
    # from the page (a ZeroGPU worker) may have inherited held
    costs = measure_verify_times(bundle)
    t2 = time.perf_counter()
    race = run_race(bundle, prompt, settings)
    t3 = time.perf_counter()
    tr = race.export()
    name = device_name(bundle.device)
    main, compare, _ = race.labels()
    tr.meta[RECORD_KEY] = costs
    tr.meta[DEVICE_NAME] = name
    tr.meta[SECONDS] = {"load": t1 - t0, "costs": t2 - t1, "race": t3 - t2}
    tr.meta[VIZ_KEY].update(title=f"Recorded on {name}: {main} vs {compare}, {prompt_words(prompt)}",
                            category=device_kind(device).upper(), recorded=time.strftime("%Y-%m-%d"))
    return tr


def prompt_words(prompt: str, words: int = 5) -> str:
    """A prompt's first words, quoted: what tells two recordings on one device apart in a list."""
    w = prompt.split()
    return '"' + " ".join(w[:words]) + ("..." if len(w) > words else "") + '"'


def decoders_of(tr: Trace) -> list[dict]:
    """Each decoder of a recorded race (the main one first): its label, tokens, target forwards,
    seconds of its own work, tokens per second and tau."""
    out = []
    for s in [series(tr.steps[0].policy, tr.steps)] + list((tr.meta.get(VIZ_KEY) or {}).get("series") or []):
        tokens = s["tokens"][-1] if s["tokens"] else 0
        wall = s["wall_s"][-1] if s["wall_s"] else 0.0
        forwards = s["forwards"][-1] if s["forwards"] else 0
        out.append({"label": s["label"], "tokens": tokens, "forwards": forwards, "wall_s": wall,
                    "tokens_per_s": tokens / wall if wall > 0 else 0.0, "tau": tokens / max(1, forwards)})
    return out


def summary_line(tr: Trace) -> str:
    """One line: each decoder's tokens per second and tau, and the main decoder against the last
    (plain decoding), e.g. "eagle2 412 tok/s (tau 3.2) · static 301 tok/s (tau 2.6) · plain 150
    tok/s: eagle2 2.75x plain"."""
    ds = decoders_of(tr)
    parts = [f"{d['label']} {d['tokens_per_s']:.0f} tok/s" + (f" (tau {d['tau']:.2f})" if d is not ds[-1] else "")
             for d in ds]
    line = " · ".join(parts)
    if len(ds) > 1 and ds[-1]["tokens_per_s"] > 0:
        line += f": {ds[0]['label']} {ds[0]['tokens_per_s'] / ds[-1]['tokens_per_s']:.2f}x {ds[-1]['label']}"
    return line
