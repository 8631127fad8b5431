"""The recorded traces shipped in assets/traces (listing, loading, re-recording) and the example
prompts."""
from __future__ import annotations

import json
import time
from pathlib import Path

from eagle2.errors import UserError
from eagle2.decoding.recorded_race import device_name, record_settings, run_race
from eagle2.model.weights import ASSETS
from eagle2.policies.registry import TRACES
from eagle2.cycle.trace import DEVICE_NAME, VIZ_KEY

from .view import View

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
# Uploaded traces: anything may arrive (the reader checks what a trace holds; the page, how much)
# --------------------------------------------------------------------------------------------
MAX_UPLOAD_MB = 100     # room for long runs with large trees (the shipped 48-token traces: 0.3-0.5 MB)


def read_upload(path) -> View:
    """An uploaded trace file's View. Whatever the file holds (not JSON, not text, empty, huge,
    nested too deeply, the wrong shape), a file that is not a trace this page can draw raises one
    UserError, "Could not read this trace: ...", and nothing else."""
    path = Path(path)
    try:
        return View.from_trace(TRACES.from_json(_upload_bytes(path)), path.name)
    except UserError as e:
        raise e.about("Could not read this trace") from None
    except MemoryError:
        raise UserError("Could not read this trace: it is too large to read here.") from None


def _upload_bytes(path: Path) -> bytes:
    try:
        size = path.stat().st_size
        if size == 0:
            raise UserError("The file is empty.")
        if size > MAX_UPLOAD_MB * 2 ** 20:
            raise UserError(f"The file is {size / 2 ** 20:.0f} MB; this page reads traces of up to "
                            f"{MAX_UPLOAD_MB} MB.")
        return path.read_bytes()
    except OSError as e:
        raise UserError(f"The file cannot be opened ({e.strerror or e}).") from None


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
# What a live page on a CPU runs at its defaults (defaults("cpu"): eagle2-auto against the static
# tree and plain, the embedded model in q4_1, one thread a session): the page opens on the first,
# so its first claim is the one Step then makes. The GPU traces (gpu-*.json) stay in Replay.
RECORDINGS = [
    ("writing-greedy.json", "Writing, greedy", "Writing",
     "Write a short poem about a city at night seen from a rooftop.", dict(temperature=0.0)),
    ("math-greedy.json", "Math, greedy", "Math",
     "Solve for y: 5y - 3 = 2y + 12.", dict(temperature=0.0)),
    ("writing-sampled-t0.7.json", "Writing, sampled at temperature 0.7", "Writing",
     "Write a letter to your future self, to be opened in ten years.", dict(temperature=0.7, seed=1)),
]


def record_traces(bundle, out_dir: Path = TRACES_DIR, max_new_tokens: int = 48, only=None) -> list[Path]:
    """Record the shipped CPU traces with `bundle` at this process's threads: each the race a live
    CPU page runs at its defaults (recorded_race.record_settings: main policy + comparison preview
    + comparison and plain series), titled with the policies, the precision and the CPU."""
    import torch

    from eagle2.model.calibration import verify_profile
    out_dir.mkdir(parents=True, exist_ok=True)
    verify_profile(bundle)  # t(N) first, in the foreground: the policies start from it, the traces carry it
    cpu = device_name(bundle.device)
    written = []
    for fname, title, cat, prompt, kw in RECORDINGS:
        if only and fname not in only:
            continue
        s = record_settings("cpu", max_new_tokens, **kw)
        race = run_race(bundle, prompt, s)   # the race a live page ticks, to the end of the answer
        tr = race.export()
        tr.meta[DEVICE_NAME], tr.meta["threads"] = cpu, torch.get_num_threads()
        tr.meta[VIZ_KEY].update(title=f"{title} ({s.policy} vs {s.compare}, {tr.meta['dtype']}, {cpu})",
                                category=cat, recorded=time.strftime("%Y-%m-%d"))
        path = out_dir / fname
        path.write_text(tr.to_json(digits=4), encoding="utf-8")
        TRACES.load(path)  # must load back
        print(f"wrote {path} ({path.stat().st_size // 1024} KiB, {len(tr.steps)} cycles, "
              f"tau {race.main.tau:.2f})", flush=True)
        written.append(path)
    return written
