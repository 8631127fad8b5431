"""Which forward runs each tree size: the eager one, or a compiled bucket (the rows padded up to
it), chosen by timing every option on this machine.

Why measured: which one wins depends on the CPU. On one machine the compiled forward made a
one-token step 2.1x faster than eager; on another it was slower than eager at one token and
faster from four rows on; a bucket of 8 can beat a bucket of 4 for five rows or lose to eager.
A table of times per (tree size, option), taken interleaved in one process, decides each size;
it is kept beside the packages (they are already keyed by weights, torch, ISA and thread count)
with the CPU it was taken on, and taken again on another CPU.
"""
from __future__ import annotations

import json
from pathlib import Path

import torch

from ..files import atomic_write, read_json
from ..machine import cpu_info
from .activity import DECODING
from .measurer import MEASURER
from .timing import interleaved_medians, time_forwards

FILE = "routes.json"
EAGER = "eager"


def option_name(bucket: int | None) -> str:
    return EAGER if bucket is None else f"T{bucket}"


def bucket_of(name: str) -> int | None:
    return None if name == EAGER else int(name[1:])


def fastest(times: dict[int, dict[str, float]]) -> dict[int, int | None]:
    """Each tree size's quickest option (ties go to the first listed: eager)."""
    return {n: bucket_of(min(opts, key=opts.get)) for n, opts in times.items()}


def describe(routes: dict[int, int | None]) -> str:
    """'1-2 eager, 3-4 as 4, 5-8 as 8': runs of tree sizes sharing an option."""
    parts, run = [], []
    for n in sorted(routes) + [None]:
        if run and (n is None or routes[n] != routes[run[0]] or n != run[-1] + 1):
            b = routes[run[0]]
            span = str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}"
            parts.append(f"{span} {'eager' if b is None else f'as {b}'}")
            run = []
        if n is not None:
            run.append(n)
    return ", ".join(parts)


def _options(ps, n: int) -> list[int | None]:
    return [None] + [b for b in ps.buckets if b >= n and b in ps.runners]


def _trials(ps, n: int) -> dict:
    """Switches to each option for size n, in this thread only (PackageSet.set_trial)."""
    return {option_name(b): (lambda b=b: ps.set_trial({n: b})) for b in _options(ps, n)}


def _time_sizes(ps, dev, call_for, repeats: int, stop=None) -> dict[int, dict[str, float]]:
    """Median seconds of `call_for(n)()` for each size n through each option, the options
    interleaved within every repeat (fair against the machine's drift)."""
    out = {}
    for n in ps.sizes():
        if stop is not None and stop():
            break
        try:
            out[n] = interleaved_medians(dev, _trials(ps, n), call_for(n), repeats)
        finally:
            ps.set_trial({})
    return out


def time_target(ct, context: int = 256, repeats: int = 5, stop=None) -> dict[int, dict[str, float]]:
    """The target's forward + logits of n tree tokens after `context` committed ones, per option
    (timing.time_forwards). The model's forward must route through `ct` (attached)."""
    ps = ct.target
    try:
        return time_forwards(ct.model, list(ps.sizes()), lambda n: _trials(ps, n), context, repeats, stop)
    finally:
        ps.set_trial({})


@torch.no_grad()
def time_head(ct, context: int = 256, tree: int = 20, repeats: int = 5, stop=None) -> dict[int, dict[str, float]]:
    """One draft-head call (forward + log-probabilities) on n tree nodes, per option."""
    h, ps = ct.head, ct.head_set
    dev = h.fc.weight.device
    cache = h.new_cache(context + tree + max(ps.buckets) + 1)
    cache.length = context
    g = torch.Generator().manual_seed(0)

    def call_for(n):
        feats = torch.randn(n, h.args.dim, generator=g).to(dev, h.fc.weight.dtype)
        toks = torch.randint(0, h.args.vocab_size, (n,), generator=g).to(dev)
        pos = torch.full((n,), context + 2, device=dev)
        mask = torch.cat([torch.rand(n, tree, generator=g) < 0.2, torch.eye(n, dtype=torch.bool)], 1).to(dev)
        return lambda: h.forward_logprobs(cache, feats, toks, pos, context + tree, mask)

    return _time_sizes(ps, dev, call_for, repeats, stop)


def _read(folder: Path, sets) -> dict | None:
    """The routes kept for these packages, if taken on this CPU at this thread count for the
    buckets loaded now."""
    kept = read_json(folder / FILE, None)
    if not isinstance(kept, dict) or kept.get("cpu") != cpu_key() or kept.get("threads") != torch.get_num_threads():
        return None
    try:
        out = {}
        for s in sets:
            routes = {int(n): (None if b is None else int(b)) for n, b in kept["routes"][s.kind].items()}
            if set(routes) != set(s.sizes()) or kept["buckets"][s.kind] != sorted(s.runners):
                return None  # timed with other buckets: a new one may win
            out[s.kind] = routes
        return out
    except (KeyError, TypeError, ValueError, AttributeError):
        return None


def cpu_key() -> str:
    """The CPU routes were timed on: its name, family, model and vector flags (a guest may call
    two generations "AMD EPYC")."""
    c = cpu_info()
    return f"{c['cpu']} family {c['family']} model {c['model']} {c['flags']}"


def choose(ct, log=None, tries: int = 3) -> dict:
    """Set each package set's routes from the kept table, or from timings taken now (seconds) and
    kept. Timing is a quiet measurement (model/activity.py): it waits until nothing decodes, gives
    way as soon as a decode starts, and keeps only a table timed alone; with none after `tries`,
    the packages serve on their default routes (the smallest bucket holding a size) and the next
    start times them again. Returns {kind: routes} ({} when untimed)."""
    sets = [s for s in ct.sets if s.runners]
    if not sets:
        return {}
    kept = _read(ct.folder, sets)
    for _ in range(tries if kept is None else 0):
        if not MEASURER.wait_for_quiet():
            break
        mark = DECODING.mark()
        stop = lambda: not DECODING.quiet_since(mark)  # noqa: E731
        timers = {"target": time_target, "head": time_head}
        times = {s.kind: timers[s.kind](ct, stop=stop) for s in sets}
        if stop() or any(set(times[s.kind]) != set(s.sizes()) for s in sets):
            continue   # a visitor decoded meanwhile: that was the load, not this machine's cost
        kept = {kind: fastest(t) for kind, t in times.items()}
        record = {"cpu": cpu_key(), "threads": torch.get_num_threads(),
                  "buckets": {s.kind: sorted(s.runners) for s in sets},
                  "routes": {k: {str(n): b for n, b in r.items()} for k, r in kept.items()},
                  "times_s": {k: {str(n): o for n, o in t.items()} for k, t in times.items()}}
        try:
            atomic_write(ct.folder / FILE, json.dumps(record, indent=1))
        except OSError:
            pass  # a read-only cache: chosen again at the next start
        if log:
            log("timed each tree size eager and compiled: " +
                "; ".join(f"{k} {describe(r)}" for k, r in kept.items()))
        break
    if kept is None:
        if log:
            log("not timed per tree size (no quiet moment): the default routes serve")
        return {}
    for s in sets:
        s.routes = kept[s.kind]
    return kept
