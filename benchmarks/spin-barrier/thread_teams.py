"""A plain q4_1 step's median time called from the main thread, then from a worker thread (as a
server's handlers call the engine: each thread that starts an OpenMP region gets a team of its
own, kept while it lives), then from the main thread again, then both after 3 s idle. Before the
kernels met at their own barrier, the worker's team pushed the process past libgomp's count of
threads per CPU and every later step slept at each barrier.

    python benchmarks/spin-barrier/thread_teams.py [THREADS] [STEPS]
"""
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from eagle2 import threads  # noqa: E402
from eagle2.cycle.sampling import SamplingParams  # noqa: E402
from eagle2.decoding.decoder import Decoder  # noqa: E402
from eagle2.model.loading import load_bundle  # noqa: E402

T = int(sys.argv[1]) if len(sys.argv) > 1 else 2
N = int(sys.argv[2]) if len(sys.argv) > 2 else 100
threads.use_threads(T)
bundle = load_bundle(dtype="q4_1")
PROMPT = [{"role": "user", "content": "Write a long story about a lighthouse keeper and the sea."}]


def median_step_ms() -> float:
    d = Decoder(bundle, None, SamplingParams(), max_new_tokens=N + 5, record=False)
    d.start(messages=PROMPT)
    d.step()
    took = []
    for _ in range(N):
        t0 = time.perf_counter()
        d.step()
        took.append(time.perf_counter() - t0)
    return 1e3 * statistics.median(took)


worker = ThreadPoolExecutor(1)
out = {"main": [median_step_ms(), median_step_ms()],
       "worker": [worker.submit(median_step_ms).result(), worker.submit(median_step_ms).result()]}
out["main after"] = [median_step_ms(), median_step_ms()]
time.sleep(3)
out["main, 3 s idle"] = [median_step_ms()]
out["worker, 3 s idle"] = [worker.submit(median_step_ms).result()]
print(f"{T} threads, plain q4_1, median of {N} steps (ms): "
      + "; ".join(f"{k} " + ", ".join(f"{v:.2f}" for v in vs) for k, vs in out.items()))
