"""The self-distilled answers kept in the repository (assets/selfdistill/), so that a machine whose
~/.cache was wiped starts the head recipe at the feature stage instead of regenerating hours of
answers. `save` packs a run folder's data_{train,heldout}.jsonl into xz files with a manifest (line
counts, sha256 of the uncompressed text, how they were produced); `restore` checks the sha256 and
appends every archived conversation the run folder lacks (the data stage then answers only what is
still missing, so a partial archive is fine).

    python -m eagle2_train.data_archive save --run RUN [--archive DIR]
    python -m eagle2_train.data_archive restore --run RUN [--archive DIR]
"""
from __future__ import annotations

import argparse
import hashlib
import json
import lzma
import sys
from pathlib import Path

from eagle2.errors import UserError
from eagle2.files import atomic_write
from eagle2.machine import cpu_info
from eagle2.model.weights import ASSETS

from .selfdistill import drop_partial_line

ARCHIVE = ASSETS / "selfdistill"
SPLITS = ("train", "heldout")


def _rates(run: Path) -> list[dict]:
    """The data stage's records of its runs (tokens/s, dtype, batch)."""
    path = run / "data_rate.jsonl"
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def save(run: Path, archive: Path = ARCHIVE) -> dict:
    """Pack the run's answers; returns the manifest. xz at a fixed preset: the same answers give
    the same bytes, so re-running the recipe leaves the repository unchanged."""
    import torch

    manifest = {"splits": {}, "produced_by": {
        "command": "python scripts/head_recipe.py --steps data", "machine": cpu_info(), "torch": torch.__version__,
        "rates": _rates(run)}}
    archive.mkdir(parents=True, exist_ok=True)
    for split in SPLITS:
        src = run / f"data_{split}.jsonl"
        if not src.exists():
            continue
        drop_partial_line(src)
        data = src.read_bytes()
        atomic_write(archive / f"data_{split}.jsonl.xz", lzma.compress(data, preset=9))
        manifest["splits"][split] = {"lines": data.count(b"\n"), "sha256": hashlib.sha256(data).hexdigest()}
    atomic_write(archive / "manifest.json", json.dumps(manifest, indent=1) + "\n")
    return manifest


def restore(run: Path, archive: Path = ARCHIVE) -> dict[str, int]:
    """Append the archived conversations the run folder lacks; returns how many per split."""
    mpath = archive / "manifest.json"
    if not mpath.exists():
        return {}
    manifest = json.loads(mpath.read_text())
    texts = {}
    for split, meta in manifest["splits"].items():  # check every split before writing any
        try:
            data = lzma.decompress((archive / f"data_{split}.jsonl.xz").read_bytes())
        except (OSError, lzma.LZMAError) as e:
            raise UserError(f"The archived answers {archive / f'data_{split}.jsonl.xz'} cannot be read ({e}).") from e
        if hashlib.sha256(data).hexdigest() != meta["sha256"]:
            raise UserError(f"The archived answers {archive / f'data_{split}.jsonl.xz'} do not match the sha256 in "
                            f"{mpath}: the file is corrupt; restore it from git.")
        texts[split] = data.decode()
    run.mkdir(parents=True, exist_ok=True)
    added = {}
    for split, text in texts.items():
        dst = run / f"data_{split}.jsonl"
        have = set()
        if dst.exists():
            drop_partial_line(dst)
            have = {(r["id"], r["variant"]) for r in map(json.loads, dst.read_text().splitlines())}
        new = [line for line, r in ((line, json.loads(line)) for line in text.splitlines())
               if (r["id"], r["variant"]) not in have]
        with open(dst, "a") as f:
            f.write("".join(l + "\n" for l in new))
        added[split] = len(new)
    return added


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("action", choices=("save", "restore"))
    ap.add_argument("--run", required=True, help="the recipe's run folder (data_train.jsonl, data_heldout.jsonl)")
    ap.add_argument("--archive", default=str(ARCHIVE))
    a = ap.parse_args(argv)
    run, archive = Path(a.run).expanduser(), Path(a.archive)
    try:
        if a.action == "save":
            m = save(run, archive)
            counts = ", ".join(f"{s}: {v['lines']:,}" for s, v in m["splits"].items())
            print(f"archived {counts} conversations in {archive}")
        else:
            added = restore(run, archive)
            counts = ", ".join(f"{s}: {n:,}" for s, n in added.items()) or "nothing (no archive)"
            print(f"restored {counts} conversations into {run}")
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
