"""Where a cycle's time goes: its phases, named once, and the clock that splits a cycle into them.

A decoder times every cycle with one `PhaseClock`: each `lap(phase)` charges the wall time since
the previous lap to that phase, so the phases add up to the cycle's whole time with nothing
counted twice and nothing left out. The draft head's runner laps around each head call, the
target's forward around its own call, the decoder around the rest (docs/algorithms.md §2).
Torch-free: the trace types and the page read the names.
"""
from __future__ import annotations

import time
from typing import Callable

# (name, what it holds), in the order a cycle runs them
PHASE_TEXT = (
    ("draft_head", "the draft head's forwards: absorbing the last cycle's tokens, then one call per level"),
    ("draft_tree", "drafting around the head: top-k, growing the tree, the policy's choices and rerank"),
    ("verify_inputs", "the verification's inputs: tokens, positions and the tree mask (a greedy cycle in one "
                      "call of the kernels: the call's arguments and what it returns)"),
    ("target_forward", "the target's forward over the root and the kept nodes (the one it cannot skip)"),
    ("accept", "acceptance: the path the target agrees with, and the bonus token"),
    ("cache_commit", "committing the accepted nodes' K/V and making the next state"),
    ("policy", "the policy's bookkeeping: learning from the cycle's timing"),
)
PHASES = tuple(name for name, _ in PHASE_TEXT)
# the coarse split every trace has held (draft / verify / commit), as sums of phases
GROUPS = {"draft_s": ("draft_head", "draft_tree"),
          "verify_s": ("verify_inputs", "target_forward", "accept"),
          "commit_s": ("cache_commit", "policy")}
# the phases that are forwards of a model; the rest is work around them
FORWARDS = ("draft_head", "target_forward")


def key(phase: str) -> str:
    """The phase's key in a step's timings (seconds)."""
    return f"{phase}_s"


class PhaseClock:
    """Splits a stretch of wall time into phases: `lap(phase)` charges the time since the last lap
    (or since the clock started) to `phase`. `now` reads the time: the decoder's waits for its
    device first (CUDA runs asynchronously)."""

    def __init__(self, now: Callable[[], float] = time.perf_counter):
        self._now = now
        self.spent = dict.fromkeys(PHASES, 0.0)
        self._t = now()

    def now(self) -> float:
        """The time on this clock's reading, charged to no phase (a policy timing its own work
        reads the cycle's time, so a decoder given another clock drives both)."""
        return self._now()

    def lap(self, phase: str) -> float:
        """Charge the time since the last lap to `phase`; returns those seconds."""
        now = self._now()
        dt = now - self._t
        self.spent[phase] += dt
        self._t = now
        return dt

    def lap_within(self, phase: str, inner: str, inner_s: float) -> float:
        """Charge the time since the last lap to `phase`, except `inner_s` of it (timed inside the
        same stretch: the draft head's steps within the kernels' drafting) to `inner`."""
        dt = self.lap(phase)
        inner_s = min(max(inner_s, 0.0), dt)
        self.spent[phase] -= inner_s
        self.spent[inner] += inner_s
        return dt

    def lap_split(self, parts: dict[str, float], rest: str) -> float:
        """Charge the time since the last lap to the phases in `parts` (seconds timed inside that
        stretch: the kernels' one-call cycle timing its parts) and what they leave to `rest`."""
        dt = self.lap(rest)
        left = dt
        for phase, seconds in parts.items():
            seconds = min(max(seconds, 0.0), left)
            left -= seconds
            self.spent[rest] -= seconds
            self.spent[phase] += seconds
        return dt

    def add(self, phase: str, seconds: float) -> None:
        """Charge seconds measured elsewhere (work done before this cycle's clock started)."""
        self.spent[phase] += seconds

    def timings(self) -> dict[str, float]:
        """A step's timings: every phase's seconds, the coarse groups and the total."""
        out = {key(p): v for p, v in self.spent.items()}
        out.update(grouped(self.spent))
        out["total_s"] = sum(self.spent.values())
        return out


def grouped(spent: dict[str, float]) -> dict[str, float]:
    """Seconds per phase summed into the coarse groups (GROUPS: draft_s, verify_s, commit_s)."""
    return {g: sum(spent[p] for p in ps) for g, ps in GROUPS.items()}


def split_of(timings: dict) -> dict[str, float] | None:
    """A step's (or a run's summed) seconds per phase, or None where they were not recorded
    (traces written before phases were timed)."""
    if not all(key(p) in timings for p in PHASES):
        return None
    return {p: float(timings[key(p)]) for p in PHASES}
