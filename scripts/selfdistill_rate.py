"""Self-distillation rate of a checkout's data stage (`train --stages data`'s generate_data), greedy,
on the first N prompts of a prompt file (default assets/prompts/train_templated.jsonl, 256 new
tokens), 2 threads, the target in DTYPE (default fp32).

    python scripts/selfdistill_rate.py REPO PACK BATCH N [DTYPE [PROMPTS [MAX_NEW]]]
REPO: the checkout to import eagle2 from (e.g. a `git worktree` of an older commit); PACK 1
prepacks the weights as the data stage now does (0: as it did before); BATCH: --gen-batch.
Prints one JSON line (tokens counted from batched_generate's outputs). benchmarks/README.md
"selfdistill-rate" has the figures.
"""
import os, sys, time, json, tempfile
from pathlib import Path
repo, pack, batch, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
dtype_name = sys.argv[5] if len(sys.argv) > 5 else "fp32"
prompt_file = sys.argv[6] if len(sys.argv) > 6 else "assets/prompts/train_templated.jsonl"
max_new = int(sys.argv[7]) if len(sys.argv) > 7 else 256
if os.environ.get("PYTHONPATH") != repo:  # import eagle2 from REPO, ahead of the installed checkout
    os.execve(sys.executable, [sys.executable, *sys.argv], {**os.environ, "PYTHONPATH": repo})
import torch
torch.set_num_threads(2)
import eagle2_train.selfdistill as sd
from eagle2.tools.prompt_files import read_prompts
from eagle2_train.train import target_folder
from eagle2.model.loading import load_target
from eagle2.model.weights import DEFAULT_PRESET
from transformers import AutoTokenizer
import eagle2
for mod in (eagle2, sd):  # not the installed checkout's, for a module REPO lacks
    assert Path(mod.__file__).resolve().is_relative_to(Path(repo).resolve()), f"{mod.__name__} is not {repo}'s"
folder = target_folder(DEFAULT_PRESET)
tok = AutoTokenizer.from_pretrained(str(folder))
m = load_target(folder, torch.device("cpu"), {"fp32": torch.float32, "bf16": torch.bfloat16}[dtype_name])
if pack:
    from eagle2.model.llama import pack_linears
    pack_linears(m)
count = [0]
orig = sd.batched_generate
def counted(*a, **k):
    out = orig(*a, **k); count[0] += sum(map(len, out)); return out
sd.batched_generate = counted
prompts = read_prompts(Path(repo) / prompt_file)[:n]
out = Path(tempfile.mkdtemp()) / "d.jsonl"
t = time.perf_counter()
sd.generate_data(m, tok, prompts, out, [{"name": "greedy", "temperature": 0.0}], max_new, batch)
dt = time.perf_counter() - t
print(json.dumps({"repo": repo, "pack": pack, "batch": batch, "prompts": n, "dtype": dtype_name, "file": prompt_file,
                  "max_new": max_new, "tokens": count[0], "seconds": round(dt, 1),
                  "tokens_per_s": round(count[0] / dt, 1)}))
