"""The draft-head recipe, end to end, from the repository alone: every step resumes where it
stopped (each command skips finished work), so the same command continues after a kill or on a
machine whose ~/.cache was wiped (then the data and features are regenerated, deterministically).

    python scripts/head_recipe.py                  # run (or continue) every step
    python scripts/head_recipe.py --steps data     # some steps only (comma list)
    python scripts/head_recipe.py --dry-run        # print the commands
    python scripts/head_recipe.py --status         # how far each step got (reads files, runs nothing)

Steps: prompts (the self-instruct blocks up to 8,000 jobs), restore (the answers kept in
assets/selfdistill/, sha256-checked), data (the target's greedy answers to every
assets/prompts/train*.jsonl prompt, and to the 60 held-out ones, for those still missing), archive
(the answers back into assets/selfdistill/: commit them, and a wiped machine skips the data
step), features (one target pass
writing the EAGLE-3 cache, which also holds the final features the EAGLE-1/2 head reads), e3 and
e12 (the two kinds on the same data, stopped by held-out loss: EAGLE-3 from random init, EAGLE-1/2
fine-tuning the shipped head), eval (held-out
agreement at depths 1-3 of each head and of the shipped one), tau (tau over the 60 held-out
prompts), table (scripts/head_table.py), curves (viz/train_report.py: both heads' training curves,
beside the run folder, and their per-epoch tables).
"""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from eagle2.model.weights import sha256_of  # noqa: E402  (stdlib only at import)
SHIPPED = "assets/heads/smollm2-135m"
HEAD_RUN = ["--stages", "train", "--ttt-steps", "3", "--patience", "2", "--batch-tokens", "2048", "--compile"]
TRAIN = [*HEAD_RUN, "--epochs", "12", "--draft-vocab", "8192"]
# The EAGLE-1/2 head of the comparison fine-tunes the shipped one (its vocabulary kept) at its
# stages' lr: a warm start gives that kind its best head within an evening of CPU, so EAGLE-3's
# lead over it is not a matter of compute (12 epochs from random init are ~3 h on 2 cores).
FINE_TUNE = ["--init", SHIPPED, "--lr", "3e-4", *HEAD_RUN, "--epochs", "4"]


def steps(run: Path, out: Path, threads: str) -> dict[str, list[list[str]]]:
    py = [sys.executable, "-m", "eagle2"]
    train = [sys.executable, "-m", "eagle2_train", "train"]  # the training package's own entry point
    t = ["--threads", threads]
    heads = {"e3": (run.with_name(run.name + "-e3") / "head", "eagle3"),
             "e12": (run.with_name(run.name + "-e12") / "head", "eagle"), "shipped": (Path(SHIPPED), "eagle")}
    return {
        "prompts": [[sys.executable, "-m", "eagle2_train", "prompts", "--n", "8000", "--batch", "64", *t]],
        "restore": [[sys.executable, "-m", "eagle2_train.data_archive", "restore", "--run", str(run)]],
        "data": [train + ["--out", str(run), "--stages", "data", "--variants", "greedy", "--max-new-tokens", "192",
                          "--gen-batch", "96", "--gen-dtype", "auto", *t]],
        "archive": [[sys.executable, "-m", "eagle2_train.data_archive", "save", "--run", str(run)]],
        "features": [train + ["--out", str(run), "--stages", "features", "--head-kind", "eagle3", *t]],
        "e3": [train + ["--out", str(heads["e3"][0].parent), "--features", str(run), "--head-kind", "eagle3",
                        "--lr", "1e-3", *TRAIN, *t]],
        "e12": [train + ["--out", str(heads["e12"][0].parent), "--features", str(run), *FINE_TUNE, *t]],
        "eval": [train + ["--out", str(run.with_name(f"{run.name}-eval-{k}")), "--features", str(run),
                          "--stages", "train", "--head-kind", kind, "--init", str(h), "--epochs", "0",
                          "--ttt-steps", "3", *t] for k, (h, kind) in heads.items()],
        "tau": [py + ["tau", "--head", str(h), "--out", str(out / f"tau-{k}"), *t] for k, (h, _) in heads.items()],
        "table": [[sys.executable, str(REPO / "scripts" / "head_table.py"),
                   *(f"{k}={run.with_name(f'{run.name}-eval-{k}')},{out / f'tau-{k}'}" for k in heads)]],
        "curves": [[sys.executable, "-m", "viz.train_report", *(f"{k}={heads[k][0].parent}" for k in ("e3", "e12")),
                    "--out", str(run.with_name(run.name + "-curves.html")), "--markdown"]],
    }


