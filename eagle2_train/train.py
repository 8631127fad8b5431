"""`python -m eagle2_train train`: train an EAGLE draft head for any supported target.

Stages (each resumable, outputs under --out): data (self-distillation), features (fp16 cache),
train (AdamW, grad clip, cosine schedule, optional training-time test, held-out top-1 agreement
every epoch). --head-kind eagle (default): an EAGLE-1/2 head, SmoothL1 feature regression + 0.1 x
cross-entropy against the target's distribution, uniform input-feature noise. --head-kind eagle3:
an EAGLE-3 head over the target's low/middle/high layers (--aux-layers; their own cache,
features3_*), cross-entropy only, its LM head trained too. The head is saved in the official layout
of its kind, with a reduced draft vocabulary (the N most frequent target tokens of the training
data) recorded as `d2t` when --draft-vocab > 0, and a model card.
"""
from __future__ import annotations

import argparse
import functools
import itertools
import json
import math
import random
import time
from pathlib import Path

import torch
from tqdm import tqdm

from eagle2.errors import UserError
from eagle2.files import atomic_write
from eagle2.model.llama import pack_linears
from eagle2.model.loading import load_target, pick_device
from eagle2.model.weights import ASSETS, hub_download, resolve_target
from eagle2.tools.flags import add_model_args, apply_threads
from eagle2.tools.prompt_files import read_prompts

from . import checkpoint
from .selfdistill import extract_features, generate_data, load_features
from .train_heads import KINDS, build_head, cache_for, cache_name, model_card, objective, parse_aux_layers, save
from .train_loss import Objective, collate, head_loss, loss_core

VARIANTS = {"greedy": {"name": "greedy", "temperature": 0.0},
            "t0.7": {"name": "t0.7", "temperature": 0.7, "top_p": 0.95},
            "t1.0": {"name": "t1.0", "temperature": 1.0, "top_p": 1.0}}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m eagle2_train train", description=__doc__)
    add_model_args(ap, head=False, dtype=False)
    ap.add_argument("--out", required=True, help="run folder (data, features, checkpoints, head/)")
    ap.add_argument("--prompts", default=",".join(sorted(str(f) for f in (ASSETS / "prompts").glob("train*.jsonl"))),
                    help="comma-separated MT-bench-style prompt files (default: every assets/prompts/train*.jsonl: "
                         "hand-written, templated, self-instruct and the PyPI sets; assets/prompts/README.md)")
    ap.add_argument("--heldout", default=str(ASSETS / "prompts" / "heldout.jsonl"))
    ap.add_argument("--stages", default="data,features,train")
    ap.add_argument("--features", default=None,
                    help="run folder whose feature cache the train stage reads (default: --out), e.g. to "
                         "fine-tune into a fresh folder")
    ap.add_argument("--head-kind", default="eagle", choices=tuple(KINDS),
                    help="eagle: an EAGLE-1/2 head (the target's final features; cache features_*); eagle3: an "
                         "EAGLE-3 head (the target's low/middle/high layers; cache features3_*)")
    ap.add_argument("--aux-layers", default=None,
                    help="eagle3: the target layers whose input hidden states the head reads, e.g. 2,15,27 "
                         "(L = the last layer's output; default (2, L//2, L-3), as official EAGLE-3)")
    ap.add_argument("--variants", default="greedy,t0.7", help=f"self-distillation decodings: {','.join(VARIANTS)}")
    ap.add_argument("--limit-prompts", type=int, default=0, help="use only the first K prompts (0 = all)")
    ap.add_argument("--train-limit", type=int, default=0,
                    help="train on the first N conversations of the feature cache (0 = all): a point of a "
                         "data-scaling curve, from a cache whose conversations were shuffled before extraction")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--gen-batch", type=int, default=48)
    ap.add_argument("--gen-dtype", default="auto", choices=("auto", "bf16", "fp32"),
                    help="the data stage's target (its answers only; features are always computed in fp32 on the "
                         "CPU): auto = bf16 where the device computes it natively (measured 1.85x the tokens/s "
                         "of fp32 on an AMX CPU), else fp32")
    ap.add_argument("--max-len", type=int, default=1024, help="truncate conversations to this many tokens")
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=1e-3)
    ap.add_argument("--batch-tokens", type=int, default=4096)
    ap.add_argument("--noise", type=float, default=0.2, help="uniform input-feature noise half-width (eagle)")
    ap.add_argument("--ce-weight", type=float, default=0.1, help="cross-entropy weight (eagle; eagle3 is CE only)")
    ap.add_argument("--draft-vocab", type=int, default=8192, help="0 = full target vocabulary")
    ap.add_argument("--init", default="random",
                    help="'random' (default), 'last-layer' (eagle: the target's last layer; measured worse on "
                         "SmolLM2: its large output scale dominates the first epochs), or a head folder of "
                         "--head-kind to fine-tune (its draft vocabulary is kept)")
    ap.add_argument("--ttt-steps", type=int, default=1,
                    help="training-time test: also train S-1 unrolled passes in which the head reads its own "
                         "outputs, as draft nodes of depth 2..S do (1 = off; S costs about S x)")
    ap.add_argument("--input-scale", type=int, default=0, choices=(0, 1),
                    help="eagle3: 1 = train fc on aux states scaled to unit RMS per channel (folded into the saved "
                         "fc.weight); measured no gain on SmolLM2 (docs/algorithms.md), so 0 = raw states")
    ap.add_argument("--ttt-weight", type=float, default=1.0, help="loss weight of each unrolled pass")
    ap.add_argument("--patience", type=int, default=2,
                    help="stop when the held-out loss has not improved for this many epochs (0 = run all "
                         "--epochs); <out>/head is always the best epoch's head")
    ap.add_argument("--amp", default="auto", choices=("auto", "bf16", "off"),
                    help="the training step's forward under bf16 autocast (weights, optimizer and held-out "
                         "figures stay fp32); auto = bf16 where the device computes it natively (CUDA, a CPU "
                         "with AVX512-BF16 or AMX; measured 1.5x per step there, same held-out loss), else off")
    ap.add_argument("--save-minutes", type=float, default=10.0,
                    help="also save the resume point within an epoch this often (0 = at epoch ends only): a "
                         "stopped run loses at most this much training")
    ap.add_argument("--compile", action="store_true",
                    help="run the training step's forward and loss through torch.compile (inductor; one to two "
                         "minutes of compiling at the start): same loss to float rounding, measured 1.4x "
                         "the tokens/s of the eager step under bf16 autocast, 1.1x in fp32, on a 2-core CPU "
                         "(benchmarks/README.md, train-compile)")
    ap.add_argument("--seed", type=int, default=0)
    return ap


