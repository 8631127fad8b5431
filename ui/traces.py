"""The recorded traces shipped in assets/traces (listing, loading, re-recording) and the example
prompts."""
from __future__ import annotations

import json
import math
import time
from pathlib import Path

from eagle2.errors import UserError
from eagle2.model.weights import ASSETS
from eagle2.policies.registry import TRACES

from .session import DEFAULTS, Session, Settings
from .view import VIZ_KEY, View

TRACES_DIR = ASSETS / "traces"
EXAMPLES_FILE = ASSETS / "prompts" / "examples.json"
DEFAULT_TRACE = "writing-greedy.json"

BUILTIN_EXAMPLES = {
    "Writing": ["Write a short poem about a city at night seen from a rooftop."],
    "Reasoning": ["If a week from tomorrow is Sunday, what day was yesterday?"],
    "Math": ["What is 7/8 as a percentage?"],
    "Code": ["Write a Python function that checks whether two strings are anagrams."],
    "Translation": ["Translate into French: 'The library opens at nine and closes at six.'"],
}

# --------------------------------------------------------------------------------------------
# Shipped traces
# --------------------------------------------------------------------------------------------
_TITLES: dict[tuple, str | None] = {}


def shipped_traces() -> dict[str, Path]:
    """Display name -> path of the recorded traces in assets/traces (the default first)."""
    out = {}
    if TRACES_DIR.is_dir():
        files = sorted(TRACES_DIR.glob("*.json"), key=lambda p: (p.name != DEFAULT_TRACE, p.name))
        for p in files:
            key = (str(p), p.stat().st_mtime)
            if key not in _TITLES:
                try:
                    meta = json.loads(p.read_text(encoding="utf-8")).get("meta", {})
                    _TITLES[key] = (meta.get(VIZ_KEY) or {}).get("title") or p.stem
                except (OSError, ValueError, AttributeError):
                    _TITLES[key] = None
            if _TITLES[key]:
                out[_TITLES[key]] = p
    return out


_TRACE_CACHE: dict[str, View] = {}


def load_view(path) -> View:
    """A shipped trace's View (cached: they are read-only), or any other trace file's."""
    key = str(path)
    if key not in _TRACE_CACHE or not key.startswith(str(TRACES_DIR)):
        _TRACE_CACHE[key] = View.from_trace(TRACES.load(path), Path(path).name)
    return _TRACE_CACHE[key]


# --------------------------------------------------------------------------------------------
# Uploaded traces: anything may arrive
# --------------------------------------------------------------------------------------------
MAX_UPLOAD_MB = 100     # room for long runs with large trees (the shipped 48-token traces: 0.3-0.5 MB)
MAX_NESTING = 32        # a trace nests 7 deep; far deeper JSON would overflow Python's recursion later
MAX_ACCEPTED = 4096     # tokens accepted in one cycle (the charts allocate per count up to the largest)


def read_upload(path) -> View:
    """An uploaded trace file's View. Whatever the file holds (not JSON, not text, empty, huge,
    nested too deeply, the wrong shape), a file that is not a trace this page can draw raises one
    UserError, "Could not read this trace: ...", and nothing else."""
    try:
        return _read_upload(Path(path))
    except UserError as e:
        msg = str(e)
        raise UserError(f"Could not read this trace: {msg[:1].lower()}{msg[1:]}") from None
    except MemoryError:
        raise UserError("Could not read this trace: it is too large to read here.") from None
    except RecursionError:
        raise UserError("Could not read this trace: it is nested far too deeply.") from None


