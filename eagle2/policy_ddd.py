"""Dynamic Depth Decoding (DDD, algorithms.md section 5): EAGLE-2 with a data-dependent depth.

After each expansion level the beam (the top_k nodes selected for the next draft call) holds a
total draft mass H = logsumexp of their log path values. At the check levels, expansion stops if
H < threshold; otherwise it continues up to `depth` expansion levels (1 + depth draft calls).
Rerank and verification are EAGLE-2's, so DDD is lossless exactly when EAGLE-2 is.

Levels are counted in draft calls: "check at 5" means "after the 5th draft call (the root call is
the 1st), look at the beam it produced and decide whether to make a 6th". The paper's defaults
(11 draft calls at most, checks at 5/7/9, x = -0.3, k = 10) are depth = 10, check_levels =
(5, 7, 9), threshold = -0.3, top_k = 10.

Each tree records, in `tree.extra`:
  beam_mass   H after every draft call that produced a beam (EAGLE-2 records this too),
  ddd         {"threshold", "check_levels", "max_depth",
               "checks": [{"level", "beam_mass", "stop"}...],  # one per check level reached
               "stopped_at": level or None, "draft_calls": calls made this cycle}.
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from .drafting import HeadRunner
from .errors import check
from .policies import Eagle2Policy
from .tree import DraftTree


@dataclass
class DDDPolicy(Eagle2Policy):
    total_tokens: int = 60
    depth: int = 10                     # max expansion levels -> at most 1 + depth draft calls
    top_k: int = 10
    check_levels: tuple = (5, 7, 9)
    threshold: float = -0.3
    name: str = "ddd"
    stats: dict = field(default_factory=lambda: {"cycles": 0, "stops": {}, "draft_calls": 0})

    def validate(self) -> None:
        super().validate()
        lv = self.check_levels
        check(isinstance(lv, (list, tuple)) and all(isinstance(s, int) and not isinstance(s, bool) for s in lv),
              f"DDD check levels must be a list of integers, e.g. 5,7,9 (got {lv!r}).")
        check(all(1 <= s <= self.depth for s in lv),
              f"DDD check levels must lie in [1, depth={self.depth}] (draft calls after which to "
              f"check; got {list(lv)}). Raise --depth or lower the levels.")
        check(len(set(lv)) == len(lv), f"DDD check levels must be distinct (got {list(lv)}).")
        t = self.threshold
        check(isinstance(t, (int, float)) and not isinstance(t, bool) and math.isfinite(t),
              f"DDD threshold must be a finite number (got {t!r}).")
        check(t <= 0.0, f"DDD threshold is a log-probability and must be <= 0 (got {t}): the beam's "
                        f"total mass never exceeds 1, so a positive threshold would always stop.")
        self.check_levels = tuple(sorted(lv))

    def stop_early(self, level: int, beam_values: torch.Tensor, info: dict, tree=None) -> bool:
        """Called before draft call `level + 1`, with the beam produced by call `level`."""
        dd = info.setdefault("ddd", {"threshold": self.threshold, "check_levels": list(self.check_levels),
                                     "max_depth": self.depth, "checks": [], "stopped_at": None})
        if level not in self.check_levels:
            return False
        h = float(torch.logsumexp(beam_values.float(), 0))
        stop = h < self.threshold
        dd["checks"].append({"level": level, "beam_mass": h, "stop": stop})
        if stop:
            dd["stopped_at"] = level
        return stop

    def draft(self, runner: HeadRunner, root: int) -> DraftTree:
        tree = super().draft(runner, root)
        dd = tree.extra.setdefault("ddd", {"threshold": self.threshold, "check_levels": list(self.check_levels),
                                           "max_depth": self.depth, "checks": [], "stopped_at": None})
        dd["draft_calls"] = runner.calls
        s = self.stats
        s["cycles"] += 1
        s["draft_calls"] += runner.calls
        key = str(dd["stopped_at"]) if dd["stopped_at"] is not None else "none"
        s["stops"][key] = s["stops"].get(key, 0) + 1
        return tree

    def summary_stats(self) -> dict:
        s = self.stats
        return {"cycles": s["cycles"], "stopped_at_level": dict(s["stops"]),
                "draft_calls_per_cycle": s["draft_calls"] / max(1, s["cycles"])}


def make_ddd(total_tokens=None, depth=None, top_k=None, threshold=None, check_levels=None) -> DDDPolicy:
    if check_levels is None and depth is not None:  # a shallower max depth keeps the checks that fit
        check_levels = tuple(s for s in DDDPolicy.check_levels if s <= depth)
    kw = dict(total_tokens=total_tokens, depth=depth, top_k=top_k, threshold=threshold, check_levels=check_levels)
    return DDDPolicy(**{k: v for k, v in kw.items() if v is not None})
