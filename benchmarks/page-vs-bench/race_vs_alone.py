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
from eagle2 import threads  # noqa: E402
from eagle2.cycle.sampling import SamplingParams  # noqa: E402
from eagle2.decoding.decoder import Decoder  # noqa: E402
from eagle2.decoding.race import Race, RaceSettings  # noqa: E402
from eagle2.model.calibration import verify_profile  # noqa: E402
from eagle2.model.loading import load_bundle  # noqa: E402
from ui.tabs.live import example_map, first_example  # noqa: E402
from ui.traces import load_examples  # noqa: E402

threads.use_threads(int(sys.argv[1]) if len(sys.argv) > 1 else 1)
COMPARE = sys.argv[2] if len(sys.argv) > 2 else "static"
STEPS = 40
bundle = load_bundle(dtype="q4_1")
verify_profile(bundle)   # the budget's t(N) measured before any step is timed
prompt = first_example(example_map(load_examples()))


def timed(d, took: list) -> None:
    """d.step, each call's seconds appended to `took`."""
    step = d.step

    def step_timed():
        t0 = time.perf_counter()
        out = step()
        took.append(time.perf_counter() - t0)
        return out
    d.step = step_timed


def median_ms(took: list) -> float:
    return 1e3 * st.median(took[1:])   # the first step holds the prompt's prefill


for _ in range(3):
    race = Race()
    race.start(bundle, prompt, RaceSettings.for_device("cpu").with_(max_new_tokens=64, compare=COMPARE))
    in_race = {"main": [], "cmp": [], "plain": []}
    for took, d in zip(in_race.values(), race.decoders):
        timed(d, took)
    while race.finished is None and len(in_race["plain"]) < STEPS:
        race.tick()
    alone = {}
    for name, policy in (("main", "eagle2-auto"), ("plain", None)):
        d = Decoder(bundle, policy, SamplingParams(), max_new_tokens=64, record=True)
        d.start(messages=[{"role": "user", "content": prompt}])
        alone[name] = []
        timed(d, alone[name])
        while d.finished is None and len(alone[name]) < STEPS:
            d.step()
    print(f"race plain {median_ms(in_race['plain']):.2f} ms / alone {median_ms(alone['plain']):.2f} ms;  "
          f"race main {median_ms(in_race['main']):.2f} / alone {median_ms(alone['main']):.2f} ms a step", flush=True)
