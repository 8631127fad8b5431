"""The training run's resume point: `<out>/checkpoint.pt`, written atomically after every epoch and
every --save-minutes within one.

It holds everything the next step depends on (head, optimizer, schedule, both random generators,
the early-stopping record; within an epoch also the batch order's seed state, the steps done and
the running figures) and the settings that shape the run, so a run stopped anywhere (a kill
mid-epoch, a wiped machine whose caches were regenerated) continues exactly where the last save
left it, or refuses with the flag that differs. Loaded with weights_only=True: tensors and plain
containers only."""
from __future__ import annotations

import random
from pathlib import Path

import torch

from eagle2.errors import UserError
from eagle2.files import atomic_path

# the flags whose change would make a resumed run a different run (the schedule's length, the
# batches, the loss); --epochs is one: the cosine schedule spans them
SHAPING = ("head_kind", "epochs", "lr", "batch_tokens", "noise", "ce_weight", "draft_vocab", "init", "ttt_steps",
           "ttt_weight", "seed", "patience", "input_scale", "amp", "train_limit")
# what a checkpoint saved before a setting existed was trained with (the setting's default)
SHAPING_BEFORE = {"train_limit": 0}


def settings(a) -> dict:
    return {k: getattr(a, k) for k in SHAPING}


def save(path: Path, *, head, opt, sched, epoch: int, rng: random.Random, a, best: dict,
         in_epoch: dict | None = None) -> None:
    """`epoch`: the last finished epoch (0-based; -1 = none). `in_epoch`, saved within an epoch:
    {"epoch", "step" (batches done), "rng" (the epoch's starting state of `rng`, which orders its
    batches), "run_loss", "run_agree", "losses", "wall_s"}."""
    state = {"head": head.state_dict(), "opt": opt.state_dict(), "sched": sched.state_dict(), "epoch": epoch,
             "kind": a.head_kind, "settings": settings(a), "rng": list(_flatten(rng.getstate())),
             "torch_rng": torch.get_rng_state(), "best": best}
    if in_epoch is not None:
        state["in_epoch"] = {**in_epoch, "rng": list(_flatten(in_epoch["rng"]))}
    with atomic_path(path) as tmp:  # a kill while saving leaves the previous epoch's file
        torch.save(state, str(tmp))


def load(path: Path, device, a) -> dict:
    """The checkpoint's state, checked against this run's settings."""
    try:
        st = torch.load(str(path), map_location=device, weights_only=True)
    except Exception as e:  # a truncated or foreign file: say so rather than fail deep in torch
        raise UserError(f"{path} is not a readable training checkpoint ({type(e).__name__}): delete it to "
                        f"start the run over.") from None
    kind = st.get("kind", "eagle")
    if kind != a.head_kind:
        from .train_heads import KINDS
        raise UserError(f"{path} resumes an {KINDS[kind]} head, not {KINDS[a.head_kind]}: use another --out or "
                        f"the same --head-kind.")
    was = st.get("settings")
    if was is not None:
        now = settings(a)
        diff = [f"--{k.replace('_', '-')} {was.get(k, SHAPING_BEFORE.get(k))!r} (now {now[k]!r})" for k in SHAPING
                if was.get(k, SHAPING_BEFORE.get(k)) != now[k]]
        if diff:
            raise UserError(f"{path} was trained with {', '.join(diff)}: resume with the same flags, or fine-tune "
                            f"its head into another --out with --init.")
    return st


def restore_rngs(st: dict, rng: random.Random) -> None:
    """`rng` as the resumed step needs it: at the in-progress epoch's start (its batches are drawn
    again, the done ones skipped), else after the last finished epoch."""
    flat = st["in_epoch"]["rng"] if "in_epoch" in st else st.get("rng")
    if flat is not None:
        rng.setstate(_unflatten(flat))
    if "torch_rng" in st:
        torch.set_rng_state(st["torch_rng"].cpu())


def _flatten(state) -> list[int]:
    """random.Random's state (version, 625 ints, gauss_next) as a flat list torch.load accepts."""
    version, internal, gauss = state
    return [version, *internal, -1 if gauss is None else 0]


def _unflatten(flat: list[int]):
    return int(flat[0]), tuple(int(x) for x in flat[1:-1]), None
