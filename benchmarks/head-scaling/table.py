"""The scaling runs' held-out figures epoch by epoch, side by side, from their train_log.json files:

    python benchmarks/head-scaling/table.py 25%=RUN-quarter/train_log.json 100%=assets/heads/smollm2-135m-eagle3/train_log.json
"""
import json
import sys
from pathlib import Path

runs = {label: json.loads(Path(path).read_text()) for label, path in (a.split("=", 1) for a in sys.argv[1:])}
print("| data | epoch | steps | held-out loss | top-1 | depth 2 | depth 3 |")
print("|---|---|---|---|---|---|---|")
for label, log in runs.items():
    best = min(log["epochs"], key=lambda e: e["heldout_loss"])["epoch"]
    for e in log["epochs"]:
        mark = "**" if e["epoch"] == best else ""
        cells = [f"{e['heldout_loss']:.3f}", f"{e['heldout_top1']:.3f}", f"{e['heldout_top1_step2']:.3f}",
                 f"{e['heldout_top1_step3']:.3f}"]
        print(f"| {label} | {mark}{e['epoch']}{mark} | {e['epoch'] * log['steps_per_epoch']:,} | "
              + " | ".join(f"{mark}{c}{mark}" for c in cells) + " |")
