"""`python -m eagle2 train`: train an EAGLE draft head for any supported target.

Stages (each resumable, outputs under --out): data (self-distillation), features (fp16 cache),
train (EAGLE-1/2 loss: SmoothL1 feature regression + 0.1 x cross-entropy against the target's
distribution, uniform input-feature noise, AdamW, grad clip, cosine schedule, held-out top-1
agreement every epoch). The head is saved in the official layout, with a reduced draft vocabulary
(the N most frequent target tokens of the training data) recorded as `d2t` when --draft-vocab > 0.
"""
from __future__ import annotations

import argparse
import json
import math
import random
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from ..errors import UserError
from ..model.head import EagleHead, load_head, save_head
from ..model.loading import load_target, pick_device
from ..model.weights import ASSETS, hub_download, resolve_target
from .flags import add_model_args, apply_threads
from .selfdistill import extract_features, generate_data, load_features, read_prompts

VARIANTS = {"greedy": {"name": "greedy", "temperature": 0.0},
            "t0.7": {"name": "t0.7", "temperature": 0.7, "top_p": 0.95},
            "t1.0": {"name": "t1.0", "temperature": 1.0, "top_p": 1.0}}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m eagle2 train", description=__doc__)
    add_model_args(ap, head=False, dtype=False)
    ap.add_argument("--out", required=True, help="run folder (data, features, checkpoints, head/)")
    ap.add_argument("--prompts", default=",".join(str(ASSETS / "prompts" / f) for f in
                                                  ("train.jsonl", "train_templated.jsonl", "train_templated2.jsonl")),
                    help="comma-separated MT-bench-style prompt files (hand-written + templated)")
    ap.add_argument("--heldout", default=str(ASSETS / "prompts" / "heldout.jsonl"))
    ap.add_argument("--stages", default="data,features,train")
    ap.add_argument("--features", default=None,
                    help="run folder whose feature cache the train stage reads (default: --out), e.g. to "
                         "fine-tune into a fresh folder")
    ap.add_argument("--variants", default="greedy,t0.7", help=f"self-distillation decodings: {','.join(VARIANTS)}")
    ap.add_argument("--limit-prompts", type=int, default=0, help="use only the first K prompts (0 = all)")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=48)
    ap.add_argument("--max-len", type=int, default=1024, help="truncate conversations to this many tokens")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--noise", type=float, default=0.2, help="uniform input-feature noise half-width")
    ap.add_argument("--ce-weight", type=float, default=0.1)
    ap.add_argument("--draft-vocab", type=int, default=8192, help="0 = full target vocabulary")
    ap.add_argument("--init", default="random",
                    help="'random' (default), 'last-layer' (the target's last layer; measured worse on SmolLM2: "
                         "its large output scale dominates the first epochs), or a head folder to fine-tune "
                         "(its draft vocabulary is kept)")
    ap.add_argument("--ttt-steps", type=int, default=1,
                    help="training-time test: also train S-1 unrolled passes in which the head reads its own "
                         "predicted features, as draft nodes of depth 2..S do (1 = off; S costs about S x)")
    ap.add_argument("--ttt-weight", type=float, default=1.0, help="loss weight of each unrolled pass")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def target_folder(target: str) -> Path:
    where = resolve_target(target)
    return where if isinstance(where, Path) else hub_download(where, ["config.json", "*.safetensors", "tokenizer*",
                                                                      "*.jinja", "special_tokens_map.json"])


@torch.no_grad()
def choose_vocab(convs: list[dict], n: int, lm_full: torch.Tensor, eos: set[int]) -> torch.Tensor | None:
    """The n target tokens with the most expected occurrences in the training conversations: the
    observed counts plus the target's own next-token probabilities summed over every position
    (soft counts generalise to tokens a small data set happens not to contain). Sorted ids."""
    V = lm_full.shape[0]
    if n <= 0 or n >= V:
        return None
    score = torch.zeros(V, dtype=torch.float64)
    for c in tqdm(convs, desc="draft vocabulary", unit="conv"):
        score.index_add_(0, c["ids"].long(), torch.ones(len(c["ids"]), dtype=torch.float64))
        f = c["feat"][::4].to(lm_full.device, lm_full.dtype)  # every 4th position: 4x cheaper, same ranking head
        score += 4 * torch.softmax(f @ lm_full.T, dim=-1).sum(0).double().cpu()
    for e in eos:
        score[e] = float("inf")
    return torch.sort(score.topk(n).indices).values