def target_folder(target: str) -> Path:
    where = resolve_target(target)
    return where if isinstance(where, Path) else hub_download(where, ["config.json", "*.safetensors", "tokenizer*",
                                                                      "*.jinja", "special_tokens_map.json"])


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


@torch.no_grad()
def full_argmax(convs, lm_full, device, batch_tokens):
    """The target's full-vocabulary argmax at every position of each batch (computed once)."""
    out = []
    for batch in batches(convs, batch_tokens, False, random.Random(0)):
        _, _, fout, _ = collate(batch, device)
        out.append((fout @ lm_full.T).argmax(-1))
    return out


@torch.no_grad()
def evaluate(head, convs, device, batch_tokens, top1, obj: Objective, steps: int = 2) -> dict:
    """Held-out loss and top-1 agreement, and the agreement of unrolled passes 2..steps reading
    the head's own predictions (what acceptance past the first drafted token depends on)."""
    tot, tot_n = {}, 0
    for batch, t1 in zip(batches(convs, batch_tokens, False, random.Random(0)), top1):
        _, st = head_loss(head, *collate(batch, device, obj.inputs), obj, train=False, top1_target=t1,
                          ttt_steps=steps)
        n = st.pop("n")
        for k, v in st.items():
            tot[k] = tot.get(k, 0.0) + v * n
        tot_n += n
    out = {k: v / max(tot_n, 1) for k, v in tot.items()}
    return {"heldout_loss": out.pop("loss1"), "heldout_top1": out.pop("top1"),
            **{f"heldout_{k}": v for k, v in out.items()}}


def amp_dtype(amp: str, device: torch.device) -> torch.dtype | None:
    """--amp resolved on `device`: torch.bfloat16, or None (fp32)."""
    if amp == "off":
        return None
    if amp == "bf16":
        return torch.bfloat16
    if device.type == "cuda":
        return torch.bfloat16 if torch.cuda.is_bf16_supported() else None
    try:  # without native bf16 a CPU emulates it, slower than fp32
        native = bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    except (AttributeError, RuntimeError):
        native = False
    return torch.bfloat16 if native else None


@functools.cache
def compiled_core():
    """loss_core through torch.compile, built once per process: batch shapes vary, so dynamic
    shapes (a handful of graphs: the first few batches compile, the rest reuse them)."""
    import torch._dynamo
    torch._dynamo.config.cache_size_limit = max(torch._dynamo.config.cache_size_limit, 32)
    return torch.compile(loss_core, dynamic=True)