def _read_upload(path: Path) -> View:
    try:
        size = path.stat().st_size
        if size == 0:
            raise UserError("the file is empty.")
        if size > MAX_UPLOAD_MB * 2 ** 20:
            raise UserError(f"the file is {size / 2 ** 20:.0f} MB; this page reads traces of up to "
                            f"{MAX_UPLOAD_MB} MB.")
        raw = path.read_bytes()
    except OSError as e:
        raise UserError(f"the file cannot be opened ({e.strerror or e}).") from None
    try:
        text = raw.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise UserError("it is not a text file (a trace is JSON).") from None
    del raw
    try:
        data = json.loads(text)
    except RecursionError:
        raise UserError("its JSON is nested far too deeply.") from None
    except ValueError as e:
        raise UserError(f"it is not valid JSON ({e}).") from None
    check_nesting(data)
    tr = TRACES.from_dict(data)
    for s in tr.steps:
        check_step(s, f"cycle {s.cycle!r}" if isinstance(s.cycle, int) else "a cycle")
    cycles = [s.cycle for s in tr.steps]
    if any(b <= a for a, b in zip(cycles, cycles[1:])):
        raise UserError("the trace is malformed (its cycles are not in increasing order).")
    check_meta(tr.meta)
    try:
        view = View.from_trace(tr, path.name)
    except UserError:
        raise
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as e:
        raise UserError(f"the trace is malformed ({type(e).__name__}: {e}).") from None
    for c, p in view.previews.items():
        check_step(p, f"the comparison tree of cycle {c}")
    for ser in view.series[1:]:
        check_series(ser)
    return view


def check_nesting(data, limit: int = MAX_NESTING) -> None:
    """Raise a UserError if lists and objects nest deeper than `limit` (walked without recursion)."""
    stack = [(data, 1)] if isinstance(data, (dict, list)) else []
    while stack:
        x, depth = stack.pop()
        if depth > limit:
            raise UserError(f"its JSON nests more than {limit} levels deep (a trace nests 7).")
        stack.extend((v, depth + 1) for v in (x.values() if isinstance(x, dict) else x)
                     if isinstance(v, (dict, list)))


