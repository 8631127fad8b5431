"""What a dashboard shows: a live session's decoders or a recorded trace, as series and steps."""
from __future__ import annotations

from dataclasses import dataclass, field

import viz
from eagle2.cycle.series import series as make_series
from eagle2.cycle.trace import VIZ_KEY, Trace
from eagle2.errors import UserError
from eagle2.policies.registry import TRACES


@dataclass
class View:
    steps: list
    series: list                                # the main decoder's first, then compare, plain
    previews: dict = field(default_factory=dict)   # cycle -> the comparison's tree on that context
    meta: dict = field(default_factory=dict)
    source: str = "live"
    greedy: bool = True
    lossy: dict = field(default_factory=dict)   # other decoders' lossy_summary (live only)
    page_s: float | None = None                 # the page's own work so far (live only): Session.page_s

    def __deepcopy__(self, memo):  # read-only once built: sessions may share one
        return self

    @classmethod
    def from_trace(cls, tr: Trace, source: str) -> "View":
        if not tr.steps:
            raise UserError("This trace has no steps.")
        label = tr.steps[0].policy
        # the race's other decoders and previews, when recorded (TRACES checked their shape)
        extra = tr.meta.get(VIZ_KEY) or {}
        series = [make_series(label, tr.steps, "main")] + list(extra.get("series") or [])
        previews = {p.cycle: p for p in map(TRACES.step, extra.get("previews") or [])}
        temp = (tr.meta.get("sampling") or {}).get("temperature", 0.0) or 0.0
        return cls(steps=list(tr.steps), series=series, previews=previews, meta=tr.meta, source=source,
                   greedy=float(temp) == 0.0)

    @property
    def drafted(self) -> list[int]:
        return [s.cycle for s in self.steps if s.tree is not None]

    def step_at(self, cycle: int | None):
        dr = self.drafted
        if not dr:
            return None
        c = dr[-1] if cycle is None or cycle not in dr else cycle
        return next(s for s in self.steps if s.cycle == c)


def cut_series(s: dict, tokens: int) -> dict:
    """A series up to the first cycle that reached `tokens` tokens."""
    n = 0
    for n, t in enumerate(s["tokens"], 1):
        if t >= tokens:
            break
    return viz.charts.truncate(s, n)
