"""How far ahead the q4_1 matmuls should ask for their weights on this CPU: the target's
verification of N rows after a committed context, timed at each prefetch distance (0: none)
interleaved repeat by repeat in one process (fair against the machine's drift), with the
medians, each against no prefetch, and t(N)/t(1). The distance changes no bit of any result
(tests/test_quantized.py), only when the bytes arrive. With --kv-rows, the same for attention's
K/V cache instead: how many of a kv head's rows it asks for as it starts (0: no prefetch of the
cache), the matmuls at their default distance.

    python scripts/prefetch_distance.py --distances 0,2048,4096,8192,16384 --out F.json
    python scripts/prefetch_distance.py --kv-rows 0,1024 --out F.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--distances", default="0,2048,4096,8192,16384", help="bytes ahead, comma-separated")
    ap.add_argument("--kv-rows", default="", help="attention's K/V rows asked for up front, comma-separated "
                    "(varied instead of --distances)")
    ap.add_argument("--rows", default="1,2,4,8", help="the N of t(N), comma-separated")
    ap.add_argument("--context", type=int, default=500, help="committed tokens before the rows")
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--kernels", default="", help="EAGLE2_Q4_KERNELS for this run (e.g. avx2)")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    a = ap.parse_args(argv)
    if a.kernels:
        os.environ["EAGLE2_Q4_KERNELS"] = a.kernels
    from eagle2.model.loading import load_bundle
    from eagle2.model.qlib import ISAS
    from eagle2.model.stopwatch import interleaved_medians, prefilled_cache
    from eagle2.tools.bench import machine
    torch.set_num_threads(a.threads)
    kv = bool(a.kv_rows)
    distances = [int(x) for x in (a.kv_rows if kv else a.distances).split(",")]
    rows = [int(x) for x in a.rows.split(",")]
    f = load_bundle("smollm2-135m", None, "cpu", "q4_1").forward
    lib = getattr(f, "lib", None)   # None: the kernels could not run here (the fp32 forward serves)
    if lib is None:
        print("the q4_1 kernels do not run here: no prefetch to measure", file=sys.stderr)
        return 1
    setter = lib.qf_set_kv_prefetch if kv else lib.qf_set_prefetch
    default = lib.qf_kv_prefetch() if kv else lib.qf_prefetch()
    cache = prefilled_cache(f, a.context, max(rows) + 1)
    g = torch.Generator().manual_seed(0)
    ms = {}
    for n in rows:
        toks = torch.randint(0, f.args.vocab_size, (n,), generator=g)
        pos = torch.arange(a.context, a.context + n)
        mask = torch.ones(n, n, dtype=torch.bool).tril()
        variants = {d: (lambda d=d: setter(d)) for d in distances}
        med = interleaved_medians(variants, lambda: f.verify(cache, toks, pos, mask), a.repeats)
        ms[n] = {d: 1e3 * s for d, s in med.items()}
        print(f"t({n}) ms: " + "  ".join(f"{d}: {v:.3f}" for d, v in ms[n].items()), flush=True)
    setter(default)
    base = distances[0]
    out = {"command": "python scripts/prefetch_distance.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "cpu": machine(), "kernels": ISAS[lib.qf_isa()], "threads": a.threads, "context": a.context,
           "varied": "kv_rows" if kv else "bytes", "default": default, "ms": {str(n): {str(d): v for d, v in m.items()} for n, m in ms.items()},
           "over_first": {str(n): {str(d): v / m[base] for d, v in m.items()} for n, m in ms.items()},
           "over_t1": {str(n): {str(d): v / ms[rows[0]][d] for d, v in m.items()} for n, m in ms.items()}}
    print(f"each against {base} {'K/V rows' if kv else 'bytes'} ahead, and t(N)/t({rows[0]}):")
    for n in rows:
        print(f"  N={n}: " + "  ".join(f"{d}: {out['over_first'][str(n)][str(d)]:.3f} ({out['over_t1'][str(n)][str(d)]:.2f})"
                                       for d in distances))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
