"""The training conversations of a run folder, shuffled (seed 0), the first FRACTION kept in another
run folder with the whole held-out split: the data of a scaling curve's larger point, whose
smaller points are the first N conversations of its feature cache (`--train-limit N`).

    python benchmarks/head-scaling/subset.py FULL_RUN HALF_RUN 0.5
"""
import random
import shutil
import sys
from pathlib import Path

full, part, fraction = Path(sys.argv[1]), Path(sys.argv[2]), float(sys.argv[3])
lines = [line for line in (full / "data_train.jsonl").read_text().splitlines(keepends=True) if line.strip()]
random.Random(0).shuffle(lines)
part.mkdir(parents=True, exist_ok=True)
(part / "data_train.jsonl").write_text("".join(lines[: int(len(lines) * fraction)]))
shutil.copy(full / "data_heldout.jsonl", part / "data_heldout.jsonl")
print(f"{int(len(lines) * fraction)} of {len(lines)} training conversations into {part}")
