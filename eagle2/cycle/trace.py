"""Step traces: what one cycle did, serialisable to JSON (schema-versioned) and back.

A trace file is {"schema": SCHEMA, "meta": {...}, "steps": [StepTrace...]}; the app replays it
without any model, so every text it shows is stored here, not recomputed from a tokenizer.

pydantic reads and writes the dataclasses below as they are annotated. Reading is strict, as JSON
(a field of a file is of its annotated type or the file is malformed), and needs the record types
a tree may carry: a TraceReader is built from them (the policy registry holds the one for every
registered policy). A bad file gives one UserError naming the first bad field, e.g.
"steps[3].tree.parents[5]: expected int, got str".
"""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Generic, Union

from pydantic import AfterValidator, BeforeValidator, Field, TypeAdapter, ValidationError
from pydantic_core import to_json

from ..errors import UserError
from ..phases import PHASE_TEXT, PHASES, split_of  # noqa: F401  (viz reads the phases from the trace types)
from .checked import CHECKED, Number
from .series import PER_CYCLE, PRICING, SERIES_KEYS, Series  # noqa: F401  (viz reads the series type here)
from .tree import DraftTree, R, TreeRecord

SCHEMA = "eagle2-viz/trace/v2"
SCHEMA_V1 = "eagle2-viz/trace/v1"   # v1: policy facts in a free `extra` dict of the tree
READABLE = (SCHEMA, SCHEMA_V1)
# StepTrace.timings: this cycle's seconds; each phase's too (eagle2/phases.py) in traces recorded since
TIMINGS = ("draft_s", "verify_s", "commit_s", "total_s")
TOTALS = ("tokens", "target_forwards", "wall_s", "draft_calls")  # StepTrace.cumulative: the run's totals


def _holding(keys, or_empty: bool = False) -> AfterValidator:
    """Checks that a dict holds every one of `keys` (or, with or_empty, none at all)."""
    def check(d: dict) -> dict:
        missing = next((k for k in keys if k not in d), None)
        if missing is not None and not (or_empty and not d):
            raise ValueError(f"missing key {missing!r}")
        return d
    return AfterValidator(check)


def _tree_from_v1(t):
    """Schema v1 kept the tree's policy columns (beam, draft_calls...) in a free `extra` dict."""
    if not (isinstance(t, dict) and isinstance(t.get("extra"), dict)):
        return t
    t = dict(t)
    old = t.pop("extra")
    cols = {f.name for f in dataclasses.fields(DraftTree) if f.init} - {"record"}
    return {**{k: v for k, v in old.items() if k in cols}, **t}


@dataclass
class StepTrace(Generic[R]):
    __pydantic_config__ = CHECKED
    cycle: int                       # 0 = prefill
    policy: str
    new_tokens: list[int]            # tokens this cycle emitted (accepted + bonus)
    new_texts: list[str]
    accepted_len: int                # accepted draft tokens (bonus excluded)
    bonus: int | None
    timings: Annotated[dict[str, Number], _holding(TIMINGS)]    # this cycle's seconds
    # the run's totals after this cycle ({} for a preview: a step outside the run)
    cumulative: Annotated[dict[str, Number], _holding(TOTALS, or_empty=True)]
    tree: Annotated[DraftTree[R] | None, BeforeValidator(_tree_from_v1)] = None  # None: plain decoding, prefill
    tree_texts: list[str] = field(default_factory=list)   # text of every pool node
    accepted_path: list[int] = field(default_factory=list)  # pool indices, root excluded
    root: int | None = None          # the token the tree grew from (the previous bonus)
    finished: str | None = None      # "eos", "max_new_tokens", "context" once done
    text_delta: str = ""             # how the decoded text grew (tokens can split characters)

    def to_dict(self) -> dict:
        return _dumper(StepTrace).dump_python(self)


@dataclass
class Trace(Generic[R]):
    meta: dict[str, Any]
    steps: list[StepTrace[R]] = field(default_factory=list)

    def to_json(self) -> str:
        return json.dumps({"schema": SCHEMA, **_dumper(Trace).dump_python(self)})

    def save(self, path) -> None:
        Path(path).write_text(self.to_json())


@dataclass
class TraceFile(Generic[R]):
    """A trace as its file holds it (what a reader checks)."""
    __pydantic_config__ = CHECKED
    schema: str                      # one of READABLE (checked first: another is not a trace at all)
    meta: dict[str, Any]
    steps: list[StepTrace[R]]


