"""Step traces: what one cycle did, serialisable to JSON (schema-versioned) and back.

A trace file is {"schema": SCHEMA, "meta": {...}, "steps": [StepTrace...]}; the app replays it
without any model, so every text it shows is stored here, not recomputed from a tokenizer.

pydantic reads and writes the dataclasses below as they are annotated. Reading is strict, as JSON
(a field of a file is of its annotated type or the file is malformed), and needs the record types
a tree may carry: a TraceReader is built from them (the policy registry holds the one for every
registered policy). Beyond the types, the validators hold what the figures draw from: the sizes
and links of a step and its tree, cycles in order, the meta the page reads (the run's description,
the race's other series and previews). A bad file gives one UserError naming the first bad field,
e.g. "steps[3].tree.parents[5]: expected int, got str". This reader is the one place a trace's
text is parsed: its encoding, its JSON and how deep that nests.
"""
from __future__ import annotations

import dataclasses
import functools
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Annotated, Any, Generic, Union

from pydantic import (AfterValidator, BeforeValidator, Field, TypeAdapter, ValidationError, WrapValidator,
                      model_validator, with_config)
from pydantic_core import to_json
from typing_extensions import TypedDict   # pydantic reads typing's own only from Python 3.12

from ..errors import UserError
from .checked import CHECKED, OPEN, AcceptedCount, Number, broken
from .series import RecordedSeries
from .tree import DraftTree, R, TreeRecord

SCHEMA = "eagle2-viz/trace/v2"
SCHEMA_V1 = "eagle2-viz/trace/v1"   # v1: policy facts in a free `extra` dict of the tree
READABLE = (SCHEMA, SCHEMA_V1)
# StepTrace.timings: this cycle's seconds; each phase's too (eagle2/phases.py) in traces recorded since
TIMINGS = ("draft_s", "verify_s", "commit_s", "total_s")
TOTALS = ("tokens", "target_forwards", "wall_s", "draft_calls")  # StepTrace.cumulative: the run's totals
VIZ_KEY = "viz"   # the meta key holding the race's comparison and plain series and its previews
DEVICE_NAME = "device_name"   # meta: the GPU's (or CPU's) model a recorded race ran on (decoding/recorded_race.py)
MAX_NESTING = 32  # a trace nests 7 deep; far deeper JSON would overflow Python's recursion later


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
    new_texts: list[str]             # one per new token ([]: recorded without texts)
    accepted_len: AcceptedCount      # accepted draft tokens (bonus excluded)
    bonus: int | None
    timings: Annotated[dict[str, Number], _holding(TIMINGS)]    # this cycle's seconds
    # the run's totals after this cycle ({} for a preview: a step outside the run)
    cumulative: Annotated[dict[str, Number], _holding(TOTALS, or_empty=True)]
    tree: Annotated[DraftTree[R] | None, BeforeValidator(_tree_from_v1)] = None  # None: plain decoding, prefill
    tree_texts: list[str] = field(default_factory=list)   # text of every pool node ([]: none recorded)
    accepted_path: list[int] = field(default_factory=list)  # pool indices, root excluded
    root: int | None = None          # the token the tree grew from (the previous bonus)
    finished: str | None = None      # "eos", "max_new_tokens", "context" once done
    text_delta: str = ""             # how the decoded text grew (tokens can split characters)

    @model_validator(mode="after")
    def _sizes_and_links(self):
        """Read from a file: a text per new token; with a tree, a text per node, no more accepted
        than its nodes and an accepted path through them (the figures index the tree by these).
        Texts may be missing altogether (the figures then show token ids), not in part."""
        if self.new_texts and len(self.new_texts) != len(self.new_tokens):
            raise broken(("new_texts",), f"{len(self.new_texts)} texts for {len(self.new_tokens)} new_tokens")
        if self.tree is None:
            return self
        n = len(self.tree.tokens)
        if self.accepted_len > n:
            raise broken(("accepted_len",), f"{self.accepted_len} accepted of the tree's {n} nodes")
        if self.tree_texts and len(self.tree_texts) != n:
            raise broken(("tree_texts",), f"{len(self.tree_texts)} entries for the tree's {n} nodes")
        bad = next((j for j, i in enumerate(self.accepted_path) if not 0 < i < n), None)
        if bad is not None:
            raise broken(("accepted_path", bad), f"{self.accepted_path[bad]} is not a node of the tree "
                                                 f"below its root (1 to {n - 1})")
        return self

    def to_dict(self) -> dict:
        return _dumper(StepTrace).dump_python(self)


@dataclass
class Trace(Generic[R]):
    meta: dict[str, Any]
    steps: list[StepTrace[R]] = field(default_factory=list)

    def to_json(self, digits: int | None = None) -> str:
        """The trace file's text; with `digits`, compact and every float to that many significant
        digits (a shipped or recorded trace: a third of the size, the same figures)."""
        data = {"schema": SCHEMA, **_dumper(Trace).dump_python(self)}
        if digits is None:
            return json.dumps(data)
        return json.dumps(_rounded(data, digits), separators=(",", ":"))

    def save(self, path) -> None:
        Path(path).write_text(self.to_json())


