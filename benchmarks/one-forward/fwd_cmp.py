"""fp32 compiled (AOTInductor packages, the retired stack at 1d0d77e) vs fp32 eager vs q4_1 kernels:
one verification (forward + logits) of N causal rows after 256 committed tokens, median seconds,
the three interleaved repeat by repeat (run from a worktree of 1d0d77e)."""
import json, sys, time
import torch
torch.set_num_threads(2)
from eagle2.model.loading import load_bundle
from eagle2.model.compiled import attach
from eagle2.model.stopwatch import prefilled_cache, interleaved_medians
from eagle2.machine import cpu_info
comp = load_bundle(dtype="float32"); line = attach(comp, "auto")
eager = load_bundle(dtype="float32")
q4 = load_bundle()
targets = {"fp32 compiled": comp.target, "fp32 eager": eager.target, "q4_1 kernels": q4.target}
caches = {k: prefilled_cache(t, 256, 17) for k, t in targets.items()}
out = {"compiled_line": line, "machine": cpu_info(), "torch": torch.__version__, "threads": 2, "sizes": {}}
for n in (1, 2, 4, 8):
    toks = torch.randint(0, 49152, (n,), generator=torch.Generator().manual_seed(n))
    pos = torch.arange(256, 256 + n)
    mask = torch.ones(n, n, dtype=torch.bool).tril()
    now = {}
    variants = {k: (lambda k=k: now.update(t=targets[k], c=caches[k])) for k in targets}
    med = interleaved_medians(torch.device("cpu"), variants, lambda: now["t"].forward_logits(now["c"], toks, pos, mask), 15)
    out["sizes"][n] = {k: round(v * 1e3, 3) for k, v in med.items()}
    print(n, out["sizes"][n], flush=True)
print(json.dumps(out, indent=1))
json.dump(out, open(sys.argv[1], "w"), indent=1)
