"""Dynamic Depth Decoding (DDD, docs/algorithms.md §5): EAGLE-2 with a data-dependent depth.

After each expansion level the beam (the top_k nodes selected for the next draft call) holds a
total draft mass H = logsumexp of their log path values. At the check levels, expansion stops if
H < threshold; otherwise it continues up to `depth` expansion levels (1 + depth draft calls).
Rerank and verification are EAGLE-2's, so DDD is lossless exactly when EAGLE-2 is.

Levels are counted in draft calls: "check at 5" means "after the 5th draft call (the root call is
the 1st), look at the beam it produced and decide whether to make a 6th". The paper's defaults
(11 draft calls at most, checks at 5/7/9, x = -0.3, k = 10) are depth = 10, check_levels =
(5, 7, 9), threshold = -0.3, top_k = 10.

Each tree records `beam_mass` (H after every draft call that produced a beam, as EAGLE-2 does)
and a DDDRecord: the threshold, check levels, max depth, one {"level", "beam_mass", "stop"} per
check level reached and the level it stopped at (None if it never stopped).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import ClassVar, Literal

import torch

from ..cycle.tree import TreeRecord
from ..cycle.tree_builder import TreeBuilder
from ..errors import UserError, check
from .base import Option
from .eagle2 import Eagle2Policy


@dataclass
class DDDRecord(TreeRecord):
    """DDD's depth checks: the beam's log mass at each check level."""
    kind: Literal["depth-checks"] = "depth-checks"
    threshold: float = -0.3
    check_levels: list[int] = field(default_factory=list)
    max_depth: int = 0
    checks: list[dict] = field(default_factory=list)     # {"level", "beam_mass", "stop"} per check reached
    stopped_at: int | None = None


@dataclass
class DDDPolicy(Eagle2Policy):
    total_tokens: int = 60
    depth: int = 10                     # max expansion levels -> at most 1 + depth draft calls
    top_k: int = 10
    check_levels: tuple = (5, 7, 9)
    threshold: float = -0.3
    stats: dict = field(default_factory=lambda: {"cycles": 0, "stops": {}, "draft_calls": 0}, init=False)
    name: ClassVar[str] = "ddd"
    record_type: ClassVar[type] = DDDRecord
    options: ClassVar[tuple] = (
        Option("--ddd-threshold", "threshold", float,
               "DDD: stop expanding when the beam's log mass is below this at a check level (default -0.3)"),
        Option("--ddd-checks", "check_levels", str,
               "DDD: comma-separated check levels in draft calls (default 5,7,9; max depth via --depth, default 10)"),
    )

    @classmethod
    def from_options(cls, **kw) -> "DDDPolicy":
        lv = kw.get("check_levels")
        if isinstance(lv, str):
            try:
                kw["check_levels"] = tuple(int(s) for s in lv.replace(" ", "").split(",") if s != "")
            except ValueError:
                raise UserError(f"--ddd-checks must be comma-separated integers such as 5,7,9 (got {lv!r}).") from None
        elif lv is None and kw.get("depth") is not None:  # a shallower max depth keeps the checks that fit
            kw["check_levels"] = tuple(s for s in cls.check_levels if s <= kw["depth"])
        return super().from_options(**kw)

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

    def stop_early(self, level: int, beam_values: torch.Tensor, tree: TreeBuilder) -> bool:
        """Called before draft call `level + 1`, with the beam produced by call `level`."""
        dd = tree.record
        if level not in self.check_levels:
            return False
        h = float(torch.logsumexp(beam_values.float(), 0))
        stop = h < self.threshold
        dd.checks.append({"level": level, "beam_mass": h, "stop": stop})
        if stop:
            dd.stopped_at = level
        return stop

    def keep(self, tree: TreeBuilder, cyc=None) -> None:
        super().keep(tree, cyc)
        s = self.stats
        s["cycles"] += 1
        s["draft_calls"] += tree.draft_calls
        stopped = tree.record.stopped_at
        key = str(stopped) if stopped is not None else "none"
        s["stops"][key] = s["stops"].get(key, 0) + 1

    def summary_stats(self) -> dict:
        s = self.stats
        return {"cycles": s["cycles"], "stopped_at_level": dict(s["stops"]),
                "draft_calls_per_cycle": s["draft_calls"] / max(1, s["cycles"])}

    def new_record(self) -> DDDRecord:
        return DDDRecord(threshold=self.threshold, check_levels=list(self.check_levels), max_depth=self.depth)