def at_run_time(name: str, cmd: list[str]) -> tuple[list[str] | None, str]:
    """The planned command as it can run now: None (with why) for a head not trained yet or a tau
    run already made of these very weights; the table and the curves keep only the heads whose
    runs exist (a recipe part-way through, e.g. before the EAGLE-1/2 run, still reports)."""
    for flag in ("--init", "--head"):
        if flag in cmd:
            head = REPO / cmd[cmd.index(flag) + 1]  # the steps run in REPO (an absolute path stays as it is)
            if not (head / "config.json").exists():
                return None, f"{head} is not trained yet"
            if name == "tau":
                done = Path(cmd[cmd.index("--out") + 1]) / "tau.json"
                if done.exists() and json.loads(done.read_text()).get("head_sha256") == sha256_of(
                        head / "model.safetensors"):
                    return None, f"{done} is of these weights already"
    if name in ("table", "curves"):
        def ready(spec: str) -> bool:
            parts = [Path(x) for x in spec.split("=", 1)[1].split(",")]
            need = ([parts[0] / "train_log.json", parts[1] / "tau.json"] if name == "table"
                    else [parts[0] / "train_log.json"])
            return all(f.exists() for f in need)
        first = cmd.index("--out") if name == "curves" else len(cmd)
        specs = [x for x in cmd[2 if name == "table" else 3:first] if "=" in x]
        kept = [x for x in specs if ready(x)]
        if not kept:
            return None, "no head has its runs yet"
        cmd = [x for x in cmd if x not in specs or x in kept]
        if len(kept) < len(specs):
            return cmd, "without " + ", ".join(x.split("=")[0] for x in specs if x not in kept) + " (runs missing)"
    return cmd, ""


def _lines(path: Path) -> int:
    return sum(1 for _ in open(path)) if path.exists() else 0


def _training(folder: Path) -> str:
    """A head run's progress: finished epochs, the best one, and a save within the next epoch."""
    log = folder / "train_log.json"
    ckpt = folder / "checkpoint.pt"
    if not log.exists() and not ckpt.exists():
        return "not started"
    epochs = json.loads(log.read_text())["epochs"] if log.exists() else []
    text = f"{sum(e['epoch'] > 0 for e in epochs)} epoch(s) done"  # a fine-tune's log opens with epoch 0 (its init)
    if epochs:
        best = min(epochs, key=lambda e: e["heldout_loss"])
        text += (f", best {best['epoch']} (held-out loss {best['heldout_loss']:.3f}, "
                 f"top-1 {best['heldout_top1']:.3f})")
    if ckpt.exists():
        import torch  # only here: the rest of --status reads text files
        st = torch.load(str(ckpt), map_location="cpu", weights_only=True, mmap=True)
        if "in_epoch" in st:
            text += f"; epoch {st['in_epoch']['epoch'] + 1} saved at step {st['in_epoch']['step']}"
    return text


def status(run: Path, out: Path) -> list[str]:
    """One line per step: how far it got, read from its files."""
    from eagle2.tools.prompt_files import read_prompts
    n_train = sum(len(read_prompts(f)) for f in sorted((REPO / "assets" / "prompts").glob("train*.jsonl")))
    n_held = len(read_prompts(REPO / "assets" / "prompts" / "heldout.jsonl"))
    rows = [f"data: train {_lines(run / 'data_train.jsonl'):,} of {n_train:,} prompts answered, held-out "
            f"{_lines(run / 'data_heldout.jsonl')} of {n_held}"]
    manifest = REPO / "assets" / "selfdistill" / "manifest.json"
    if manifest.exists():
        kept = json.loads(manifest.read_text())["splits"]
        rows.append("archive (assets/selfdistill): " + ", ".join(f"{s} {v['lines']:,}" for s, v in kept.items()))
    else:
        rows.append("archive (assets/selfdistill): none")
    for split in ("train", "heldout"):
        index = run / f"features3_{split}" / "index.json"
        done = len(json.loads(index.read_text())["done"]) if index.exists() else 0
        rows.append(f"features ({split}): {done:,} of {_lines(run / f'data_{split}.jsonl'):,} conversations")
    for k in ("e3", "e12"):
        rows.append(f"{k}: {_training(run.with_name(f'{run.name}-{k}'))}")
    for k in ("e3", "e12", "shipped"):
        ev, tau = run.with_name(f"{run.name}-eval-{k}") / "train_log.json", out / f"tau-{k}" / "tau.json"
        rows.append(f"eval {k}: {'done' if ev.exists() else 'not yet'}; tau {k}: {'done' if tau.exists() else 'not yet'}")
    return rows


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--run", default=str(Path.home() / ".cache" / "eagle2" / "runs" / "head-r3"),
                    help="data and feature folder; the heads and evaluations go beside it")
    ap.add_argument("--out", default=str(REPO / "benchmarks" / "head-r3"), help="where tau results are written")
    ap.add_argument("--steps", default=None, help="comma list (default: all, in order)")
    ap.add_argument("--threads", default="2")
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--status", action="store_true", help="print how far each step got and stop")
    a = ap.parse_args(argv)
    if a.status:
        print("\n".join(status(Path(a.run).expanduser(), Path(a.out))))
        return 0
    plan = steps(Path(a.run).expanduser(), Path(a.out), a.threads)
    chosen = list(plan) if a.steps is None else [s.strip() for s in a.steps.split(",") if s.strip()]
    unknown = [s for s in chosen if s not in plan]
    if unknown:
        print(f"unknown step(s) {unknown}; known: {', '.join(plan)}", file=sys.stderr)
        return 2
    for name in chosen:
        for planned in plan[name]:
            cmd, why = (planned, "") if a.dry_run else at_run_time(name, planned)
            if cmd is None:
                print(f"[{name}] skipped: {why}", flush=True)
                continue
            print(f"[{name}] {shlex.join(cmd)}" + (f"  ({why})" if why else ""), flush=True)
            if not a.dry_run and subprocess.run(cmd, cwd=REPO).returncode != 0:
                print(f"step {name} failed; fix it and run the same command again (finished work is kept)",
                      file=sys.stderr)
                return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
