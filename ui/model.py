"""The model: loaded once per process, in the background, while the page already serves."""
from __future__ import annotations

import logging
import threading
import time
from concurrent import futures
from concurrent.futures import Future
from pathlib import Path

from eagle2.devices import is_cuda
from eagle2.errors import UserError
from eagle2.heap import transient_blocks_mapped, trim_heap
from eagle2.policies.registry import default_policy

log = logging.getLogger(__name__)
MEASURE_AT_LOAD_S = 600.0   # the loader's wait for t(N) (seconds at most, on a quiet machine)


def in_background(fn, name: str) -> Future:
    """fn() in a daemon thread, its result or exception as a Future. Not an executor: its worker
    is joined when the interpreter exits, so Ctrl-C during a long load would wait for the load."""
    fut: Future = Future()
    fut.set_running_or_notify_cancel()

    def run() -> None:
        try:
            fut.set_result(fn())
        except BaseException as e:  # the Future carries it to whoever asks
            fut.set_exception(e)
    threading.Thread(target=run, name=name, daemon=True).start()
    return fut


class ModelHolder:
    """Loads the Bundle once, in the background, and tells the page how it is going. `loading`:
    the load as a Future (its result the Bundle; its exception why it failed), None until started."""

    def __init__(self):
        self.loading: Future | None = None
        self.warning: str | None = None
        self.stage = "not started"
        self.t0 = None
        self.elapsed = None
        self.options: dict = {}
        self.recalibrate = False     # re-measure t(N) once loaded (app.py --recalibrate)

    def start(self, target=None, head=None, device="cpu", dtype=None, recalibrate: bool = False) -> None:
        """Load in the background; `recalibrate` re-measures this machine's t(N) once loaded."""
        if self.loading is not None:
            return
        self.options = dict(target=target, head=head, device=device, dtype=dtype)
        self.recalibrate = recalibrate
        self.t0 = time.time()
        self.stage = "starting"
        self.loading = in_background(self._load, "eagle2-model-loader")

    def _load(self):
        """The Bundle, loaded, warmed up and timed. The stage says "failed" before the Future
        does (a caller woken by the failure reads it); a bug's traceback goes to the log."""
        try:
            b = self._load_bundle()
        except (UserError, OSError):  # missing weights, no network, a full disk: said on the page
            self.stage = "failed"
            raise
        except Exception:  # a bug: the page says so (error), Replay still works
            log.exception("the model could not be loaded")
            self.stage = "failed"
            raise
        self.stage = "ready"
        self.elapsed = time.time() - self.t0
        return b

    def _load_bundle(self):
        self.stage = "importing the engine (torch)"
        from eagle2.model.loading import load_bundle
        opts = dict(self.options)
        self.stage = "loading the target model and the draft head"
        with transient_blocks_mapped():
            try:
                b = load_bundle(**opts)
            except UserError as e:
                if not is_cuda(opts.get("device")):
                    raise
                self.warning = (f"{e} Running on CPU instead; the controls start at the GPU's defaults, and "
                                f"{default_policy('cpu')} is the policy that pays on a CPU.")
                opts["device"], opts["dtype"] = "cpu", None
                b = load_bundle(**opts)
        self.stage = "warming up (token table)"
        b.token_texts([0])
        # t(N), the auto budget's starting costs: measured now if this machine has no table
        # (seconds, before any visitor decodes: a quiet measurement), so the first Steps start
        # from it rather than from an estimate
        self.stage = "measuring this machine's verification costs t(N)"
        self._measure_costs(b)
        trim_heap()   # what loading and warming freed (the tokenizer's parse, the decode of its table)
        return b

    def _measure_costs(self, b) -> None:
        """t(N) now, by the background measurer (the one that measures while the page serves), the
        loader waiting for it. Only a head start: if it fails, the auto budget starts from an
        estimate and asks the measurer again."""
        from eagle2.model.measurer import request_measurement
        try:
            request_measurement(b, refresh=self.recalibrate).result(timeout=MEASURE_AT_LOAD_S)
        except (UserError, RuntimeError, OSError, TimeoutError) as e:
            log.warning("t(N) not measured at start-up (%s: %s)", type(e).__name__, e)

    def forward_line(self) -> str:
        """Which forwards run (load_bundle chose them once)."""
        b = self.bundle
        return b.description if b is not None else ""

    def set(self, bundle) -> None:
        """Use an already loaded bundle (tests, the trace recorder)."""
        done: Future = Future()
        done.set_result(bundle)
        self.loading = done
        self.stage = "ready"
        self.elapsed = time.time() - self.t0 if self.t0 else 0.0

    @property
    def bundle(self):
        """The loaded Bundle (None while loading, or if the load failed)."""
        f = self.loading
        return f.result() if f is not None and f.done() and f.exception() is None else None

    @property
    def error(self) -> str | None:
        """Why the load failed, in a line for the page and the terminal (None unless it failed)."""
        f = self.loading
        e = f.exception() if f is not None and f.done() else None
        if e is None:
            return None
        if isinstance(e, UserError):
            return str(e)
        if isinstance(e, OSError):
            return f"{type(e).__name__}: {e}"
        return f"unexpected {type(e).__name__}: {e} (the server's log has the traceback)"

    @property
    def ready(self) -> bool:
        return self.bundle is not None

    def wait(self, timeout: float | None = None) -> bool:
        """Until the model is loaded or has failed (True), or `timeout` seconds (False); False at
        once if no load was started."""
        return self.loading is not None and not futures.wait([self.loading], timeout).not_done

    def get(self, timeout: float = 600.0):
        if self.loading is None:
            self.start(**self.options) if self.options else self.start()
        try:
            self.loading.result(timeout)
        except futures.TimeoutError:
            raise UserError(f"The model is still loading ({self.stage}); try again in a moment.") from None
        except Exception:
            raise UserError(f"The model could not be loaded: {self.error}") from None
        return self.bundle

    def info_md(self) -> str:
        if self.bundle is not None:
            b = self.bundle
            dev = f"{b.device.type} · {b.precision or str(b.dtype).replace('torch.', '')}"
            head = str(b.head_name)
            if Path(head).is_absolute():  # a machine path (a bundle from elsewhere): its folder's name
                head = Path(head).name
            if "random" in head:
                head += " — acceptance is near zero until a trained head is installed"
            warn = f'<span class="warnbadge">⚠ {self.warning}</span> ' if self.warning else ""
            return (f'{warn}<span class="okdot">●</span> <b>{b.name.split(" (")[0]}</b> on <b>{dev}</b> · '
                    f"draft head: {head} · ready in {self.elapsed or 0:.1f} s · {self.forward_line()}")
        if self.error:
            return f'<span class="errbadge">✖ model failed to load: {self.error}</span> — Replay still works.'
        el = time.time() - self.t0 if self.t0 else 0.0
        return (f'<span class="loaddot">●</span> Loading the model: {self.stage} … {el:.0f} s. '
                f"Meanwhile the page shows a recorded trace.")


MODEL = ModelHolder()