def batches(convs: list[dict], batch_tokens: int, shuffle: bool, rng: random.Random):
    """Batches of at most batch_tokens padded tokens. Shuffled runs sort each window of 256
    conversations by length before cutting it into batches (padding is compute wasted twice,
    forward and backward) and then shuffle the batch order."""
    order = list(range(len(convs)))
    if shuffle:
        rng.shuffle(order)
        order = [i for w in range(0, len(order), 256)
                 for i in sorted(order[w:w + 256], key=lambda j: len(convs[j]["ids"]))]
    out, cur, longest = [], [], 0
    for i in order:
        n = len(convs[i]["ids"])
        if cur and max(longest, n) * (len(cur) + 1) > batch_tokens:
            out.append(cur)
            cur, longest = [], 0
        cur.append(i)
        longest = max(longest, n)
    if cur:
        out.append(cur)
    if shuffle:
        rng.shuffle(out)
    for b in out:
        yield [convs[j] for j in b]


def collate(batch: list[dict], device):
    """Teacher forcing: inputs (f_i, x_{i+1}), targets f_{i+1}, loss where x_{i+1} is assistant text."""
    T = max(len(c["ids"]) for c in batch) - 1
    B, D = len(batch), batch[0]["feat"].shape[1]
    fin = torch.zeros(B, T, D)
    fout = torch.zeros(B, T, D)
    tok = torch.zeros(B, T, dtype=torch.long)
    nxt = torch.zeros(B, T, dtype=torch.long)
    m = torch.zeros(B, T)
    for b, c in enumerate(batch):
        n = len(c["ids"]) - 1
        f = c["feat"].float()
        fin[b, :n] = f[:-1]
        fout[b, :n] = f[1:]
        tok[b, :n] = c["ids"][1:]
        m[b, :n] = c["mask"][1:].float()
    return fin.to(device), tok.to(device), fout.to(device), m.to(device)


def head_loss(head, fin, tok, fout, m, noise, ce_weight, train=True, top1_target=None, ttt_steps=1,
              ttt_weight=1.0):
    """EAGLE loss on one batch, plus (ttt_steps > 1) the same loss, weighted ttt_weight, on each
    unrolled training-time-test pass in which the head reads its own predicted features
    (head.forward_train_unrolled). Returns (loss, stats): the step-1 loss `loss1`, `top1`, the
    number of loss positions `n` and `top1_step{s}` for each unrolled pass. Agreement is against
    `top1_target` (full-vocabulary argmax, given for evaluation) or, in training, the target's
    argmax within the draft vocabulary."""
    if train and noise > 0:
        fin = fin + (torch.rand_like(fin) * 2 - 1) * noise
    g = head.forward_train(fin, tok)
    w = head.lm_weight
    sel = m > 0  # the vocabulary products (most of the cost) only where the loss looks
    fsel = fout[sel]
    with torch.no_grad():
        p = torch.softmax(fsel @ w.T, dim=-1)  # the target's distribution, on the draft vocabulary
        target_ids = head.to_target_ids(p.argmax(-1)) if top1_target is None else top1_target[sel]

    def step(gs, keep=None):
        """Summed loss and agreements at the selected rows (optionally a subset `keep`)."""
        t, pp, ids = (fsel, p, target_ids) if keep is None else (fsel[keep], p[keep], target_ids[keep])
        reg = F.smooth_l1_loss(gs, t, reduction="none").mean(-1)
        logq = torch.log_softmax(gs @ w.T, dim=-1)
        ce = -(pp * logq).sum(-1)
        with torch.no_grad():
            agree = (head.to_target_ids(logq.argmax(-1)) == ids).float().sum()
        return (reg + ce_weight * ce).sum(), float(agree), int(gs.shape[0])

    denom = max(int(sel.sum()), 1)
    loss, agree, _ = step(g[sel])
    stats = {"loss1": float(loss.detach()) / denom, "top1": agree / denom, "n": int(sel.sum())}
    if ttt_steps > 1:
        col = torch.arange(sel.shape[1], device=sel.device).expand_as(sel)[sel]
        for s, gs in enumerate(head.forward_train_unrolled(fin, tok, g, ttt_steps), start=2):
            keep = col >= s - 1  # rows with a full chain of s-1 drafted ancestors
            ls, a_s, n_s = step(gs[sel][keep], keep)
            loss = loss + ttt_weight * ls * denom / max(n_s, 1)
            stats[f"top1_step{s}"] = a_s / max(n_s, 1)
    return loss / denom, stats


