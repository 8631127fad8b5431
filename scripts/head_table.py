"""The side-by-side head comparison table (benchmarks/head-compare/README.md) from the runs that
measured it, so no figure is copied by hand.

    python scripts/head_table.py LABEL=EVAL_DIR,BENCH_DIR [LABEL=EVAL_DIR,BENCH_DIR ...]

EVAL_DIR: the train_log.json, or the folder, of a `python -m eagle2 train --stages train --init HEAD --epochs 0 --ttt-steps 3` folder
(its train_log.json: held-out agreement at depths 1-3 on one feature cache); BENCH_DIR: a
`python -m eagle2 bench --head HEAD --policies plain,static,eagle2-auto --sweep ...` folder.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

SWEEP = "eagle2[N={n},d=5,k=10]"


def last_eval(path: Path) -> dict:
    """The last record of a train_log.json (or of the one in a run folder)."""
    log = path / "train_log.json" if path.is_dir() else path
    return json.loads(log.read_text())["epochs"][-1]


def row(label: str, ev: dict, bench: dict) -> list[str]:
    pol = bench["policies"]
    tau = {k: v["tau"] for k, v in pol.items()}
    cat = bench["by_category"]
    n60 = SWEEP.format(n=60)
    return [label, f"{ev['heldout_top1']:.3f}", f"{ev.get('heldout_top1_step2', float('nan')):.3f}",
            f"{ev.get('heldout_top1_step3', float('nan')):.3f}", f"{tau[n60]:.2f}", f"{tau[SWEEP.format(n=16)]:.2f}",
            f"{tau['static']:.2f}", f"{tau[n60] / tau['static']:.2f}x", f"{tau['eagle2-auto']:.2f}",
            f"{pol['eagle2-auto']['speedup']:.2f}x", f"{pol['static']['speedup']:.2f}x",
            f"{cat['coding'][n60]['tau']:.2f} / {cat['math'][n60]['tau']:.2f}"]


def main(argv: list[str]) -> int:
    head = ["head", "top-1", "depth 2", "depth 3", "tau (60,5,10)", "tau (16,5,10)", "tau static",
            "dynamic / static", "tau auto", "auto speedup", "static speedup", "tau (60,5,10) coding / math"]
    print("| " + " | ".join(head) + " |")
    print("|" + " --- |" * len(head))
    for spec in argv:
        label, dirs = spec.split("=", 1)
        ev_dir, bench_dir = (Path(p) for p in dirs.split(","))
        bench = json.loads((bench_dir / "summary.json").read_text())
        print("| " + " | ".join(row(label, last_eval(ev_dir), bench)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
