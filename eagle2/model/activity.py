"""Decoding in flight in this process, counted so that a measurement can tell whether it ran alone.

A t(N) table timed while visitors decode measures the machine's load, not its cost (on a 2-core
CPU shared by 8 sessions, several times too high). The decoders enter `DECODING` for every start,
step and preview; model/measurer.py measures only when nothing has decoded for a while, and keeps
a measurement only if no decode was in flight when it began and none started before it ended.
"""
from __future__ import annotations

import contextlib
import math
import os
import threading
import time


class Activity(contextlib.ContextDecorator):
    """A counter of work in flight: `with DECODING:` (or `@DECODING` on a method) around each piece
    of decoding; reentrant (a step inside a generate counts once more, harmlessly)."""

    def __init__(self):
        self._lock = threading.Lock()
        self.in_flight = 0
        self.started = 0              # pieces ever started: a measurement compares it before and after
        self._last_end = -math.inf    # time.monotonic() when the last piece ended

    def __enter__(self):
        with self._lock:
            self.in_flight += 1
            self.started += 1
        return self

    def __exit__(self, *exc) -> bool:
        with self._lock:
            self.in_flight -= 1
            self._last_end = time.monotonic()
        return False

    def idle_s(self) -> float:
        """Seconds since the last piece ended (infinite if none ever ran), 0 while one runs."""
        with self._lock:
            return 0.0 if self.in_flight else time.monotonic() - self._last_end

    def mark(self) -> int | None:
        """Where a quiet stretch begins: the count of pieces started so far, None if one runs now."""
        with self._lock:
            return None if self.in_flight else self.started

    def after_fork(self) -> None:
        """In a forked child (a ZeroGPU worker runs in one): a new lock, since the parent's may have
        been held at the fork by a thread the child does not have, and nothing in flight."""
        self._lock = threading.Lock()
        self.in_flight = 0

    def quiet_since(self, mark: int | None) -> bool:
        """Whether nothing has decoded since `mark` (nothing in flight then, none started since)."""
        with self._lock:
            return mark is not None and self.started == mark and not self.in_flight


DECODING = Activity()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=DECODING.after_fork)
