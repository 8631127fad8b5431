"""Which blocks the draft head's matrices should take on the kernels (EAGLE2_HEAD_BLOCKS), judged
by tau and tokens/s: plain q4_1 and eagle2-auto with the head in each format, every held-out prompt
decoded by each in turn (the order reversed every other prompt) in one process, so the machine's
drift falls on all alike. The target is the same in every bundle; only the head's blocks differ,
so every run's tokens equal plain's (checked). Prints and writes the figures as JSON.

    python scripts/head_blocks.py --blocks q8_0,q4_1 --out benchmarks/head-blocks/run1.json
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--blocks", default="q8_0,q4_1", help="the head's formats, comma-separated")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--limit", type=int, default=0, help="the first N prompts only (smoke runs)")
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    a = ap.parse_args(argv)
    from eagle2.cycle.sampling import SamplingParams
    from eagle2.model.loading import load_bundle
    from eagle2.tools.bench import machine, make_decoder, run_one
    from eagle2.tools.flags import costs_first
    from eagle2.tools.prompt_files import HELDOUT, read_prompts
    torch.set_num_threads(a.threads)
    formats = [b.strip() for b in a.blocks.split(",") if b.strip()]
    bundles = {}
    for blocks in formats:
        os.environ["EAGLE2_HEAD_BLOCKS"] = blocks
        bundles[blocks] = load_bundle("smollm2-135m", None, "cpu", "q4_1")
    sp = SamplingParams()
    runs = {"plain": (bundles[formats[0]], "plain")}
    runs.update({f"eagle2-auto {b}": (bundles[b], "eagle2-auto") for b in formats})
    for b, policy in runs.values():
        costs_first(b, policy)
    makers = {k: (lambda b=b, p=p: make_decoder(b, p, sp, a.max_new_tokens, {}, {})) for k, (b, p) in runs.items()}
    for k, (b, _) in runs.items():   # one short run each first (allocators, caches, lazy tables)
        run_one(b, makers[k], {"turns": ["Say hello."]}, sp, 8)
    prompts = read_prompts(HELDOUT)
    prompts = prompts[: a.limit] if a.limit else prompts
    tot = {k: defaultdict(float) for k in runs}
    ids = {k: [] for k in runs}
    for i, q in enumerate(prompts):
        for k in (list(runs) if i % 2 == 0 else list(runs)[::-1]):
            r = run_one(runs[k][0], makers[k], q, sp, a.max_new_tokens)
            ids[k].append(r["token_ids"])
            for f in ("new_tokens", "target_forwards", "wall_s", "draft_s", "verify_s"):
                tot[k][f] += r.get(f, 0.0)
    out = {"command": "python scripts/head_blocks.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "cpu": machine(), "threads": a.threads, "prompts": len(prompts), "runs": {}}
    plain_tps = tot["plain"]["new_tokens"] / tot["plain"]["wall_s"]
    for k, t in tot.items():
        tps = t["new_tokens"] / t["wall_s"]
        out["runs"][k] = {"tokens_per_s": tps, "vs_plain": tps / plain_tps,
                          "tau": t["new_tokens"] / t["target_forwards"],
                          "draft_ms_a_cycle": 1e3 * t["draft_s"] / t["target_forwards"],
                          "verify_ms_a_cycle": 1e3 * t["verify_s"] / t["target_forwards"],
                          "identical_to_plain": ids[k] == ids["plain"]}
        r = out["runs"][k]
        print(f"{k:22s} {tps:7.1f} tok/s  {r['vs_plain']:.3f}x  tau {r['tau']:.3f}  "
              f"draft {r['draft_ms_a_cycle']:.2f} ms  verify {r['verify_ms_a_cycle']:.2f} ms a cycle  "
              f"identical {r['identical_to_plain']}")
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(out, indent=1) + "\n")
        print(f"wrote {a.out}")
    return 0 if all(r["identical_to_plain"] for r in out["runs"].values()) else 1


if __name__ == "__main__":
    sys.exit(main())
