"""Prompt files in MT-bench format (one JSON object per line: question_id, category, turns)."""
from __future__ import annotations

import json
from pathlib import Path

from ..errors import UserError
from ..model.weights import ASSETS

# the held-out prompts: never trained on, the ones every measurement of this project decodes
HELDOUT = ASSETS / "prompts" / "heldout.jsonl"


def read_prompts(path: Path) -> list[dict]:
    out = []
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except OSError as e:
        raise UserError(f"Cannot read prompt file {path}: {e.strerror}.") from None
    for n, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            q = json.loads(line)
            turns = q["turns"]
            assert isinstance(turns, list) and turns and all(isinstance(t, str) and t.strip() for t in turns)
            out.append({"question_id": q["question_id"], "category": q.get("category", "general"),
                        "turns": turns})
        except (json.JSONDecodeError, KeyError, AssertionError, TypeError):
            raise UserError(f"{path}, line {n}: expected a JSON object with 'question_id' and 'turns' "
                            f"(a list of non-empty strings).") from None
    if not out:
        raise UserError(f"{path} holds no prompts.")
    return out