def train_step(head, batch, obj: Objective, opt, params, ttt_steps: int, device, amp=None, core=None):
    """One optimizer step on one batch (the forward under bf16 autocast when `amp`, through `core`
    when given); returns head_loss's (loss, stats). The schedule is the caller's."""
    with torch.autocast(device.type, dtype=amp or torch.float32, enabled=amp is not None):
        loss, st = head_loss(head, *collate(batch, device, obj.inputs), obj, ttt_steps=ttt_steps, core=core)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, 0.5)
    opt.step()
    return loss, st


def train_epoch(a, head, train_convs, device, opt, sched, params, rng, steps_per_epoch, epoch,
                obj: Objective, resume: dict | None = None, save_point=None) -> tuple[float, float, list[float]]:
    """One pass over the training batches; returns the running loss and top-1 agreement, and
    every step's loss. `resume` (a checkpoint's in-epoch record) skips the batches it had done and
    continues its running figures; `save_point(record)` is called every --save-minutes."""
    head.train()
    start = dict(resume or {})
    done = int(start.get("step", 0))
    epoch_rng = rng.getstate()  # before the shuffles: what orders this epoch's batches
    run_loss, run_agree = float(start.get("run_loss", 0.0)), float(start.get("run_agree", 0.0))
    losses = list(start.get("losses", []))
    bar = tqdm(itertools.islice(batches(train_convs, a.batch_tokens, True, rng), done, None),
               total=steps_per_epoch, initial=done, desc=f"epoch {epoch + 1}/{a.epochs}", unit="batch")
    last_save = time.time()
    amp = amp_dtype(a.amp, device)
    core = compiled_core() if a.compile else None
    for i, batch in enumerate(bar, start=done):
        loss, st = train_step(head, batch, obj, opt, params, a.ttt_steps, device, amp, core)
        agree = st["top1"]
        sched.step()
        lv = float(loss.detach())
        losses.append(round(lv, 5))
        run_loss = 0.9 * run_loss + 0.1 * lv if i else lv
        run_agree = 0.9 * run_agree + 0.1 * agree if i else agree
        bar.set_postfix(loss=f"{run_loss:.3f}", top1=f"{run_agree:.3f}")
        if (save_point is not None and a.save_minutes > 0 and i + 1 < steps_per_epoch
                and time.time() - last_save >= 60 * a.save_minutes):
            save_point({"epoch": epoch, "step": i + 1, "rng": epoch_rng, "run_loss": run_loss,
                        "run_agree": run_agree, "losses": losses})
            last_save = time.time()
    return run_loss, run_agree, losses


