"""The process's one background measurer of t(N) (model/calibration.py): no visitor's Step measures.

The app asks it at start-up; a budget asks it when the cache
has no plausible table for its forward (it starts meanwhile from priors.prior_times). One
worker thread measures, one request per cache key at a time. It measures only when nothing has
decoded in this process for `settle_s` seconds, gives way as soon as a decode starts (the
measurement is then discarded, not cached), and tries again `tries` times, each wait bounded.

The worker is a daemon thread: the interpreter's exit does not wait for its measurement. (A
ThreadPoolExecutor's worker is joined at exit before the main thread counts as stopped, so a
measurement under way held a command-line tool's exit for its whole length, 13 s measured; an
abandoned measurement is simply not cached, the cache being written whole under its lock.) It
waits, at most EXIT_WAIT_S, for the size being timed to end (the measurement stops at the next size
once the main thread has ended, `calibration.measure_quietly`): a daemon thread still inside
torch's C++ when the interpreter finalises is ended there by an unwind that C++ does not let pass,
and the process aborted ("terminate called without an active exception") in about one exit in five
on a loaded 2-core machine.
"""
from __future__ import annotations

import atexit
import logging
import os
import queue
import threading
import time
from concurrent.futures import Future

from . import calibration
from .activity import DECODING

log = logging.getLogger(__name__)

EXIT_WAIT_S = 5.0   # at the interpreter's exit, the longest wait for the size being timed to end


class Measurer:
    def __init__(self, tries: int = 3, settle_s: float = 1.0, wait_s: float = 600.0, close_s: float = 600.0):
        self.tries, self.settle_s, self.wait_s, self.close_s = tries, settle_s, wait_s, close_s
        self._closed = threading.Event()
        self._fresh()

    def _fresh(self) -> None:
        """No worker yet (the first request starts one), nothing queued."""
        self._lock = threading.Lock()
        self._pending: dict[str, Future] = {}
        self._queue: queue.SimpleQueue = queue.SimpleQueue()
        self._worker: threading.Thread | None = None

    def request(self, bundle, refresh: bool = False) -> Future:
        """Have t(N) measured for `bundle`'s forward unless the cache holds a plausible table
        (`refresh`: measure anyway); returns at once. The future's result: the plausible table
        cached, or None if no quiet moment came (or the measurer is closed). A request for a key
        already queued joins it."""
        key = calibration.cache_key(bundle)
        with self._lock:
            if self._closed.is_set():
                f = Future()
                f.set_result(None)
                return f
            f = self._pending.get(key)
            if f is None or f.done():
                f = self._pending[key] = Future()
                self._queue.put((f, bundle, refresh))
                if self._worker is None:
                    self._worker = threading.Thread(target=self._serve, name="eagle2-t(N)-measurer", daemon=True)
                    self._worker.start()
                    atexit.register(self._at_exit, self._worker)
            return f

    def _serve(self) -> None:
        """The worker: each queued request in turn, until close() sends None."""
        while (item := self._queue.get()) is not None:
            f, bundle, refresh = item
            if not f.set_running_or_notify_cancel():   # cancelled by close() while queued
                continue
            try:
                f.set_result(self._run(bundle, refresh))
            except BaseException as e:   # the request's caller reads it from the future
                f.set_exception(e)

    def _run(self, bundle, refresh: bool) -> dict[int, float] | None:
        if not refresh:
            t = calibration.verify_profile(bundle, measure=False)
            if t is not None:
                return t
        for _ in range(self.tries):
            if not self.wait_for_quiet():
                break
            t, quiet = calibration.measure_quietly(bundle, give_way=True)
            if quiet and calibration.plausible(t):
                return t
        log.info("t(N) not measured for %s: no quiet moment, or no plausible table, in %d tries",
                 calibration.cache_key(bundle), self.tries)
        return None

    def wait_for_quiet(self) -> bool:
        """Until nothing has decoded for settle_s seconds (True), or wait_s seconds have passed, the
        interpreter is exiting or the measurer is closed (False). Polls with a growing pause: a busy
        class is not asked several times a second."""
        deadline, pause = time.monotonic() + self.wait_s, 0.05
        while DECODING.idle_s() < self.settle_s:
            if time.monotonic() >= deadline or not threading.main_thread().is_alive():
                return False
            if self._closed.wait(pause):   # a pause that close() cuts short
                return False
            pause = min(2 * pause, 2.0)
        return not self._closed.is_set()

    def _at_exit(self, worker: threading.Thread) -> None:
        """At the interpreter's exit (after the main thread has ended, before finalisation): closed,
        the worker's measurement stopping at the next size, waited for EXIT_WAIT_S at most."""
        if worker.is_alive():
            self.close(EXIT_WAIT_S)

    def after_fork(self) -> None:
        """In a forked child: a worker thread, lock and queue of its own (the parent's worker is
        not in the child, and a request queued to it would never run)."""
        self._fresh()

    def close(self, wait_s: float | None = None) -> None:
        """Measure nothing more: queued requests are cancelled, one waiting for a quiet moment gives
        up (its result None), one measuring finishes; returns once the worker has stopped, or after
        `wait_s` (default close_s) seconds with a line in the log (a bounded wait). Each
        test closes its own at its end (tests/conftest.py): a measurement that outlived its test
        wrote where the configuration pointed when it finished, another test's cache or, after the
        session, the user's."""
        with self._lock:   # no request is queued after this
            self._closed.set()
            queued, worker = list(self._pending.values()), self._worker
        for f in queued:
            f.cancel()   # only a request not yet running is cancelled
        self._queue.put(None)
        wait_s = self.close_s if wait_s is None else wait_s
        if worker is not None:
            worker.join(wait_s)
            if worker.is_alive():
                log.warning("the t(N) measurer did not stop within %.0f s of being closed", wait_s)


MEASURER = Measurer()
if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=lambda: MEASURER.after_fork())   # the measurer in place then


def request_measurement(bundle, refresh: bool = False) -> Future:
    """MEASURER.request, read when called (the tests put a measurer of their own in its place)."""
    return MEASURER.request(bundle, refresh)
