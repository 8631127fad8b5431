"""A browser session: the engine's lockstep race (eagle2/cycle/race.py) plus what the page needs
of it: settings read from the controls, Stop, a View to draw, and an export with every series."""
from __future__ import annotations

import viz
from eagle2.cycle.race import Race, RaceSettings
from eagle2.cycle.trace import Trace
from eagle2.errors import UserError
from viz.charts import series as make_series

from .model import MODEL
from .view import VIZ_KEY, View

# The engine's own defaults, whatever the device: what the shipped traces record (ui/traces.py).
# The page's controls start at defaults(), which depend on the device the page was launched for.
DEFAULTS = RaceSettings()


def device_kind(device: str | None = None) -> str:
    """'cuda' or 'cpu': the kind of `device`, by default the one the page's model was started for
    (app.py's --device). Read from the option string, so nothing asks torch."""
    d = MODEL.options.get("device") if device is None else device
    return "cuda" if str(d or "cpu").strip().lower().startswith("cuda") else "cpu"


def defaults(device: str | None = None) -> RaceSettings:
    """The controls' initial values and the fallbacks for empty ones: what pays on that device."""
    return RaceSettings.for_device(device_kind(device))


class Settings(RaceSettings):
    """The race's settings, read from the page's controls."""

    @classmethod
    def from_ui(cls, policy, compare, total_tokens, depth, top_k, temperature, top_p, seed, max_new_tokens,
                side_by_side=True) -> "Settings":
        def as_int(v, name):
            try:
                f = float(v)
            except (TypeError, ValueError):
                raise UserError(f"{name} must be a whole number (got {v!r}).") from None
            if f != int(f):
                raise UserError(f"{name} must be a whole number (got {v!r}).")
            return int(f)
        d = defaults()
        s = cls(policy=str(policy or d.policy), compare=str(compare or d.compare),
                total_tokens=as_int(total_tokens, "Total tokens N"), depth=as_int(depth, "Depth"),
                top_k=as_int(top_k, "Top-k"), temperature=float(temperature or d.temperature),
                top_p=float(d.top_p if top_p is None else top_p),
                seed=as_int(d.seed if seed in (None, "") else seed, "Seed"),
                max_new_tokens=as_int(max_new_tokens, "Max new tokens"), side_by_side=bool(side_by_side))
        s.validate()
        return s


class Session(Race):
    """One browser session: the engine's lockstep race, plus what the page needs of it."""

    def __init__(self):
        super().__init__()
        self.stop_requested = False   # set by Stop; Run ends after the cycle in progress

    def __deepcopy__(self, memo):  # gr.State copies its value; a session is never shared
        return self

    def view(self) -> View:
        la, lb, lc = self.labels()
        series = [make_series(la, self.main.trace.steps, "main"),
                  make_series(lb, self.cmp.trace.steps, "compare"),
                  make_series(lc, self.plain.trace.steps, "plain")]
        return View(steps=list(self.main.trace.steps), series=series, previews=dict(self.previews),
                    meta=self.main.trace.meta, source="live", greedy=self.main.sampling.greedy,
                    lossy={lb: viz.lossy_summary(self.cmp.trace.steps)})

    def export(self) -> Trace:
        """The main decoder's trace, with the other decoders' series and the previews in meta."""
        v = self.view()
        meta = dict(self.main.trace.meta)
        meta[VIZ_KEY] = {"series": v.series[1:], "previews": [p.to_dict() for p in self.previews.values()],
                         "compare_policy": self.cmp.policy_name}
        return Trace(meta=meta, steps=list(self.main.trace.steps))
