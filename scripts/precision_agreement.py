"""How often plain greedy decoding in q4_1 gives the tokens fp32 gives, on held-out prompts: the
share of prompts whose answers are identical and the mean length of the common prefix (q4_1 is
its own precision; its speculative decoding equals its own plain decoding, which the bench checks).

    python scripts/precision_agreement.py --limit 20 --max-new-tokens 128 --out benchmarks/q4_1/agreement.json
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def main(argv=None) -> int:
    import torch
    from eagle2.decoding.decoder import Decoder
    from eagle2.machine import describe_cpu
    from eagle2.model.loading import load_bundle
    from eagle2.tools.prompt_files import HELDOUT, read_prompts
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--limit", type=int, default=20)
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    prompts = read_prompts(HELDOUT)[: a.limit]
    answers = {}
    for dtype in ("float32", "q4_1"):
        b = load_bundle(dtype=dtype)
        answers[dtype] = []
        for q in prompts:
            d = Decoder(b, "plain", max_new_tokens=a.max_new_tokens, record=False)
            d.start(messages=[{"role": "user", "content": q["turns"][0]}])
            d.generate()
            answers[dtype].append(list(d.generated))
    pairs = list(zip(answers["float32"], answers["q4_1"]))
    res = {
        "command": "python scripts/precision_agreement.py " + " ".join(argv or sys.argv[1:]),
        "cpu": describe_cpu(a.threads), "prompts": len(pairs), "max_new_tokens": a.max_new_tokens,
        "identical_share": sum(x == y for x, y in pairs) / len(pairs),
        "mean_common_prefix_tokens": sum(prefix(x, y) for x, y in pairs) / len(pairs),
        "common_prefix_tokens": [prefix(x, y) for x, y in pairs],
    }
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(res, indent=1))
    print(json.dumps({k: v for k, v in res.items() if k != "common_prefix_tokens"}, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
