"""t(N) of this checkout's kernels (A) against OTHER's qforward.cpp and headers (B), interleaved in one process."""
import sys, torch, numpy as np
from pathlib import Path
other = Path(sys.argv[1]); threads = int(sys.argv[2]); context = int(sys.argv[3]); sizes = [int(x) for x in sys.argv[4].split(",")]
reps = int(sys.argv[5]) if len(sys.argv) > 5 else 15
torch.set_num_threads(threads)
from eagle2.model.stopwatch import time_forwards
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernel_builds import this_and_other  # noqa: E402
a, b = this_and_other(other)
res = {}
for rnd in range(3):
    r = time_forwards({"A": a.forward, "B": b.forward}, sizes, context=context, repeats=reps)
    for n, d in r.items():
        res.setdefault(n, []).append(d)
print(f"threads {threads} context {context}: A = this checkout, B = {other}")
med = {n: {k: np.median([d[k] for d in res[n]]) for k in ("A", "B")} for n in sizes}
for n in sizes:
    print(f"T={n:3d} A {med[n]['A']*1e3:7.3f} ms  B {med[n]['B']*1e3:7.3f} ms  B/A {med[n]['B']/med[n]['A']:5.3f}")
for n in sizes[1:]:
    print(f"t({n})/t({sizes[0]}): A {med[n]['A']/med[sizes[0]]['A']:.3f}  B {med[n]['B']/med[sizes[0]]['B']:.3f}")
