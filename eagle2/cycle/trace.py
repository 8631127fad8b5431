"""Step traces: what one cycle did, serialisable to JSON (schema-versioned) and back.

A trace file is {"schema": SCHEMA, "meta": {...}, "steps": [StepTrace...]}; the app replays it
without any model, so every text it shows is stored here, not recomputed from a tokenizer.
"""
from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from ..errors import UserError
from .schema import FieldError, checked, require_keys, type_name
from .tree import DraftTree

SCHEMA = "eagle2-viz/trace/v2"
READABLE = (SCHEMA, "eagle2-viz/trace/v1")  # v1: policy facts in a free `extra` dict
TIMINGS = ("draft_s", "verify_s", "commit_s", "total_s")        # StepTrace.timings: this cycle's seconds
TOTALS = ("tokens", "target_forwards", "wall_s", "draft_calls")  # StepTrace.cumulative: the run's totals


@dataclass
class StepTrace:
    cycle: int                       # 0 = prefill
    policy: str
    new_tokens: list[int]            # tokens this cycle emitted (accepted + bonus)
    new_texts: list[str]
    accepted_len: int                # accepted draft tokens (bonus excluded)
    bonus: int | None
    timings: dict[str, float]        # TIMINGS: draft_s, verify_s, commit_s, total_s
    cumulative: dict[str, float]     # TOTALS after this cycle: tokens, target_forwards, wall_s, draft_calls
                                     # ({} for a preview: a step outside the run)
    tree: DraftTree | None = None    # None for plain decoding and prefill
    tree_texts: list[str] = field(default_factory=list)   # text of every pool node
    accepted_path: list[int] = field(default_factory=list)  # pool indices, root excluded
    root: int | None = None          # the token the tree grew from (the previous bonus)
    finished: str | None = None      # "eos", "max_new_tokens", "context" once done
    text_delta: str = ""             # how the decoded text grew (tokens can split characters)

    def to_dict(self) -> dict:
        d = asdict(self)
        d["tree"] = self.tree.to_dict() if self.tree is not None else None
        return d

    @classmethod
    def from_dict(cls, d: dict, where: str = "step") -> "StepTrace":
        """The step a trace stored, each field checked against its type (a FieldError, a
        UserError, names the first that is not, e.g. "steps[3].tree.parents[5]: expected int, got
        str"); timings holds every one of TIMINGS, cumulative every one of TOTALS or nothing."""
        d = checked(cls, d, where, skip=("tree",))
        if d.get("tree") is not None:
            d["tree"] = DraftTree.from_dict(d["tree"], f"{where}.tree")
        require_keys(d["timings"], TIMINGS, f"{where}.timings")
        if d["cumulative"]:
            require_keys(d["cumulative"], TOTALS, f"{where}.cumulative")
        return cls(**d)


@dataclass
class Trace:
    meta: dict
    steps: list[StepTrace] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, "meta": self.meta, "steps": [s.to_dict() for s in self.steps]})

    def save(self, path) -> None:
        Path(path).write_text(self.to_json())

    @classmethod
    def from_json(cls, text: str) -> "Trace":
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"This file is not a trace: it is not valid JSON ({e}).") from None
        except RecursionError:
            raise UserError("This file is not a trace: its JSON is nested far too deeply.") from None
        return cls.from_dict(d)

    @classmethod
    def from_dict(cls, d) -> "Trace":
        """A trace from its parsed JSON (Trace.to_json's shape)."""
        if not isinstance(d, dict) or d.get("schema") not in READABLE:
            found = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise UserError(f"This file is not an eagle2-viz trace (schema {found!r}, expected {SCHEMA!r}).")
        try:
            steps = _checked_steps(d)
            return cls(meta=dict(d["meta"]), steps=steps)
        except FieldError as e:
            raise UserError(f"The trace is malformed ({e}).") from None
        except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
            raise UserError(f"The trace is malformed ({type(e).__name__}: {e}).") from None

    @classmethod
    def load(cls, path) -> "Trace":
        try:
            return cls.from_json(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise UserError(f"Cannot read trace {path}: {e.strerror}.") from None
        except UnicodeDecodeError:
            raise UserError(f"Cannot read trace {path}: it is not UTF-8 text.") from None


def _checked_steps(d: dict) -> list[StepTrace]:
    """The steps of a parsed trace file, checked (FieldError): its keys, the meta an object, every
    step of the run with its totals."""
    for k in d:
        if k not in ("schema", "meta", "steps"):
            raise FieldError(f"unknown field {k!r}")
    for k, want in (("meta", dict), ("steps", list)):
        if k not in d:
            raise FieldError(f"missing field {k!r}")
        if not isinstance(d[k], want):
            raise FieldError(f"{k}: expected {want.__name__}, got {type_name(d[k])}")
    steps = [StepTrace.from_dict(s, f"steps[{i}]") for i, s in enumerate(d["steps"])]
    for i, s in enumerate(steps):
        require_keys(s.cumulative, TOTALS, f"steps[{i}].cumulative")
    return steps