def train_head(a, target, train_convs, held_convs, device, aux_layers: tuple[int, ...] = ()) -> dict:
    """Train a head of --head-kind (EAGLE-3: reading `aux_layers`) on the loaded feature caches,
    resuming from <out>/checkpoint.pt; saves <out>/head and train_log.json after every epoch."""
    out = Path(a.out)
    torch.manual_seed(a.seed)
    a.amp_used = "bf16 autocast" if amp_dtype(a.amp, device) else "fp32"  # for the model card
    head, fine_tune = build_head(a, target, train_convs, device, aux_layers)
    lm_full = target.lm_head.weight.detach()
    ref = lm_full if head.draft_ids is None else lm_full[head.draft_ids]  # p: the target's own rows, frozen
    scale = getattr(head, "input_scale", None)
    obj, eval_obj = objective(a, ref, input_scale=scale), objective(a, ref, evaluation=True, input_scale=scale)
    n_tokens = sum(len(c["ids"]) for c in train_convs)
    params = [p for n, p in head.named_parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=a.lr, betas=(0.9, 0.95), weight_decay=0.0)
    rng = random.Random(a.seed)
    steps_per_epoch = sum(1 for _ in batches(train_convs, a.batch_tokens, True, random.Random(0)))
    total = max(1, steps_per_epoch * a.epochs)  # --epochs 0: evaluate an --init head only
    warm = max(1, total // 50)
    sched = torch.optim.lr_scheduler.LambdaLR(
        opt, lambda s: min(1.0, (s + 1) / warm) * 0.5 * (1 + math.cos(math.pi * min(1.0, s / total))))
    ckpt = out / "checkpoint.pt"
    log = {"epochs": [], "steps_per_epoch": steps_per_epoch}
    start_epoch = 0
    best = {"loss": float("inf"), "epoch": 0, "stale": 0}  # early stopping on the held-out loss
    in_epoch = None  # a resume point within an epoch
    resumed = ckpt.exists()
    if resumed:  # the resume point: the last save, at an epoch's end or within one
        st = checkpoint.load(ckpt, device, a)
        head.load_state_dict(st["head"], strict=False)
        opt.load_state_dict(st["opt"])
        sched.load_state_dict(st["sched"])
        checkpoint.restore_rngs(st, rng)
        best = st.get("best", best)
        in_epoch = st.get("in_epoch")
        start_epoch = int(st["epoch"]) + 1 if in_epoch is None else int(in_epoch["epoch"])
        if (out / "train_log.json").exists():  # absent while the first epoch of a fresh head runs
            log = json.loads((out / "train_log.json").read_text())
        # a kill between writing the log and the checkpoint leaves the log an epoch ahead: cut it back
        log["epochs"] = [e for e in log["epochs"] if e["epoch"] <= start_epoch]
        log["step_losses"] = log.get("step_losses", [])[: start_epoch * steps_per_epoch]
        print(f"resuming after epoch {start_epoch}" if in_epoch is None else
              f"resuming epoch {start_epoch + 1} after step {in_epoch['step']} of {steps_per_epoch}")
    held_top1 = full_argmax(held_convs, lm_full, device, a.batch_tokens)
    eval_steps = max(2, a.ttt_steps)
    if not log["epochs"] and fine_tune and not resumed:  # the fine-tune's starting point
        head.eval()
        log["epochs"].append({"epoch": 0, "init": str(a.init), **evaluate(head, held_convs, device, a.batch_tokens,
                                                                         held_top1, eval_obj, eval_steps),
                              "wall_s": 0.0})
        print(json.dumps(log["epochs"][-1]))
        # the starting head is the best so far: a fine-tune that only makes it worse keeps it in <out>/head
        best = {"loss": log["epochs"][-1]["heldout_loss"], "epoch": 0, "stale": 0}
        if a.epochs:
            save(a, head, out / "head", model_card(a, head, log, len(train_convs), n_tokens))
        atomic_write(out / "train_log.json", json.dumps(log, indent=2))  # --epochs 0 evaluates a head and stops
    done_s = in_epoch["wall_s"] if in_epoch else log["epochs"][-1]["wall_s"] if log["epochs"] else 0.0
    t_start = time.time() - done_s  # resumed runs keep counting

    def save_point(rec: dict) -> None:  # within an epoch
        checkpoint.save(ckpt, head=head, opt=opt, sched=sched, epoch=rec["epoch"] - 1, rng=rng, a=a, best=best,
                        in_epoch={**rec, "wall_s": time.time() - t_start})

    for epoch in range(start_epoch, a.epochs):
        if a.patience and best["stale"] >= a.patience:
            break  # a resumed run that had already stopped
        run_loss, run_agree, losses = train_epoch(a, head, train_convs, device, opt, sched, params, rng,
                                                  steps_per_epoch, epoch, obj, in_epoch, save_point)
        in_epoch = None
        head.eval()
        rec = {"epoch": epoch + 1, "train_loss": run_loss, "train_top1": run_agree,
               **evaluate(head, held_convs, device, a.batch_tokens, held_top1, eval_obj, eval_steps),
               "wall_s": time.time() - t_start}
        improved = rec["heldout_loss"] < best["loss"]
        best = ({"loss": rec["heldout_loss"], "epoch": epoch + 1, "stale": 0} if improved
                else {**best, "stale": best["stale"] + 1})
        rec["best_epoch"] = best["epoch"]
        log["epochs"].append(rec)
        log.setdefault("step_losses", []).extend(losses)
        print(json.dumps(rec))
        if improved:  # <out>/head is the best epoch's head (held-out loss), not merely the last
            save(a, head, out / "head", model_card(a, head, log, len(train_convs), n_tokens))
        # the log, then the checkpoint: a kill between them redoes this epoch (the log is cut back)
        atomic_write(out / "train_log.json", json.dumps(log, indent=2))
        checkpoint.save(ckpt, head=head, opt=opt, sched=sched, epoch=epoch, rng=rng, a=a, best=best)
        if a.patience and best["stale"] >= a.patience:
            print(f"held-out loss has not improved for {a.patience} epochs: stopping (best epoch {best['epoch']})")
            break
    return log


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if not 1 <= a.ttt_steps <= 8:
        raise UserError(f"--ttt-steps must be in [1, 8] (got {a.ttt_steps}).")
    if a.epochs < 0:
        raise UserError(f"--epochs must be >= 0 (0 with --init evaluates that head; got {a.epochs}).")
    if a.epochs == 0 and a.init in ("random", "last-layer"):
        raise UserError("--epochs 0 evaluates the head folder given with --init; without one there is nothing to do.")
    if a.patience < 0:
        raise UserError(f"--patience must be >= 0 (got {a.patience}).")
    if a.save_minutes < 0:
        raise UserError(f"--save-minutes must be >= 0 (0 = save at epoch ends only; got {a.save_minutes}).")
    if a.ttt_weight < 0:
        raise UserError(f"--ttt-weight must be >= 0 (got {a.ttt_weight}).")
    if a.aux_layers is not None and a.head_kind != "eagle3":
        raise UserError("--aux-layers is for --head-kind eagle3.")
    apply_threads(a)
    dev = pick_device(a.device)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)
    stages = set(a.stages.split(","))
    if not stages or stages - {"data", "features", "train"}:
        raise UserError(f"--stages is a comma list of data, features and train (got {a.stages!r}).")
    if a.train_limit < 0:
        raise UserError(f"--train-limit is a number of conversations, 0 for all (got {a.train_limit}).")
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
    if "data" in stages:
        native = amp_dtype("auto", dev) or dtype
        gen_dtype = {"fp32": torch.float32, "bf16": torch.bfloat16, "auto": native}[a.gen_dtype]
        target = load_target(folder, dev, gen_dtype)
        pack_linears(target)  # oneDNN-packed weights, ~1.6x faster batched matmuls on the CPU (a no-op elsewhere)
        # the held-out answers first: small, and what every head is judged on while the rest runs
        for split, prompts, vs in (("heldout", held_prompts, [VARIANTS["greedy"]]), ("train", train_prompts, variants)):
            rate = generate_data(target, tok, prompts, out / f"data_{split}.jsonl", vs, a.max_new_tokens, a.gen_batch)
            if rate["tokens"]:
                print(f"self-distillation ({split}): {rate['tokens']} tokens in {rate['seconds']:.0f} s = "
                      f"{rate['tokens_per_s']:.0f} tokens/s (batch {a.gen_batch}, {torch.get_num_threads()} threads, "
                      f"{str(gen_dtype).removeprefix('torch.')})")
                with open(out / "data_rate.jsonl", "a") as f:
                    f.write(json.dumps({"split": split, "batch": a.gen_batch, "threads": torch.get_num_threads(),
                                        "dtype": str(gen_dtype).removeprefix("torch."), **rate}) + "\n")
    if not stages & {"features", "train"}:
        return 0
    target = load_target(folder, dev, dtype if "features" in stages else torch.float32)
    aux = parse_aux_layers(a.aux_layers, target.args.n_layers) if a.head_kind == "eagle3" else ()
    if "features" in stages:
        pack_linears(target)
        target.aux_layers = aux  # EAGLE-3: the cache also holds these layers' input states
        for split in ("train", "heldout"):
            extract_features(target, tok, out / f"data_{split}.jsonl", out / cache_name(a.head_kind, split),
                             a.max_len)
        target.aux_layers = ()
    if "train" in stages:
        target = target.float()
        for p in target.parameters():
            p.requires_grad_(False)
        feats = Path(a.features) if a.features else out
        caches = {split: cache_for(feats, a.head_kind, split) for split in ("train", "heldout")}
        for split in ("train", "heldout"):
            if caches[split] is None:
                raise UserError(f"No {split} feature cache for --head-kind {a.head_kind} in {feats} "
                                f"({cache_name(a.head_kind, split)}): run the features stage first, or point "
                                f"--features at a run folder that has one.")
        if a.head_kind == "eagle3":  # the layers the cache holds; a different --aux-layers needs its own cache
            index = json.loads((caches["train"] / "index.json").read_text())
            cached = tuple(index.get("aux_layers", ()))
            if a.aux_layers is not None and aux != cached:
                raise UserError(f"The feature cache in {feats} holds the target layers {list(cached)}, not "
                                f"{list(aux)}: extract features with that --aux-layers into another --out.")
            aux = cached
        aux_too = a.head_kind == "eagle3"  # an EAGLE-1/2 head reading an EAGLE-3 cache leaves its layers on disk
        train_convs = load_features(caches["train"], aux_too)
        if a.train_limit:
            if a.train_limit > len(train_convs):
                raise UserError(f"--train-limit {a.train_limit}: the cache in {feats} holds only "
                                f"{len(train_convs)} training conversations.")
            train_convs = train_convs[: a.train_limit]
        held_convs = load_features(caches["heldout"], aux_too)
        print(f"{caches['train'].name}: training on {len(train_convs)} conversations "
              f"({sum(len(c['ids']) for c in train_convs)} tokens), held-out {len(held_convs)}")
        train_head(a, target, train_convs, held_convs, dev, aux)
    return 0
