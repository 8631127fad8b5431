"""How well the draft's path values predict what the target accepts (the premise of EAGLE-2's
reranking and of the auto budget's expected tokens): a fixed EAGLE-2 tree on every held-out
prompt's first turn, greedy, and for each verified node its value exp(path log-prob) against
whether the target accepted it, in bins; the same for each node's own draft probability given that
its parent was accepted. Then eagle2-auto with its values read as they are and calibrated
(AcceptanceOdds): the tokens its budget expected a cycle against the tokens the cycle emitted.
Writes it all as JSON and prints it.

    python scripts/value_calibration.py --out benchmarks/calibrated-values/calibration.json
"""
from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

EDGES = (0.0, 0.01, 0.03, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0 + 1e-9)


def bins(pred: np.ndarray, obs: np.ndarray) -> list[dict]:
    out = []
    for lo, hi in zip(EDGES, EDGES[1:]):
        m = (pred >= lo) & (pred < hi)
        if m.any():
            out.append({"bin": [lo, min(hi, 1.0)], "n": int(m.sum()), "predicted": float(pred[m].mean()),
                        "accepted": float(obs[m].mean())})
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", type=Path, required=True, help="the JSON file to write")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--tree", default="60,5,10", help="EAGLE-2's total_tokens,depth,top_k")
    a = ap.parse_args(argv)
    import torch

    from eagle2.cycle.sampling import SamplingParams
    from eagle2.decoding.decoder import Decoder
    from eagle2.machine import cpu_info
    from eagle2.model.loading import load_bundle
    from eagle2.policies.auto import AutoBudgetPolicy
    from eagle2.tools.prompt_files import HELDOUT, read_prompts
    torch.set_num_threads(a.threads)
    n, depth, k = (int(x) for x in a.tree.split(","))
    b = load_bundle(dtype="q4_1")
    rows = []   # (path value, accepted, own draft probability, parent accepted)
    prompts = read_prompts(HELDOUT)
    for q in prompts:
        d = Decoder(b, "eagle2", SamplingParams(), max_new_tokens=a.max_new_tokens, record=True,
                    total_tokens=n, depth=depth, top_k=k)
        d.start(messages=[{"role": "user", "content": q["turns"][0]}])
        d.generate()
        for s in d.trace.steps[1:]:
            t = s.tree
            for i in range(1, len(t.tokens)):
                if t.kept[i]:
                    rows.append((math.exp(t.values[i]), t.accepted[i], math.exp(t.logp[i]), t.accepted[t.parents[i]]))
    budget = {}
    for calibrate in (False, True):   # the budget's expectation against what its cycles emitted
        want, got, odds = [], [], []
        for q in prompts:
            pol = AutoBudgetPolicy(calibrate=calibrate)
            d = Decoder(b, pol, SamplingParams(), max_new_tokens=a.max_new_tokens, record=True)
            d.start(messages=[{"role": "user", "content": q["turns"][0]}])
            d.generate()
            for s in d.trace.steps[1:]:
                rec = s.tree.record
                if rec.n == rec.best_n:   # not an exploring cycle: it verified what it expected from
                    want.append(rec.expected_tokens)
                    got.append(len(s.accepted_path) + 1)
            odds.append(pol.acceptance.odds)
        budget["calibrated" if calibrate else "as_they_are"] = {
            "cycles": len(want), "expected_tokens": float(np.mean(want)), "emitted_tokens": float(np.mean(got)),
            "odds_at_the_end": {"min": float(np.min(odds)), "median": float(np.median(odds)), "max": float(np.max(odds))}}
    r = np.array(rows, dtype=np.float64)
    parent = r[:, 3] > 0
    result = {"command": " ".join(["python scripts/value_calibration.py", *(argv if argv is not None else sys.argv[1:])]),
              "machine": cpu_info(), "threads": a.threads, "prompts": len(prompts), "tree": [n, depth, k],
              "max_new_tokens": a.max_new_tokens, "nodes": len(r),
              "sum_predicted": float(r[:, 0].sum()), "sum_accepted": float(r[:, 1].sum()),
              "path_values": bins(r[:, 0], r[:, 1]),
              "own_probability_given_parent_accepted": bins(r[parent, 2], r[parent, 1]),
              "eagle2_auto": budget}
    a.out.parent.mkdir(parents=True, exist_ok=True)
    a.out.write_text(json.dumps(result, indent=1))
    for key in ("path_values", "own_probability_given_parent_accepted"):
        print(key)
        for row in result[key]:
            print(f"  [{row['bin'][0]:.2f}, {row['bin'][1]:.2f})  n={row['n']:6d}  predicted {row['predicted']:.3f}"
                  f"  accepted {row['accepted']:.3f}")
    print(f"{len(r)} verified nodes: {result['sum_predicted']:.0f} predicted, {result['sum_accepted']:.0f} accepted")
    for how, v in budget.items():
        print(f"eagle2-auto, values {how.replace('_', ' ')}: {v['expected_tokens']:.3f} tokens expected a cycle, "
              f"{v['emitted_tokens']:.3f} emitted ({v['cycles']} cycles); odds at the end {v['odds_at_the_end']}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
