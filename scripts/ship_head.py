"""Ship a trained head: copy it into assets/ with a model card built from the runs that judged it.

    python scripts/ship_head.py HEAD DEST --eval EVAL --tau TAU [--bench BENCH] [--compare LABEL=EVAL,TAU ...]

HEAD: a training run's head folder (`<out>/head`: config.json, model.safetensors and the trainer's
card, README.md); its run's train_log.json (per-epoch figures) goes along. EVAL and TAU are as for
`scripts/head_table.py` and must be of this head: the evaluation's --init is HEAD, and the tau run
recorded the sha256 of HEAD's weights. The card is the trainer's, then the held-out table (this
head and any --compare rows), tau by category, and the commands: no figure is copied by hand.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(1, str(Path(__file__).resolve().parents[1]))
from head_table import COLUMNS, DYN, last_eval, row  # noqa: E402
from eagle2.model.weights import sha256_of  # noqa: E402
from viz.train_report import epoch_table  # noqa: E402


def check_of_this_head(head: Path, ev: dict, tau: dict) -> None:
    """Refuse figures measured on other weights."""
    init = ev.get("init")
    if init is None or Path(init).resolve() != head.resolve():
        raise SystemExit(f"the evaluation is of {init!r}, not {head}: run `python -m eagle2_train train --stages train "
                         f"--init {head} --epochs 0 --ttt-steps 3 ...` for it.")
    digest = sha256_of(head / "model.safetensors")
    if tau.get("head_sha256") != digest:
        raise SystemExit(f"the tau run is of weights with sha256 {tau.get('head_sha256')}, not {head}'s {digest}: "
                         f"run `python -m eagle2 tau --head {head} --out DIR` for it.")


def table(rows: list[list[str]]) -> str:
    return "\n".join(["| " + " | ".join(COLUMNS) + " |", "|" + " --- |" * len(COLUMNS)] +
                     ["| " + " | ".join(r) + " |" for r in rows])


def by_category(tau: dict) -> str:
    trees = tau["trees"]
    cats = sorted({c for t in trees.values() for c in t["by_category"]})
    lines = ["| tree | all | " + " | ".join(cats) + " |", "|" + " --- |" * (len(cats) + 2)]
    for label, t in trees.items():
        lines.append(f"| {label} | **{t['tau']:.2f}** | " +
                     " | ".join(f"{t['by_category'].get(c, float('nan')):.2f}" for c in cats) + " |")
    return "\n".join(lines)


def card(head: Path, ev: dict, tau: dict, bench: Path | None, compare: list[tuple[str, dict, dict]],
         trained: str = "") -> str:
    trainer = (head / "README.md").read_text() if (head / "README.md").exists() else "# Draft head"
    trainer = trainer.replace("Per-epoch figures: `train_log.json` in the run folder.", "").rstrip()
    path = head.parent / "train_log.json"
    log = json.loads(path.read_text()) if path.exists() else {}
    epochs = ""
    if log.get("epochs"):
        epochs = ("\n\n## Training, epoch by epoch\n\n" + (trained + "\n\n" if trained else "") +
                  epoch_table("this head", log))
    m = tau.get("machine", {})
    repo = str(Path(__file__).resolve().parents[1]) + "/"  # the card names no machine's folders
    command = tau["command"].replace(repo, "").replace(str(Path.home()), "~")
    rows = [row("this head", ev, tau, bench)] + [row(label, e, t, None) for label, e, t in compare]
    return f"""{trainer}{epochs}

## Judged on the {tau['n_prompts']} held-out prompts

Held-out top-1 agreement with the target at depths 1-3 (the head reading its own features at 2
and 3), and tau = new tokens per target forward, greedy, {tau['max_new_tokens']} new tokens per
turn, every tree's output identical ({'yes' if tau['identical'] else 'NO'}):

{table(rows)}

tau by prompt category:

{by_category(tau)}

Commands: `{command}` ({tau['seconds']:.0f} s, {tau['threads']} threads, {m.get('cpu', '?')}
family {m.get('family', '?')} model {m.get('model', '?')}, torch {m.get('torch', '?')}; tau does not
depend on the machine); the agreement: `python -m eagle2_train train --stages train --init HEAD --epochs 0
--ttt-steps 3 --features RUN` on the recipe's held-out cache (`scripts/head_recipe.py`, step `eval`).
Weights: `model.safetensors`, sha256 `{tau['head_sha256']}`. Per-epoch figures: `train_log.json`.
"""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(prog="scripts/ship_head.py", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("head", type=Path)
    ap.add_argument("dest", type=Path)
    ap.add_argument("--eval", type=Path, required=True)
    ap.add_argument("--tau", type=Path, required=True)
    ap.add_argument("--bench", type=Path, default=None)
    ap.add_argument("--compare", action="append", default=[], help="LABEL=EVAL,TAU: another head's row")
    ap.add_argument("--trained", default="", help="how the run was made: its command and machine (a sentence)")
    a = ap.parse_args(argv)
    for f in ("config.json", "model.safetensors"):
        if not (a.head / f).is_file():
            raise SystemExit(f"{a.head} holds no {f}: give a head folder (<out>/head of a training run).")
    ev, tau = last_eval(a.eval), json.loads((a.tau / "tau.json").read_text())
    check_of_this_head(a.head, ev, tau)
    compare = []
    for spec in a.compare:
        label, dirs = spec.split("=", 1)
        e, t = dirs.split(",")
        compare.append((label, last_eval(Path(e)), json.loads((Path(t) / "tau.json").read_text())))
    text = card(a.head, ev, tau, a.bench, compare, a.trained)  # before copying: a refused card leaves DEST as it was
    a.dest.mkdir(parents=True, exist_ok=True)
    for f in ("config.json", "model.safetensors"):
        shutil.copyfile(a.head / f, a.dest / f)
    if (a.head.parent / "train_log.json").exists():
        shutil.copyfile(a.head.parent / "train_log.json", a.dest / "train_log.json")
    (a.dest / "README.md").write_text(text)
    print(f"shipped {a.head} to {a.dest}: tau {DYN} {tau['trees'][DYN]['tau']:.2f}, "
          f"top-1 {ev['heldout_top1']:.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
