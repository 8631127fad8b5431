"""The draft head's step in Q8_0 against Q4_1 formats, interleaved in one process: seconds a call for T rows
after a committed context, and the top-1 agreement of the two heads' drafts on the same inputs."""
import sys, time, torch, numpy as np
torch.set_num_threads(int(sys.argv[1]))
from eagle2.model import quantized as Q
from eagle2.model.loading import load_bundle
orig = Q.quantise_q8_0
variants = {}
for name, which in (("q8_0", set()), ("lm", {"lm"}), ("lm+mlp", {"lm", "mlp"}), ("all", {"lm", "mlp", "attn", "fc"})):
    def pick(w, which=which):
        N, K = w.shape
        kind = ("lm" if N >= 4096 else "fc" if K == 1728 else "mlp" if max(N, K) == 1536 else "attn")
        return Q.quantise_q4_1(w) if kind in which else orig(w)
    Q.quantise_q8_0 = pick
    b = load_bundle(dtype="q4_1")
    variants[name] = b.draft
Q.quantise_q8_0 = orig
ctx = 400
g = torch.Generator().manual_seed(0)
feats = torch.randn(ctx + 8, 1728, generator=g)
toks = torch.randint(0, 49152, (ctx + 8,), generator=g)
caches = {}
for n, d in variants.items():
    c = d.new_cache(ctx + 16)
    d.step(c, feats[:ctx], toks[:ctx], torch.arange(ctx), 0, k=0); c.advance(ctx)
    caches[n] = c
res = {n: {T: [] for T in (1, 2, 4)} for n in variants}
for rep in range(30):
    for T in (1, 2, 4):
        for n, d in variants.items():
            t = time.perf_counter()
            d.step(caches[n], feats[ctx:ctx + T], toks[ctx:ctx + T], torch.arange(ctx, ctx + T), ctx, k=16)
            res[n][T].append(time.perf_counter() - t)
for n in variants:
    print(n, "  ".join(f"T={T}: {np.median(v)*1e3:.3f} ms" for T, v in res[n].items()))
