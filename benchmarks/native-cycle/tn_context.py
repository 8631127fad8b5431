"""t(N) of the default model's q4_1 forward at several committed contexts: median of 30 timed
verify calls per N, the sizes interleaved, a causal tree of N rows after a prefilled cache of
random tokens, each row's argmax asked for as greedy decoding asks. Run from a checkout (base or
after): python benchmarks/native-cycle/tn_context.py THREADS OUT.json"""
import json
import statistics
import sys
import time

import torch

from eagle2.machine import cpu_info
from eagle2.model.loading import load_bundle
from eagle2.model.stopwatch import prefilled_cache

threads, out = int(sys.argv[1]), sys.argv[2]
torch.set_num_threads(threads)
f = load_bundle(dtype="q4_1").forward
verify_takes_best = "best" in f.verify.__code__.co_varnames
ns, res = (1, 2, 4, 8), {}
for ctx in (100, 250, 500, 900):
    cache = prefilled_cache(f, ctx, 16)
    g = torch.Generator().manual_seed(0)
    times = {n: [] for n in ns}
    for _ in range(30):
        for n in ns:
            toks, pos = torch.randint(0, 49152, (n,), generator=g), torch.arange(ctx, ctx + n)
            mask = torch.tril(torch.ones(n, n, dtype=torch.bool))
            kw = {"best": torch.empty(n, dtype=torch.long)} if verify_takes_best else {}
            t = time.perf_counter()
            f.verify(cache, toks, pos, mask, **kw)
            times[n].append(time.perf_counter() - t)
    med = {n: statistics.median(v) * 1e3 for n, v in times.items()}
    res[ctx] = {"t_ms": med, "ratio": {n: med[n] / med[1] for n in ns}}
    print(f"context {ctx}: " + ", ".join(f"t({n}) {med[n]:.2f} ms" for n in ns)
          + "; t(N)/t(1) " + ", ".join(f"{med[n] / med[1]:.2f}" for n in ns[1:]))
json.dump({"threads": threads, "cpu": cpu_info(), "forward": f.description, "by_context": res}, open(out, "w"), indent=1)
