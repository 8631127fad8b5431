"""Each decoder's Step in the page's lockstep race (eagle2.decoding.race, in one process, no server)
against the same decoder stepping alone on the page's default prompt: the median step of plain
and of eagle2-auto, three repeats; COMPARE (default static) is the race's comparison policy.

    python benchmarks/page-vs-bench/race_vs_alone.py [THREADS] [COMPARE]
"""
import statistics as st
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from eagle2 import threads
from eagle2.model.loading import load_bundle
from eagle2.decoding.race import Race, RaceSettings
from eagle2.decoding.decoder import Decoder
from eagle2.cycle.sampling import SamplingParams
from ui.tabs.live import example_map, first_example
from ui.traces import load_examples
threads.use_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
COMPARE = sys.argv[2] if len(sys.argv) > 2 else "static"
b = load_bundle(dtype="q4_1")
from eagle2.model.calibration import verify_profile
verify_profile(b)
prompt = first_example(example_map(load_examples()))
def wrap(d, acc):
    f = d.step
    def s():
        t0 = time.perf_counter(); r = f(); acc.append(time.perf_counter() - t0); return r
    d.step = s
for rep in range(3):
    r = Race()
    r.start(b, prompt, RaceSettings.for_device("cpu").with_(max_new_tokens=64, compare=COMPARE))
    accs = {"main": [], "cmp": [], "plain": []}
    for k, d in zip(accs, r.decoders): wrap(d, accs[k])
    while r.finished is None and len(accs["plain"]) < 40: r.tick()
    alone = {}
    for name, pol in (("main", "eagle2-auto"), ("plain", None)):
        d = Decoder(b, pol, SamplingParams(), max_new_tokens=64, record=True)
        d.start(messages=[{"role": "user", "content": prompt}]); acc = []; wrap(d, acc)
        while d.finished is None and len(acc) < 40: d.step()
        alone[name] = acc
    print(f"race plain {1e3*st.median(accs['plain'][1:]):.2f} ms / alone {1e3*st.median(alone['plain'][1:]):.2f} ms;  "
          f"race main {1e3*st.median(accs['main'][1:]):.2f} / alone {1e3*st.median(alone['main'][1:]):.2f} ms a step", flush=True)