def _rounded(x, digits: int):
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, (list, tuple)):
        return [_rounded(v, digits) for v in x]
    if isinstance(x, dict):
        return {k: _rounded(v, digits) for k, v in x.items()}
    return x


@with_config(OPEN)
class Sampling(TypedDict, total=False):
    temperature: Number | None       # 0 or none: greedy (the page draws greedy runs apart)


def _as_written(d, check):
    """Checked, then kept as the file wrote it: meta stays plain data in the file's order (a trace
    writes back byte for byte; View reads each preview with TraceReader.step)."""
    check(d)
    return d


@with_config(OPEN)
class RaceRecord(TypedDict, Generic[R], total=False):
    """meta[VIZ_KEY]: what the page recorded of its race beside the main decoder's steps."""
    series: list[RecordedSeries] | None      # the comparison's and plain decoding's progress
    # the comparison's tree on the main decoder's context, one step per drafted cycle
    previews: list[StepTrace[R]] | None


@with_config(OPEN)
class Meta(TypedDict, Generic[R], total=False):
    """A run's description as a file holds it: free-form, the names the page reads typed."""
    model: str | None
    head: str | None
    device: str | None
    device_name: str | None          # DEVICE_NAME: the device's model, where the recorder said it
    dtype: str | None
    prompt_text: str | None
    policy: dict[str, Any] | None    # its name and parameters
    sampling: Sampling | None
    viz: RaceRecord[R] | None        # VIZ_KEY


@dataclass
class TraceFile(Generic[R]):
    """A trace as its file holds it (what a reader checks)."""
    __pydantic_config__ = CHECKED
    schema: str                      # one of READABLE (checked first: another is not a trace at all)
    meta: Annotated[Meta[R], WrapValidator(_as_written)]
    steps: list[StepTrace[R]]

    @model_validator(mode="after")
    def _one_run(self):
        """The steps are one run's: cycles in order, each with the run's totals (a preview, a step
        outside the run, has none)."""
        for i, st in enumerate(self.steps):
            if not st.cumulative:
                raise broken(("steps", i, "cumulative"), f"missing key {TOTALS[0]!r}")
            if i and st.cycle <= self.steps[i - 1].cycle:
                raise broken(("steps", i, "cycle"), f"cycle {st.cycle} after cycle {self.steps[i - 1].cycle} "
                                                    "(cycles increase)")
        return self


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
            raw = Path(path).read_bytes()
        except OSError as e:
            raise UserError(f"Cannot read trace {path}: {e.strerror}.") from None
        try:
            return self.from_json(raw)
        except UserError as e:
            raise e.about(f"Cannot read trace {path}") from None

    def from_json(self, text: str | bytes) -> Trace:
        """A trace from its file's text (as bytes: UTF-8, a byte-order mark allowed). Its errors
        speak of the file as "it", for the caller to say which (UserError.about)."""
        try:
            if isinstance(text, bytes):
                text = text.decode("utf-8-sig")
            d = json.loads(text)
        except UnicodeDecodeError:
            raise UserError("It is not a text file (a trace is JSON).") from None
        except json.JSONDecodeError as e:
            raise UserError(f"It is not valid JSON ({e}).") from None
        except RecursionError:
            raise UserError("Its JSON is nested far too deeply.") from None
        _nesting_at_most(d, MAX_NESTING)
        return self._read(d, text)

    def step(self, d, where: str = "step") -> StepTrace:
        """One step as StepTrace.to_dict wrote it (a preview: its totals may be empty)."""
        return self._checked(self._types[1], d, None, where)

    def _read(self, d, text: str | None) -> Trace:
        if not isinstance(d, dict) or d.get("schema") not in READABLE:
            found = d.get("schema") if isinstance(d, dict) else type(d).__name__
            raise UserError(f"This file is not an eagle2-viz trace (schema {found!r}, expected {SCHEMA!r}).")
        f = self._checked(self._types[0], d, text, "")
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
        if kind == "finite_number":
            return _at(where, loc, f"expected a finite number, got {got}")
        if kind in _EXPECTED:
            return _at(where, loc, f"expected {_EXPECTED[kind]}, got {'None' if got is None else type(got).__name__}")
        return _at(where, loc, err["msg"])


# pydantic's error types for a value of the wrong type -> the JSON-side type it wanted
_EXPECTED = {"int_type": "int", "float_type": "float", "number_type": "number", "string_type": "str",
             "bool_type": "bool", "list_type": "list", "dict_type": "dict", "dataclass_type": "dict",
             "model_attributes_type": "dict"}


def _nesting_at_most(data, limit: int) -> None:
    """A UserError if lists and objects nest deeper than `limit` (walked without recursion: pydantic,
    the page and the figures recurse into whatever a trace holds)."""
    stack = [(data, 1)] if isinstance(data, (dict, list)) else []
    while stack:
        x, depth = stack.pop()
        if depth > limit:
            raise UserError(f"Its JSON nests more than {limit} levels deep (a trace nests 7).")
        stack.extend((v, depth + 1) for v in (x.values() if isinstance(x, dict) else x)
                     if isinstance(v, (dict, list)))


def _at(where: str, loc, what: str) -> str:
    path = where
    for p in loc:
        path += f"[{p!r}]" if isinstance(p, int) or not p.isidentifier() else (f".{p}" if path else p)
    return f"{path}: {what}" if path else what