@functools.cache
def _dumper(cls) -> TypeAdapter:
    """Writes cls's instances as plain data (records, typed as any value here, by their own fields)."""
    return TypeAdapter(cls)


class TraceReader:
    """Reads trace files and steps whose trees carry records of the given types (TreeRecord
    subclasses, told apart by their `kind`), every field checked."""

    def __init__(self, records: tuple[type[TreeRecord], ...]):
        self.records = records
        self._kinds = {f.default for r in records for f in dataclasses.fields(r) if f.name == "kind"}

    @functools.cached_property
    def _types(self) -> tuple[TypeAdapter, TypeAdapter]:
        rec = Annotated[Union[self.records], Field(discriminator="kind")]
        return TypeAdapter(TraceFile[rec]), TypeAdapter(StepTrace[rec])

    def load(self, path) -> Trace:
        try:
            return self.from_json(Path(path).read_text(encoding="utf-8"))
        except OSError as e:
            raise UserError(f"Cannot read trace {path}: {e.strerror}.") from None
        except UnicodeDecodeError:
            raise UserError(f"Cannot read trace {path}: it is not UTF-8 text.") from None

    def from_json(self, text: str) -> Trace:
        try:
            d = json.loads(text)
        except (json.JSONDecodeError, UnicodeDecodeError) as e:
            raise UserError(f"This file is not a trace: it is not valid JSON ({e}).") from None
        except RecursionError:
            raise UserError("This file is not a trace: its JSON is nested far too deeply.") from None
        return self._read(d, text)

    def from_dict(self, d) -> Trace:
        """A trace from its parsed JSON (Trace.to_json's shape)."""
        return self._read(d, None)

    def step(self, d, where: str = "step") -> StepTrace:
        """One step as StepTrace.to_dict wrote it (a preview: its totals may be empty)."""
        return self._checked(self._types[1], d, None, where)

    def _read(self, d, text: str | None) -> Trace:
        if not isinstance(d, dict) or d.get("schema") not in READABLE:
            found = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise UserError(f"This file is not an eagle2-viz trace (schema {found!r}, expected {SCHEMA!r}).")
        f = self._checked(self._types[0], d, text, "")
        for i, s in enumerate(f.steps):   # a step of the run, unlike a preview, carries the run's totals
            if not s.cumulative:
                raise UserError(f"The trace is malformed (steps[{i}].cumulative: missing key {TOTALS[0]!r}).")
        return Trace(meta=f.meta, steps=f.steps)

    def _checked(self, adapter: TypeAdapter, d, text: str | None, where: str):
        # strict validation builds dataclasses from JSON objects (from Python dicts only in lax mode)
        try:
            return adapter.validate_json(text if text is not None else to_json(d, inf_nan_mode="constants"))
        except ValidationError as e:
            raise UserError(f"The trace is malformed ({self._problem(e.errors()[0], where)}).") from None

    def _problem(self, err: dict, where: str) -> str:
        """One pydantic error as the trace's reader says it: where, then what."""
        loc = [p for i, p in enumerate(err["loc"]) if not (i and err["loc"][i - 1] == "record" and p in self._kinds)]
        kind, got = err["type"], err.get("input")
        if kind in ("missing", "unexpected_keyword_argument", "extra_forbidden"):
            what = "missing field" if kind == "missing" else "unknown field"
            return _at(where, loc[:-1], f"{what} {loc[-1]!r}")
        if kind == "union_tag_invalid":
            return _at(where, loc + ["kind"], f"unknown tree record kind {err['ctx']['tag']!r} "
                                              f"(known: {', '.join(sorted(self._kinds))})")
        if kind == "union_tag_not_found":
            return _at(where, loc, "missing field 'kind'")
        if kind == "value_error":
            return _at(where, loc, str(err["ctx"]["error"]))
        if kind in _EXPECTED:
            return _at(where, loc, f"expected {_EXPECTED[kind]}, got {'None' if got is None else type(got).__name__}")
        return _at(where, loc, err["msg"])


# pydantic's error types for a value of the wrong type -> the JSON-side type it wanted
_EXPECTED = {"int_type": "int", "float_type": "float", "number_type": "number", "string_type": "str",
             "bool_type": "bool", "list_type": "list", "dict_type": "dict", "dataclass_type": "dict",
             "model_attributes_type": "dict"}


def _at(where: str, loc, what: str) -> str:
    path = where
    for p in loc:
        path += f"[{p!r}]" if isinstance(p, int) or not p.isidentifier() else (f".{p}" if path else p)
    return f"{path}: {what}" if path else what
