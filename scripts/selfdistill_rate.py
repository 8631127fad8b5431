"""Self-distillation rate of a checkout's data stage (`train --stages data`'s generate_data), greedy,
256 new tokens, on the first N prompts of assets/prompts/train_templated.jsonl, 2 threads.

    python scripts/selfdistill_rate.py REPO PACK BATCH N
REPO: the checkout to import eagle2 from (e.g. a `git worktree` of an older commit); PACK 1
prepacks the weights as the data stage now does (0: as it did before); BATCH: --gen-batch.
Prints one JSON line (tokens counted from batched_generate's outputs). benchmarks/README.md
"selfdistill-rate" has the figures.
"""
import os, sys, time, json, tempfile
from pathlib import Path
repo, pack, batch, n = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
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
m = load_target(folder, torch.device("cpu"), torch.float32)
if pack:
    from eagle2.model.llama import pack_linears
    pack_linears(m)
count = [0]
orig = sd.batched_generate
def counted(*a, **k):
    out = orig(*a, **k); count[0] += sum(map(len, out)); return out
sd.batched_generate = counted
prompts = read_prompts(Path(repo) / "assets/prompts/train_templated.jsonl")[:n]
out = Path(tempfile.mkdtemp()) / "d.jsonl"
t = time.perf_counter()
sd.generate_data(m, tok, prompts, out, [{"name": "greedy", "temperature": 0.0}], 256, batch)
dt = time.perf_counter() - t
print(json.dumps({"repo": repo, "pack": pack, "batch": batch, "prompts": n, "tokens": count[0], "seconds": round(dt, 1),
                  "tokens_per_s": round(count[0] / dt, 1)}))
