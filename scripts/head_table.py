"""The head comparison table, built from the runs that measured it (no figure copied by hand).

    python scripts/head_table.py LABEL=EVAL,TAU[,BENCH] [LABEL=EVAL,TAU[,BENCH] ...]

EVAL: a train_log.json (or its folder) from `python -m eagle2_train train --stages train --init HEAD
--epochs 0 --ttt-steps 3` (held-out agreement at depths 1-3; its last record is read); TAU: a
`python -m eagle2 tau --head HEAD --out DIR` folder (tau over every held-out prompt, greedy);
BENCH (optional): a `python -m eagle2 bench --head HEAD --policies plain,eagle2-auto,...` folder,
for the speedup of eagle2-auto over plain decoding measured in that run (older folders' plain row
on the eager fp32 forward was `plain@eager`: read where present).
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

DYN, SMALL, STATIC = "eagle2 (60,5,10)", "eagle2 (16,5,10)", "static"
COLUMNS = ["head", "top-1", "depth 2", "depth 3", "tau (60,5,10)", "tau (16,5,10)", "tau static", "dynamic / static",
           "tau (60,5,10) coding / math", "eagle2-auto vs plain"]


def last_eval(path: Path) -> dict:
    log = path / "train_log.json" if path.is_dir() else path
    return json.loads(log.read_text())["epochs"][-1]


def speedup(bench_dir: Path | None) -> str:
    if bench_dir is None:
        return "-"
    pol = json.loads((bench_dir / "summary.json").read_text())["policies"]
    plain = pol.get("plain@eager") or pol.get("plain")
    if "eagle2-auto" not in pol or plain is None:
        return "-"
    return f"{pol['eagle2-auto']['tokens_per_s'] / plain['tokens_per_s']:.2f}x"


def row(label: str, ev: dict, tau: dict, bench_dir: Path | None) -> list[str]:
    t = tau["trees"]
    if not tau.get("identical", False):
        raise SystemExit(f"{label}: the tau run's trees disagreed ({tau.get('mismatches')}); fix that first.")
    cat = t[DYN]["by_category"]
    fmt = lambda k: f"{t[k]['tau']:.2f}" if k in t else "-"  # noqa: E731
    return [label, f"{ev['heldout_top1']:.3f}", f"{ev.get('heldout_top1_step2', float('nan')):.3f}",
            f"{ev.get('heldout_top1_step3', float('nan')):.3f}", fmt(DYN), fmt(SMALL), fmt(STATIC),
            f"{t[DYN]['tau'] / t[STATIC]['tau']:.2f}x" if STATIC in t else "-",
            f"{cat.get('coding', float('nan')):.2f} / {cat.get('math', float('nan')):.2f}", speedup(bench_dir)]


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__, file=sys.stderr)
        return 2
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + " --- |" * len(COLUMNS))
    for spec in argv:
        label, dirs = spec.split("=", 1)
        parts = [Path(p) for p in dirs.split(",")]
        ev_path, tau_dir, bench_dir = parts[0], parts[1], parts[2] if len(parts) > 2 else None
        tau = json.loads((tau_dir / "tau.json").read_text())
        print("| " + " | ".join(row(label, last_eval(ev_path), tau, bench_dir)) + " |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
