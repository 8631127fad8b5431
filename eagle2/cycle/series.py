"""A series: one decoder's progress, cycle by cycle, as a trace's meta records the race's other
decoders (viz/charts.py builds one from a run's steps and draws it).

A dict so it is stored and replayed as it is: "label", "role", "policy", "tokens", "wall_s",
"forwards", "accepted" always, plus what pricing a run needs (viz/whatif.py, PRICING): "verified"
(tokens verified, root included; plain decoding 1; the prefill 0), "draft_calls", "verify_s",
"draft_s". Those lists have one entry per cycle (cycle 0 = prefill), "accepted" one per drafted
cycle. Series recorded before the pricing keys existed lack them; everything but the what-if works
without.
"""
from __future__ import annotations

from typing import TypedDict


class _SeriesKeys(TypedDict):
    label: str
    role: str                     # "main", "compare", "plain" (viz's ROLE_COLOURS)
    policy: str
    tokens: list[int]             # cumulative, per cycle
    wall_s: list[float]           # cumulative, per cycle
    forwards: list[int]           # cumulative target forwards, per cycle
    accepted: list[int]           # accepted draft tokens, per drafted cycle


class Series(_SeriesKeys, total=False):
    """One decoder's progress (see the module docstring): the keys above always (read them as
    s["tokens"]), those below when recorded (PRICING: check with viz's `priced`)."""
    finished: str | None
    verified: list[int]           # PRICING, per cycle
    draft_calls: list[int]
    verify_s: list[float]
    draft_s: list[float]
    phases: list[list[float] | None]   # per cycle: seconds in each of PHASES (None: not recorded)


SERIES_KEYS = frozenset(Series.__required_keys__)   # what every series holds (a recorded one too)
PRICING = ("verified", "draft_calls", "verify_s", "draft_s")   # per cycle; older recordings lack them
PER_CYCLE = ("tokens", "wall_s", "forwards", "phases") + PRICING
