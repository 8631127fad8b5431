"""The run folder of a sampled-answers point: the first N greedy conversations of a shuffled run
folder (subset.py's), the prompts they answer (for the data stage's --prompts, so it answers those
prompts only) and the held-out split whole. The data stage then adds each prompt's sampled answer:

    python benchmarks/head-scaling/variants.py HALF VAR 1120
    python -m eagle2_train train --out VAR --stages data --prompts VAR/prompts.jsonl \
        --variants greedy,t0.7 --max-new-tokens 192 --gen-batch 96 --gen-dtype auto --threads 2

The first N conversations of HALF are the first N of the scaling curve's smaller points too
(`--train-limit N` on HALF's cache), so the greedy answers here are the 12.5% point's.
"""
import json
import shutil
import sys
from pathlib import Path

from eagle2.model.weights import ASSETS
from eagle2.tools.prompt_files import read_prompts

shuffled, run, n = Path(sys.argv[1]), Path(sys.argv[2]), int(sys.argv[3])
convs = [json.loads(line) for line in (shuffled / "data_train.jsonl").read_text().splitlines() if line.strip()][:n]
if len({c["id"] for c in convs}) != n or any(c["variant"] != "greedy" for c in convs):
    sys.exit(f"{shuffled}: the first {n} conversations are not {n} distinct prompts' greedy answers")
# the files the data stage reads by default (`--prompts`), by id
prompts = {q["question_id"]: q for path in sorted((ASSETS / "prompts").glob("train*.jsonl")) for q in read_prompts(path)}
run.mkdir(parents=True, exist_ok=True)
(run / "prompts.jsonl").write_text("".join(json.dumps(prompts[c["id"]]) + "\n" for c in convs))
(run / "data_train.jsonl").write_text("".join(json.dumps(c) + "\n" for c in convs))
shutil.copy(shuffled / "data_heldout.jsonl", run / "data_heldout.jsonl")
print(f"{n} prompts and their greedy answers into {run}")
