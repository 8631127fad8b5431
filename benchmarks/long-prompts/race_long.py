"""The race's first Step on a long prompt in one process: Race.start (the prefill) and the first
tick, each decoder's cycle 0 and 1 by phase. The prompt: "Summarise this document:" and the start
of docs/algorithms.md, CHARS characters (13000: about 4100 tokens).

    python benchmarks/long-prompts/race_long.py THREADS CHARS
"""
import sys
import time
from pathlib import Path

import torch

threads, chars = int(sys.argv[1]), int(sys.argv[2])
torch.set_num_threads(threads)
from eagle2.decoding.race import Race, RaceSettings  # noqa: E402
from eagle2.model.loading import load_bundle  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
b = load_bundle(dtype="q4_1")
text = (ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8")
prompt = ("Summarise this document:\n\n" + text * (1 + chars // len(text)))[:chars]
print("prompt tokens", len(b.tokenizer(prompt)["input_ids"]))
b.token_texts([0])   # the page builds its token table while loading, before any Step
inside = {"prefill": 0.0, "head": 0.0}   # seconds inside the target's prefill and the head's calls


def timed(fn, part):
    def call(*a, **kw):
        t = time.perf_counter()
        try:
            return fn(*a, **kw)
        finally:
            inside[part] += time.perf_counter() - t
    return call


b.forward.prefill, b.draft.step = timed(b.forward.prefill, "prefill"), timed(b.draft.step, "head")
r = Race()
s = RaceSettings.for_device("cpu")
t0 = time.perf_counter()
r.start(b, prompt, s)
t1 = time.perf_counter()
r.tick()
t2 = time.perf_counter()
print(f"start {t1 - t0:.2f} s, first tick {t2 - t1:.2f} s, policies {s.policy}/{s.compare}; inside them "
      f"the prefill {inside['prefill']:.2f} s, the head's calls {inside['head']:.2f} s")
for d, name in zip(r.decoders, r.labels()):
    for st in d.trace.steps:
        print(name, st.cycle, {k: round(v, 3) for k, v in st.timings.items() if isinstance(v, float) and v > 0.005})
