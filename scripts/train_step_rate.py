"""The head training step's rate on this machine: eager against torch.compile'd (`train --compile`),
fp32 against bf16 autocast (`--amp`), interleaved round by round on the same batches of a feature
cache, after one warm-up round each (which holds the compiling). A measurement script, not a test:
its figures are recorded under benchmarks/ with the command.

    python scripts/train_step_rate.py --features RUN [--head-kind eagle3] [--rounds 4] [--threads 2]

RUN: a run folder with a feature cache (features3_train for eagle3; eagle also reads it). Tokens/s
count every token of the batches (padding excluded), as the training log's epochs hold them.
"""
from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--features", required=True)
    ap.add_argument("--head-kind", default="eagle3", choices=("eagle", "eagle3"))
    ap.add_argument("--ttt-steps", type=int, default=3)
    ap.add_argument("--batch-tokens", type=int, default=2048)
    ap.add_argument("--max-batches", type=int, default=16, help="batches per round")
    ap.add_argument("--rounds", type=int, default=4)
    ap.add_argument("--threads", type=int, default=2)
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    sys.path.insert(0, str(REPO))
    from eagle2.machine import describe_cpu
    from eagle2.model.loading import load_target
    from eagle2.model.weights import DEFAULT_PRESET
    from eagle2_train.selfdistill import load_features
    from eagle2_train.train import batches, build_parser, compiled_core, target_folder, train_step
    from eagle2_train.train_heads import build_head, cache_for, objective, parse_aux_layers

    cpu = torch.device("cpu")
    targs = build_parser().parse_args(["--out", "-", "--head-kind", a.head_kind, "--ttt-steps", str(a.ttt_steps),
                                       "--batch-tokens", str(a.batch_tokens)])
    target = load_target(target_folder(DEFAULT_PRESET), cpu, torch.float32)
    for p in target.parameters():
        p.requires_grad_(False)
    cache = cache_for(Path(a.features), a.head_kind, "train")
    convs = load_features(cache, a.head_kind == "eagle3")
    aux = tuple(json.loads((cache / "index.json").read_text()).get("aux_layers", ())) or parse_aux_layers(None, 30)
    head, _ = build_head(targs, target, convs, cpu, aux if a.head_kind == "eagle3" else ())
    head.train()
    ref = target.lm_head.weight.detach()
    obj = objective(targs, ref if head.draft_ids is None else ref[head.draft_ids])
    params = [p for p in head.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4)
    bs = list(batches(convs, a.batch_tokens, True, random.Random(0)))[: a.max_batches]
    ntok = sum(len(c["ids"]) for b in bs for c in b)
    configs = {f"{mode} {'bf16' if amp else 'fp32'}": (mode, amp) for mode in ("eager", "compiled")
               for amp in (False, True)}

    def one_round(mode, amp) -> float:
        core = compiled_core() if mode == "compiled" else None
        t = time.perf_counter()
        for b in bs:
            train_step(head, b, obj, opt, params, a.ttt_steps, cpu, torch.bfloat16 if amp else None, core)
        return ntok / (time.perf_counter() - t)

    warm = {name: round(one_round(*cfg), 1) for name, cfg in configs.items()}
    rates = {name: [] for name in configs}
    for _ in range(a.rounds):
        for name, cfg in configs.items():
            rates[name].append(round(one_round(*cfg), 1))
    print(json.dumps({"machine": describe_cpu(a.threads), "torch": torch.__version__, "features": str(cache),
                      "head_kind": a.head_kind, "ttt_steps": a.ttt_steps, "batch_tokens": a.batch_tokens,
                      "batches": len(bs), "tokens_per_round": ntok, "warm_up_tokens_per_s": warm,
                      "tokens_per_s": rates,
                      "median": {k: sorted(v)[len(v) // 2] for k, v in rates.items()}}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
