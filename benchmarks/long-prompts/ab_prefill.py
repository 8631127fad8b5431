"""Prefill tokens/s of this checkout's kernels (A) against OTHER's (B), alternating in one process:
    python benchmarks/long-prompts/ab_prefill.py OTHER_CHECKOUT THREADS TOKENS ROUNDS"""
import sys, time, torch
from pathlib import Path
other = Path(sys.argv[1]); threads = int(sys.argv[2]); T = int(sys.argv[3]); rounds = int(sys.argv[4])
torch.set_num_threads(threads)
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from kernel_builds import this_and_other  # noqa: E402
a, b = this_and_other(other)
toks = torch.randint(100, 40000, (T,), generator=torch.Generator().manual_seed(0))
res = {"A": [], "B": []}
for r in range(rounds):
    for name, f in (("A", a.forward), ("B", b.forward)):
        c = f.new_cache(T + 8)
        t0 = time.perf_counter()
        f.prefill(c, toks, torch.arange(T))
        res[name].append(time.perf_counter() - t0)
for k, v in res.items():
    print(f"{k}: prefill of {T} tokens at {threads} threads: " + ", ".join(f"{x:.2f}" for x in v) + f" s; best {T/min(v):.0f} tok/s")
print(f"B/A (best of each): {min(res['B'])/min(res['A']):.2f}")