def _num(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


# the tree's columns: one entry per node, or (the second) that or empty
_TREE_NODES = ("tokens", "parents", "depths", "ranks", "logp", "values", "levels", "kept")
_TREE_NODES_OR_NONE = ("order", "target_prob", "accepted")


def check_step(s, where: str) -> None:
    """Raise a UserError unless the step's sizes and links are what the figures draw from (the
    fields' types were checked when the trace was read: TRACES)."""
    if len(s.new_texts) != len(s.new_tokens):
        raise UserError(f"the trace is malformed ({where}: new_texts and new_tokens differ in length).")
    t = s.tree
    if not 0 <= s.accepted_len <= (MAX_ACCEPTED if t is None else min(MAX_ACCEPTED, len(t.tokens))):
        raise UserError(f"the trace is malformed ({where}: accepted_len {s.accepted_len} is out of range).")
    if t is None:
        return
    n = len(t.tokens)
    sizes = {k: len(getattr(t, k)) for k in _TREE_NODES} | {"tree_texts": len(s.tree_texts)}
    sizes |= {k: len(getattr(t, k)) for k in _TREE_NODES_OR_NONE if getattr(t, k)}
    if n == 0 or any(v != n for v in sizes.values()):
        raise UserError(f"the trace is malformed ({where}: the tree's columns differ in length: {sizes}).")
    if t.parents[0] != -1 or any(not 0 <= p < i for i, p in enumerate(t.parents) if i):
        raise UserError(f"the trace is malformed ({where}: a tree node's parent is not an earlier node).")
    if any(not 0 < i < n for i in s.accepted_path):
        raise UserError(f"the trace is malformed ({where}: the accepted path names a node not in the tree).")


def check_meta(meta: dict) -> None:
    """Raise a UserError unless the run's description holds what the page reads from it."""
    for k in ("policy", "sampling", VIZ_KEY):
        if meta.get(k) is not None and not isinstance(meta[k], dict):
            raise UserError(f"the trace is malformed (meta: {k} should be an object).")
    for k in ("model", "head", "device", "dtype", "prompt_text"):
        if meta.get(k) is not None and not isinstance(meta[k], str):
            raise UserError(f"the trace is malformed (meta: {k} should be a string).")
    temp = (meta.get("sampling") or {}).get("temperature")
    if temp is not None and not _num(temp):
        raise UserError("the trace is malformed (meta: the sampling temperature should be a number).")
    extra = meta.get(VIZ_KEY) or {}
    for k in ("series", "previews"):
        if extra.get(k) is not None and not isinstance(extra[k], list):
            raise UserError(f"the trace is malformed (meta: {VIZ_KEY}.{k} should be a list).")


def check_series(s: dict) -> None:
    """Raise a UserError unless a recorded decoder's series holds, cycle by cycle, the finite
    numbers the charts draw."""
    label = s.get("label")
    if not isinstance(label, str):
        raise UserError("the trace is malformed (a recorded series has no label).")
    n = len(s["tokens"]) if isinstance(s.get("tokens"), list) else None
    for k in ("tokens", "wall_s", "forwards", "accepted", "verified", "draft_calls", "verify_s", "draft_s"):
        if k not in s:
            continue
        v = s[k]
        if not (isinstance(v, list) and all(_num(x) and math.isfinite(x) for x in v)):
            raise UserError(f"the trace is malformed (the {label!r} series: {k} should be a list of numbers).")
        if len(v) > n or (k != "accepted" and len(v) != n):
            raise UserError(f"the trace is malformed (the {label!r} series: {k} has {len(v)} cycles, "
                            f"tokens {n}).")
    if "accepted" in s and any(not 0 <= a <= MAX_ACCEPTED for a in s["accepted"]):
        raise UserError(f"the trace is malformed (the {label!r} series: an accepted count is out of range).")


def load_examples() -> dict[str, list[str]]:
    """Category -> example prompts, from assets/prompts/examples.json (built-in ones if unreadable)."""
    try:
        d = json.loads(EXAMPLES_FILE.read_text(encoding="utf-8"))
        out = {}
        if isinstance(d, dict):
            for cat, items in d.items():
                if isinstance(items, str):
                    items = [items]
                prompts = [i if isinstance(i, str) else (i.get("prompt") or (i.get("turns") or [""])[0])
                           for i in items if isinstance(i, (str, dict))]
                out[str(cat)] = [p for p in prompts if p]
        elif isinstance(d, list):
            for i in d:
                if isinstance(i, dict) and (i.get("prompt") or i.get("turns")):
                    out.setdefault(str(i.get("category", "Other")), []).append(i.get("prompt") or i["turns"][0])
        if out:
            return out
    except (OSError, ValueError, TypeError, AttributeError, IndexError):
        pass
    return BUILTIN_EXAMPLES


# --------------------------------------------------------------------------------------------
# Recording them (python app.py --record-traces)
# --------------------------------------------------------------------------------------------
_VS = f"{DEFAULTS.policy} vs {DEFAULTS.compare}"   # the recordings race the default policies
RECORDINGS = [
    ("writing-greedy.json", f"Writing, greedy ({_VS})", "Writing",
     "Write a short poem about a city at night seen from a rooftop.", dict(temperature=0.0)),
    ("math-greedy.json", f"Math, greedy ({_VS})", "Math",
     "Solve for y: 5y - 3 = 2y + 12.", dict(temperature=0.0)),
    ("writing-sampled-t0.7.json", "Writing, sampled at temperature 0.7", "Writing",
     "Write a letter to your future self, to be opened in ten years.", dict(temperature=0.7, seed=1)),
]


def _round_floats(x, digits: int = 4):
    if isinstance(x, float):
        return float(f"{x:.{digits}g}")
    if isinstance(x, list):
        return [_round_floats(v, digits) for v in x]
    if isinstance(x, dict):
        return {k: _round_floats(v, digits) for k, v in x.items()}
    return x


def record_traces(bundle, out_dir: Path = TRACES_DIR, max_new_tokens: int = 48, only=None) -> list[Path]:
    """Record the shipped traces (the default race: main policy + comparison preview + comparison
    and plain series) with `bundle`."""
    from eagle2.model.timing import verify_profile
    out_dir.mkdir(parents=True, exist_ok=True)
    verify_profile(bundle)  # t(N) first, in the foreground: the policies start from it, the traces carry it
    written = []
    for fname, title, cat, prompt, kw in RECORDINGS:
        if only and fname not in only:
            continue
        s = Settings(max_new_tokens=max_new_tokens, **kw)
        sess = Session()
        sess.start(bundle, prompt, s)
        while not sess.finished:
            sess.tick()
        tr = sess.export()
        tr.meta[VIZ_KEY].update(title=title, category=cat, recorded=time.strftime("%Y-%m-%d"))
        data = _round_floats(json.loads(tr.to_json()))
        path = out_dir / fname
        path.write_text(json.dumps(data, separators=(",", ":")), encoding="utf-8")
        TRACES.load(path)  # must load back
        print(f"wrote {path} ({path.stat().st_size // 1024} KiB, {len(tr.steps)} cycles, "
              f"tau {sess.race.main.tau:.2f})", flush=True)
        written.append(path)
    return written
