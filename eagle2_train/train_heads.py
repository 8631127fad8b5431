"""The head `python -m eagle2_train train` trains, by --head-kind: EAGLE-1/2 (`eagle`, head.py) or EAGLE-3
(`eagle3`, head3.py). What differs between the kinds lives here: the feature cache each reads, its
objective, how it is built (fresh, or fine-tuned from a folder of the same kind) and saved."""
from __future__ import annotations

from pathlib import Path

import torch
from tqdm import tqdm

from eagle2.errors import UserError
from eagle2.model.head import EagleHead, head_from_checkpoint, read_checkpoint, save_head
from eagle2.model.head3 import Eagle3Head, aux_layers_of, head3_from_checkpoint, is_eagle3, save_head3
from .train_loss import Objective

KINDS = {"eagle": "EAGLE-1/2", "eagle3": "EAGLE-3"}


def cache_name(kind: str, split: str) -> str:
    """The feature cache folder of a kind: EAGLE-3's holds more (the aux layers), so it is its own."""
    return f"{'features3' if kind == 'eagle3' else 'features'}_{split}"


def cache_for(feats: Path, kind: str, split: str) -> Path | None:
    """The cache a head of `kind` trains on: its own, or for EAGLE-1/2 an EAGLE-3 cache, which
    holds the final features too (so one pass of the target over the data serves both kinds)."""
    for k in (kind, "eagle3") if kind == "eagle" else (kind,):
        if (feats / cache_name(k, split) / "index.json").exists():
            return feats / cache_name(k, split)
    return None


def parse_aux_layers(spec: str | None, n_layers: int) -> tuple[int, ...]:
    """--aux-layers "2,15,27" (the target layers whose input states the head reads; n_layers = the
    last layer's output), or None for EAGLE-3's default (2, L//2, L-3)."""
    if spec is None:
        return aux_layers_of({}, n_layers)
    try:
        layers = tuple(int(x) for x in spec.split(",") if x.strip())
    except ValueError:
        raise UserError(f"--aux-layers takes comma-separated layer numbers (got {spec!r}).") from None
    # two or more: a one-layer fusion would be D wide, which the head reads as its own output
    if len(layers) < 2 or len(set(layers)) != len(layers) or not all(0 <= i <= n_layers for i in layers):
        raise UserError(f"--aux-layers must name 2 or more distinct layers in [0, {n_layers}] (got {spec!r}).")
    return tuple(sorted(layers))


def objective(a, ref_rows: torch.Tensor, evaluation: bool = False, input_scale=None) -> Objective:
    """The loss of --head-kind. Held-out losses use the kind's fixed weights (comparable across runs)."""
    if a.head_kind == "eagle3":  # tokens only, no feature noise (EAGLE-3)
        return Objective(ref_rows, inputs="aux", reg_weight=0.0, ce_weight=1.0, ttt_weight=a.ttt_weight,
                         input_scale=input_scale)
    return Objective(ref_rows, inputs="feat", reg_weight=1.0, ce_weight=0.1 if evaluation else a.ce_weight,
                     noise=0.0 if evaluation else a.noise, ttt_weight=a.ttt_weight)


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


def _from_folder(a, args, aux_layers):
    """The head in --init, checked to be of --head-kind (and, EAGLE-3, to read the cache's layers);
    returns (head, its own LM head or None)."""
    folder = Path(a.init)
    if not (folder / "config.json").exists():
        raise UserError(f"--init must be 'random', 'last-layer' or a head folder; {a.init} has no config.json.")
    cfg, state = read_checkpoint(folder)
    found = "eagle3" if is_eagle3(cfg, state) else "eagle"
    if found != a.head_kind:
        raise UserError(f"--init {folder} holds an {KINDS[found]} head, but --head-kind is {a.head_kind} "
                        f"({KINDS[a.head_kind]}): pass --head-kind {found} to fine-tune it.")
    if found == "eagle":
        return head_from_checkpoint(folder, cfg, state, args)[0], None
    head, own_lm = head3_from_checkpoint(folder, cfg, state, args)
    if head.aux_layers != tuple(aux_layers):
        raise UserError(f"--init {folder} reads the target layers {list(head.aux_layers)}; the feature cache "
                        f"holds {list(aux_layers)}: extract features with --aux-layers "
                        f"{','.join(map(str, head.aux_layers))}.")
    return head, own_lm


