"""A series: one decoder's progress, cycle by cycle, as a trace's meta records the race's other
decoders (viz/charts.py builds one from a run's steps and draws it).

A dict so it is stored and replayed as it is: "label", "role", "policy", "tokens", "wall_s",
"forwards", "accepted" always, plus what pricing a run needs (viz/whatif.py, PRICING): "verified"
(tokens verified, root included; plain decoding 1; the prefill 0), "draft_calls", "verify_s",
"draft_s". Those lists have one entry per cycle (cycle 0 = prefill), "accepted" one per drafted
cycle. Series recorded before the pricing keys existed lack them; everything but the what-if works
without. Read from a file, every number is finite and every list as long as the cycles it counts.
Built here from a decoder's steps (`series`, `extend_series`): the engine records a race's trace
with them (decoding/race.py), the page and the charts read them.
"""
from __future__ import annotations

from typing import Annotated

from pydantic import AfterValidator, Field, with_config
from typing_extensions import TypedDict   # pydantic reads typing's own only from Python 3.12

from ..phases import PHASES, split_of
from .checked import OPEN, AcceptedCount, broken

Seconds = Annotated[float, Field(allow_inf_nan=False)]   # the charts scale their axes by these


@with_config(OPEN)
class _SeriesKeys(TypedDict):
    label: str
    role: str                     # "main", "compare", "plain" (viz's ROLE_COLOURS)
    policy: str
    tokens: list[int]             # cumulative, per cycle
    wall_s: list[Seconds]         # cumulative, per cycle
    forwards: list[int]           # cumulative target forwards, per cycle
    accepted: list[AcceptedCount]  # accepted draft tokens, per drafted cycle


class Series(_SeriesKeys, total=False):
    """One decoder's progress (see the module docstring): the keys above always (read them as
    s["tokens"]), those below when recorded (PRICING: check with viz's `priced`)."""
    finished: str | None
    verified: list[int]           # PRICING, per cycle
    draft_calls: list[int]
    verify_s: list[Seconds]
    draft_s: list[Seconds]
    phases: list[list[float] | None]   # per cycle: seconds in each of PHASES (None: not recorded)


PRICING = ("verified", "draft_calls", "verify_s", "draft_s")   # per cycle; older recordings lack them
PER_CYCLE = ("tokens", "wall_s", "forwards", "phases") + PRICING


def _cycle_by_cycle(s: Series) -> Series:
    """Every per-cycle list counts the cycles tokens counts; accepted at most as many (the drafted ones)."""
    n = len(s["tokens"])
    for k in PER_CYCLE:
        if k in s and len(s[k]) != n:
            raise broken((k,), f"{len(s[k])} entries for the {n} cycles of tokens")
    if len(s["accepted"]) > n:
        raise broken(("accepted",), f"{len(s['accepted'])} entries for the {n} cycles of tokens")
    return s


RecordedSeries = Annotated[Series, AfterValidator(_cycle_by_cycle)]   # a series as a trace file holds it


def verified(step) -> int:
    """Tokens the target verified in this step's forward, root included: sum(kept) of a drafted
    tree, 1 for a plain-decoding step, 0 for the prefill (priced apart from the cycles)."""
    if step.tree is not None:
        return int(sum(step.tree.kept))
    return 0 if step.cycle == 0 else 1


def series(label: str, steps, role: str = "main") -> Series:
    """The series of a run's steps (StepTraces of one decoder, cycle 0 first)."""
    s = Series(label=label, role=role, policy=label, tokens=[], wall_s=[], forwards=[], accepted=[],
               finished=None, verified=[], draft_calls=[], verify_s=[], draft_s=[], phases=[])
    return extend_series(s, list(steps), 0)


def extend_series(s: Series, steps: list, start: int) -> Series:
    """Append steps[start:] to `s` (built from steps[:start]), in place: a live run adds each new
    cycle once instead of rebuilding its series from every step on every tick. Draft calls: the
    tree's own count, else the growth of the cumulative one (traces recorded before trees kept it)."""
    prev = int(steps[start - 1].cumulative["draft_calls"]) if start else 0
    for st in steps[start:]:
        cum = int(st.cumulative["draft_calls"])
        own = st.tree.draft_calls if st.tree is not None else 0
        s["tokens"].append(int(st.cumulative["tokens"]))
        s["wall_s"].append(float(st.cumulative["wall_s"]))
        s["forwards"].append(int(st.cumulative["target_forwards"]))
        if st.tree is not None:
            s["accepted"].append(int(st.accepted_len))
        s["verified"].append(verified(st))
        s["draft_calls"].append(int(own) if own else max(0, cum - prev))
        s["verify_s"].append(float(st.timings["verify_s"]))
        s["draft_s"].append(float(st.timings["draft_s"]))
        split = split_of(st.timings)
        s.setdefault("phases", []).append(None if split is None else [split[p] for p in PHASES])
        prev = cum
    if steps:
        s["policy"], s["finished"] = steps[0].policy, steps[-1].finished
    return s