@torch.no_grad()
def full_argmax(convs, lm_full, device, batch_tokens):
    """The target's full-vocabulary argmax at every position of each batch (computed once)."""
    out = []
    for batch in batches(convs, batch_tokens, False, random.Random(0)):
        _, _, fout, _ = collate(batch, device)
        out.append((fout @ lm_full.T).argmax(-1))
    return out


@torch.no_grad()
def evaluate(head, convs, device, batch_tokens, top1, steps: int = 2) -> dict:
    """Held-out loss and top-1 agreement, and the agreement of unrolled passes 2..steps reading
    the head's own predictions (what acceptance past the first drafted token depends on)."""
    tot, tot_n = {}, 0
    for batch, t1 in zip(batches(convs, batch_tokens, False, random.Random(0)), top1):
        _, st = head_loss(head, *collate(batch, device), 0.0, 0.1, train=False, top1_target=t1, ttt_steps=steps)
        n = st.pop("n")
        for k, v in st.items():
            tot[k] = tot.get(k, 0.0) + v * n
        tot_n += n
    out = {k: v / max(tot_n, 1) for k, v in tot.items()}
    return {"heldout_loss": out.pop("loss1"), "heldout_top1": out.pop("top1"),
            **{f"heldout_{k}": v for k, v in out.items()}}


def build_head(a, target, train_convs, device) -> tuple[EagleHead, bool]:
    """The head to train, from --init (random, the target's last layer, or a head folder to
    fine-tune, whose draft vocabulary is kept), on `device`; and whether it is a fine-tune."""
    args = target.args
    fine_tune = a.init not in ("random", "last-layer")  # --init names a head folder
    if fine_tune:
        if not (Path(a.init) / "config.json").exists():
            raise UserError(f"--init must be 'random', 'last-layer' or a head folder; {a.init} has no config.json.")
        head, _ = load_head(Path(a.init), args)
    else:
        draft_ids = choose_vocab(train_convs, a.draft_vocab, target.lm_head.weight.detach(), set(args.eos_ids))
        head = EagleHead(args, fc_bias=True, draft_vocab=draft_ids)
    if a.init == "last-layer":
        last = target.layers[-1].state_dict()
        head.layers[0].load_state_dict({k: v for k, v in last.items() if not k.startswith("input_layernorm")})
        with torch.no_grad():  # fc starts as "pass the feature through"
            head.fc.weight.zero_()
            head.fc.weight[:, args.dim:] = torch.eye(args.dim)
            head.fc.bias.zero_()
    head.embed_tokens.weight = torch.nn.Parameter(target.embed_tokens.weight.detach().clone(), requires_grad=False)
    head = head.to(device)
    head.attach(target.lm_head.weight.detach())
    return head, fine_tune


def train_epoch(a, head, train_convs, device, opt, sched, params, rng, steps_per_epoch,
                epoch) -> tuple[float, float, list[float]]:
    """One pass over the training batches; returns the running loss and top-1 agreement, and
    every step's loss."""
    head.train()
    run_loss = run_agree = 0.0
    losses = []
    bar = tqdm(batches(train_convs, a.batch_tokens, True, rng), total=steps_per_epoch,
               desc=f"epoch {epoch + 1}/{a.epochs}", unit="batch")
    for i, batch in enumerate(bar):
        loss, st = head_loss(head, *collate(batch, device), a.noise, a.ce_weight, ttt_steps=a.ttt_steps,
                             ttt_weight=a.ttt_weight)
        agree = st["top1"]
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 0.5)
        opt.step()
        sched.step()
        lv = float(loss.detach())
        losses.append(round(lv, 5))
        run_loss = 0.9 * run_loss + 0.1 * lv if i else lv
        run_agree = 0.9 * run_agree + 0.1 * agree if i else agree
        bar.set_postfix(loss=f"{run_loss:.3f}", top1=f"{run_agree:.3f}")
    return run_loss, run_agree, losses