def build_head(a, target, train_convs, device, aux_layers=()) -> tuple[torch.nn.Module, bool]:
    """The head to train, from --init (random, the target's last layer, or a head folder of the same
    kind to fine-tune, whose draft vocabulary is kept), on `device`; and whether it is a fine-tune.
    The embedding is the target's, frozen; an EAGLE-3 head's LM head is trained, starting from the
    target's draft-vocabulary rows (or the folder's own)."""
    args = target.args
    eagle3 = a.head_kind == "eagle3"
    fine_tune = a.init not in ("random", "last-layer")  # --init names a head folder
    own_lm = None
    if fine_tune:
        head, own_lm = _from_folder(a, args, aux_layers)
    elif eagle3 and a.init == "last-layer":
        raise UserError("--init last-layer is for EAGLE-1/2 heads (an EAGLE-3 layer reads 2 x hidden wide).")
    else:
        draft_ids = choose_vocab(train_convs, a.draft_vocab, target.lm_head.weight.detach(), set(args.eos_ids))
        head = (Eagle3Head(args, aux_layers, draft_vocab=draft_ids) if eagle3
                else EagleHead(args, fc_bias=True, draft_vocab=draft_ids))
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
    if eagle3:
        head.trainable_lm_head(head.lm_weight if own_lm is None else own_lm.to(device, head.fc.weight.dtype))
        if a.input_scale:
            scale_fc_inputs(head, train_convs, fresh=not fine_tune)
    return head, fine_tune


@torch.no_grad()
def input_rms(convs: list[dict], sample: int = 64) -> torch.Tensor:
    """Per-channel root mean square of the aux states over (up to) `sample` conversations spread
    over the data (deterministic)."""
    step = max(1, len(convs) // sample)
    return torch.cat([c["aux"].float() for c in convs[::step][:sample]]).pow(2).mean(0).sqrt()


@torch.no_grad()
def scale_fc_inputs(head, convs: list[dict], fresh: bool) -> None:
    """`--input-scale 1`: train EAGLE-3's fc on inputs of unit scale per channel (SmolLM2's residual
    stream carries a few "attention sink" channels near 2e4 beside channels near 1). Training reads
    a * scale (scale = 1 / the channel's RMS, fixed; head_loss applies it) and `save` stores
    fc.weight * scale, the official layout's weight for raw states; a fine-tuned fc starts as
    weight / scale, the same function. Measured no gain (docs/algorithms.md), hence off by default."""
    rms = input_rms(convs).to(head.fc.weight.device, head.fc.weight.dtype)
    head.input_scale = 1.0 / rms.clamp(min=1e-2)
    if not fresh:
        head.fc.weight.div_(head.input_scale)


def model_card(a, head, log: dict, n_convs: int, n_tokens: int) -> str:
    """README.md of a trained head: what it is, its data, recipe and latest held-out figures."""
    kind = KINDS[a.head_kind]
    V = head.args.vocab_size if head.draft_ids is None else head.draft_ids.numel()
    last = log["epochs"][-1] if log["epochs"] else {}
    if a.head_kind == "eagle3":
        layout = (f"official EAGLE-3 layout (`LlamaForCausalLMEagle3`: fc over the target layers "
                  f"{list(head.aux_layers)}, midlayer, norm, its own trained `lm_head`, `d2t`/`t2d`)")
        loss = "cross-entropy against the target's distribution on the draft vocabulary (tokens only)"
    else:
        layout = "official EAGLE-1/2 layout (fc, one decoder layer; the target's LM head)"
        loss = f"SmoothL1(feature) + {a.ce_weight} x cross-entropy, input noise +-{a.noise}"
    figures = ", ".join(f"{k.removeprefix('heldout_')} {v:.3f}" for k, v in last.items()
                        if k.startswith("heldout_"))
    return (f"# {kind} draft head for {a.target}\n\n"
            f"Trained by `python -m eagle2_train train --head-kind {a.head_kind}`; {layout}. The embedding is the "
            f"target's (frozen, not stored); draft vocabulary of {V:,} target tokens; weights in fp16.\n\n"
            f"| | |\n| --- | --- |\n"
            f"| data | {n_convs:,} self-distilled conversations, {n_tokens:,} tokens |\n"
            f"| recipe | {loss}; training-time test {a.ttt_steps} step(s) (weight {a.ttt_weight}); AdamW lr "
            f"{a.lr}, warm-up + cosine, {a.batch_tokens} padded tokens per batch; "
            f"{getattr(a, 'amp_used', 'fp32')} forward; init {a.init} |\n"
            f"| epochs | {last.get('epoch', 0)} of {a.epochs} |\n"
            f"| held-out (latest epoch) | {figures or 'n/a'} |\n\n"
            "Per-epoch figures: `train_log.json` in the run folder.\n")


def save(a, head, folder: Path, card: str) -> None:
    scale = getattr(head, "input_scale", None)
    if scale is None:
        (save_head3 if a.head_kind == "eagle3" else save_head)(head, folder, card)
        return
    with torch.no_grad():  # store the weight for raw states, then put the trained one back bit for bit
        trained = head.fc.weight.detach().clone()
        head.fc.weight.mul_(scale)
        try:
            save_head3(head, folder, card)
        finally:
            head.fc.weight.copy_(trained)
