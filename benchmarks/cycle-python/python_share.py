"""How much of a greedy eagle2-auto cycle on the q4_1 kernels is Python, on the first K held-out
prompts x 128 tokens at T threads: `Decoder.speculate`'s wall against `KernelCycle.run`'s and
against the `qf_cycle` call inside it (and the parts that call times itself).

    python benchmarks/cycle-python/python_share.py T K
"""
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from eagle2.cycle.sampling import SamplingParams
from eagle2.decoding import decoder as D
from eagle2.model import qcycle
from eagle2.model.loading import load_bundle

threads, limit = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
rec = {"speculate": [], "run": [], "call": [], "parts": []}


class TimedLib:
    """The kernels' library with qf_cycle's wall time recorded."""

    def __init__(self, lib):
        self._lib = lib

    def __getattr__(self, name):
        f = getattr(self._lib, name)
        if name != "qf_cycle":
            return f

        def timed(*args):
            t0 = time.perf_counter()
            rc = f(*args)
            rec["call"].append(time.perf_counter() - t0)
            return rc
        return timed


def timed(fn, key):
    def wrapper(*args, **kw):
        t0 = time.perf_counter()
        out = fn(*args, **kw)
        rec[key].append(time.perf_counter() - t0)
        return out
    return wrapper


real_run = qcycle.KernelCycle.run


def run(self, *args, **kw):
    if not isinstance(self.lib, TimedLib):
        self.lib = TimedLib(self.lib)
    out = timed(real_run, "run")(self, *args, **kw)
    s = out.seconds
    rec["parts"].append(s["tree"] + s["forward"] + s["accept"] + s["commit"] + s["absorb"])
    return out


qcycle.KernelCycle.run = run
D.Decoder.speculate = timed(D.Decoder.speculate, "speculate")
bundle = load_bundle(dtype="q4_1")
prompts = Path(__file__).resolve().parents[2] / "assets" / "prompts" / "heldout.jsonl"
for line in prompts.read_text().splitlines()[:limit]:
    d = D.Decoder(bundle, "eagle2-auto", SamplingParams(), max_new_tokens=128, record=False)
    d.start(prompt=json.loads(line)["turns"][0])
    d.absorb()
    d.generate()
ms = {k: 1e3 * statistics.mean(v) for k, v in rec.items()}
python = ms["speculate"] - ms["call"]
print(f"{len(rec['run'])} cycles, {threads} thread(s): a cycle {ms['speculate']:.3f} ms; qf_cycle {ms['call']:.3f} "
      f"(its own parts {ms['parts']:.3f}); Python {python:.3f} ms ({python / ms['speculate']:.1%}): "
      f"{ms['run'] - ms['call']:.3f} in KernelCycle.run around the call, {ms['speculate'] - ms['run']:.3f} in the "
      f"decoder and the policy")