def train_head(a, target, train_convs, held_convs, device) -> dict:
    out = Path(a.out)
    torch.manual_seed(a.seed)
    head, fine_tune = build_head(a, target, train_convs, device)
    lm_full = target.lm_head.weight.detach()
    params = [p for n, p in head.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = random.Random(a.seed)
    steps_per_epoch = sum(1 for _ in batches(train_convs, a.batch_tokens, True, random.Random(0)))
    total = steps_per_epoch * a.epochs
    warm = max(1, total // 50)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    ckpt = out / "checkpoint.pt"
    log = {"epochs": [], "steps_per_epoch": steps_per_epoch}
    start_epoch = 0
    if ckpt.exists():  # resume: tensors and plain containers only, loaded safely
        st = torch.load(str(ckpt), map_location=device, weights_only=True)
        head.load_state_dict(st["head"], strict=False)
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        start_epoch = int(st["epoch"]) + 1
        log = json.loads((out / "train_log.json").read_text())
        print(f"resuming after epoch {start_epoch}")
    held_top1 = full_argmax(held_convs, lm_full, device, a.batch_tokens)
    eval_steps = max(2, a.ttt_steps)
    if not log["epochs"] and fine_tune:  # the fine-tune's starting point
        head.eval()
        log["epochs"].append({"epoch": 0, "init": str(a.init), **evaluate(head, held_convs, device, a.batch_tokens,
                                                                         held_top1, eval_steps), "wall_s": 0.0})
        print(json.dumps(log["epochs"][-1]))
    t_start = time.time() - (log["epochs"][-1]["wall_s"] if log["epochs"] else 0.0)  # resumed runs keep counting
    for epoch in range(start_epoch, a.epochs):
        run_loss, run_agree, losses = train_epoch(a, head, train_convs, device, opt, sched, params, rng,
                                                  steps_per_epoch, epoch)
        log.setdefault("step_losses", []).extend(losses)
        head.eval()
        rec = {"epoch": epoch + 1, "train_loss": run_loss, "train_top1": run_agree,
               **evaluate(head, held_convs, device, a.batch_tokens, held_top1, eval_steps),
               "wall_s": time.time() - t_start}
        log["epochs"].append(rec)
        print(json.dumps(rec))
        (out / "train_log.json").write_text(json.dumps(log, indent=2))
        torch.save({"head": head.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(),
                    "epoch": epoch}, str(ckpt))
        save_head(head, out / "head")
    return log


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if not 1 <= a.ttt_steps <= 8:
        raise UserError(f"--ttt-steps must be in [1, 8] (got {a.ttt_steps}).")
    if a.ttt_weight < 0:
        raise UserError(f"--ttt-weight must be >= 0 (got {a.ttt_weight}).")
    apply_threads(a)
    dev = pick_device(a.device)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = set(a.stages.split(","))
    folder = target_folder(a.target)
    variants = []
    for v in a.variants.split(","):
        if v not in VARIANTS:
            raise UserError(f"Unknown variant {v!r}; known: {', '.join(VARIANTS)}.")
        variants.append(VARIANTS[v])
    train_prompts = [q for path in a.prompts.split(",") if path for q in read_prompts(Path(path))]
    ids = [q["question_id"] for q in train_prompts]
    if len(set(ids)) != len(ids):
        raise UserError("Two training prompts share a question_id; ids must be unique across --prompts files.")
    held_prompts = read_prompts(Path(a.heldout))
    if a.limit_prompts:
        train_prompts = train_prompts[: a.limit_prompts]
        held_prompts = held_prompts[: max(2, a.limit_prompts // 5)]
    overlap = {q["question_id"] for q in train_prompts} & {q["question_id"] for q in held_prompts}
    if overlap:
        raise UserError(f"Held-out prompts overlap the training prompts (ids {sorted(overlap)[:5]}).")
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(str(folder))
    dtype = torch.float32 if dev.type == "cpu" else torch.bfloat16
    target = load_target(folder, dev, dtype if stages & {"data", "features"} else torch.float32)
    if "data" in stages:
        generate_data(target, tok, train_prompts, out / "data_train.jsonl", variants, a.max_new_tokens,
                      a.gen_batch)
        generate_data(target, tok, held_prompts, out / "data_heldout.jsonl", [VARIANTS["greedy"]],
                      a.max_new_tokens, a.gen_batch)
    if "features" in stages:
        for split in ("train", "heldout"):
            extract_features(target, tok, out / f"data_{split}.jsonl", out / f"features_{split}", a.max_len)
    if "train" in stages:
        target = target.float()
        for p in target.parameters():
            p.requires_grad_(False)
        feats = Path(a.features) if a.features else out
        for split in ("train", "heldout"):
            if not (feats / f"features_{split}" / "index.json").exists():
                raise UserError(f"No {split} feature cache in {feats}: run the features stage first, or point "
                                f"--features at a run folder that has one.")
        train_convs = load_features(feats / "features_train")
        held_convs = load_features(feats / "features_heldout")
        print(f"training on {len(train_convs)} conversations "
              f"({sum(len(c['ids']) for c in train_convs)} tokens), held-out {len(held_convs)}")
        train_head(a, target, train_convs, held_convs, dev)
    return 0
