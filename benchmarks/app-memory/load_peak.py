"""The default bundle's load, timed from the process's start, its peak RSS, and the greedy tokens
three decoders give on one prompt (to compare two checkouts: the same tokens, and plain's).

    PYTHONPATH=CHECKOUT python benchmarks/app-memory/load_peak.py

Prints one JSON line: load_s (process start to the loaded bundle, imports included),
peak_rss_mib (ru_maxrss), tokens (policy -> the 40 generated ids)."""
from __future__ import annotations

import json
import resource
import time

T0 = time.perf_counter()

from eagle2.cycle.sampling import SamplingParams  # noqa: E402  (timed from the process's start)
from eagle2.decoding.decoder import Decoder  # noqa: E402
from eagle2.model.loading import load_bundle  # noqa: E402

PROMPT = "Write a haiku about the sea."


def main() -> None:
    b = load_bundle()
    load_s = time.perf_counter() - T0
    tokens = {}
    for policy in ("plain", "eagle2-auto", "eagle2"):
        d = Decoder(b, policy, SamplingParams(), max_new_tokens=40)
        d.start(PROMPT)
        d.generate()
        tokens[policy] = d.generated
    print(json.dumps({"load_s": round(load_s, 2),
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
                      "tokens": tokens}))


if __name__ == "__main__":
    main()
