"""`python -m eagle2 tau`: how far a draft head carries the trees, on every held-out prompt.

tau = generated tokens per target forward, greedy, for each tree shape given (`60x5x10` = EAGLE-2
with N=60 verified tokens, depth 5, top-k 10; `static` = EAGLE-1's fixed tree), over all prompts of
--prompts (multi-turn prompts answer each turn after the previous answer). No timing and no plain
decoding: tau does not depend on the machine, so the eager forward serves, and every shape's output
is checked against the others' token for token (they are all exact, so any difference is a bug).
Writes DIR/tau.json; `scripts/head_table.py` puts heads side by side with their held-out agreement.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch
from tqdm import tqdm

from ..decoding.decoder import Decoder
from ..errors import UserError, check
from ..machine import cpu_info
from ..model.loading import load_bundle
from ..model.weights import PRESETS, sha256_of
from ..cycle.sampling import SamplingParams
from ..policies.registry import BASELINE, EAGLE2
from .bench import run_one
from .flags import add_model_args, apply_threads
from .prompt_files import HELDOUT, read_prompts

SHAPE = re.compile(r"^(\d+)x(\d+)x(\d+)$")


def parse_trees(spec: str) -> list[tuple[str, str, dict]]:
    """'60x5x10,16x5x10,static' -> [(label, policy, kwargs)]: NxDEPTHxTOPK shapes of the default
    dynamic tree (EAGLE-2), and the static baseline (EAGLE-1) by its name."""
    out = []
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        if part == BASELINE:
            out.append((BASELINE, BASELINE, {}))
            continue
        m = SHAPE.match(part)
        if not m:
            raise UserError(f"--trees: {part!r} is neither {BASELINE!r} nor NxDEPTHxTOPK (e.g. 60x5x10).")
        n, d, k = map(int, m.groups())
        out.append((f"{EAGLE2} ({n},{d},{k})", EAGLE2, {"total_tokens": n, "depth": d, "top_k": k}))
    check(len(out) > 0, "--trees names no tree.")
    return out


def head_digest(target: str, head: str | None) -> str | None:
    """sha256 of the head's model.safetensors when it is a local folder (the preset's shipped head
    by default): ties the figures to the weights, so a head is shipped with its own tau."""
    if head is None and target in PRESETS:
        head = PRESETS[target].head
    f = Path(str(head)).expanduser() / "model.safetensors" if head not in (None, "random") else None
    return sha256_of(f) if f is not None and f.is_file() else None


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m eagle2 tau", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    add_model_args(ap, dtype=False)
    ap.add_argument("--prompts", default=str(HELDOUT),
                    help="MT-bench format jsonl (default: the 60 held-out)")
    ap.add_argument("--trees", default=f"60x5x10,16x5x10,{BASELINE}",
                    help=f"comma list of NxDEPTHxTOPK (the {EAGLE2} tree) or {BASELINE}")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="per turn")
    ap.add_argument("--out", required=True)
    return ap


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    check(1 <= a.max_new_tokens <= 4096, f"--max-new-tokens must be in [1, 4096] (got {a.max_new_tokens}).")
    trees = parse_trees(a.trees)
    apply_threads(a)
    prompts = read_prompts(Path(a.prompts))
    bundle = load_bundle(a.target, a.head, a.device)  # the eager forward: tau is the same on any path
    t0 = time.perf_counter()
    tot = {label: defaultdict(lambda: [0, 0]) for label, _, _ in trees}  # label -> category -> [tokens, forwards]
    mismatches = []
    for q in tqdm(prompts, desc="tau", unit="prompt"):
        outs = {}
        for label, policy, kw in trees:
            r = run_one(bundle, lambda: Decoder(bundle, policy, SamplingParams(), max_new_tokens=a.max_new_tokens,
                                                record=False, **kw), q, SamplingParams(), a.max_new_tokens)
            ids, fw = r["token_ids"], int(r["target_forwards"])
            outs[label] = ids
            for cat in (q["category"], "all"):
                tot[label][cat][0] += len(ids)
                tot[label][cat][1] += fw
        first = next(iter(outs.values()))
        mismatches += [{"question_id": q["question_id"], "tree": label} for label, ids in outs.items()
                       if ids != first]
    res = {label: {"tau": c["all"][0] / max(c["all"][1], 1), "new_tokens": c["all"][0], "target_forwards": c["all"][1],
                   "by_category": {cat: v[0] / max(v[1], 1) for cat, v in sorted(c.items()) if cat != "all"}}
           for label, c in tot.items()}
    summary = {"head": bundle.head_name, "head_sha256": head_digest(a.target, a.head), "model": bundle.name,
               "prompts": str(a.prompts), "n_prompts": len(prompts),
               "max_new_tokens": a.max_new_tokens, "trees": res, "identical": not mismatches,
               "mismatches": mismatches, "seconds": round(time.perf_counter() - t0, 1),
               "threads": torch.get_num_threads(), "machine": {**cpu_info(), "torch": torch.__version__},
               "date": time.strftime("%Y-%m-%d %H:%M:%S"),
               "command": "python -m eagle2 tau " + " ".join(argv if argv is not None else sys.argv[2:])}
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "tau.json").write_text(json.dumps(summary, indent=2))
    print(f"head {bundle.head_name}, {len(prompts)} prompts x {a.max_new_tokens} new tokens per turn, greedy")
    for label, r in res.items():
        print(f"  {label:<20} tau {r['tau']:.3f}  ({r['new_tokens']} tokens / {r['target_forwards']} forwards)")
    if mismatches:
        print(f"ERROR: the trees' outputs differ on {len(mismatches)} prompt(s): {mismatches[:5]}", file=sys.stderr)
        return 1
    print(f"every tree's output identical; wrote {out}/tau.json")
    return 0
