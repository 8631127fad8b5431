"""The target's forward and the draft head's, compiled ahead of time (gpt-fast's idea,
AOTInductor's packaging; what is compiled: exported.py).

One package per function and tree-size bucket, built by torch.export + AOTInductor with
max-autotune and frozen weights, so inductor packs every weight once and streams it through its
own C++ micro-GEMM (on this CPU ~2x faster than the eager oneDNN/MKL path at 1-4 rows:
benchmarks/compiled-forward).

Why this shape (each measured; benchmarks/compiled-forward/README.md): AOTInductor, not
torch.compile: inductor's on-disk FX cache refuses graphs whose frozen, prepacked weights are
mkldnn tensors, so a JIT compile would cost 1-2 minutes at every start; a package compiles once
(in a background process) and later loads in a few seconds. Which forward runs each tree size is
timed on this machine (routes.py): the eager one, or a loaded bucket at least that large, the rows
padded up to it (pad rows see only themselves and are dropped); until it is timed, the smallest
loaded bucket that holds the size. The eager path (llama.py, head.py) stays the reference and runs
the rest (the prefill, sizes whose fastest route is eager or above the largest bucket, no package
yet, CUDA).
"""
from __future__ import annotations

import atexit
import json
import logging
import os
import subprocess
import sys
import threading
import zipfile
from pathlib import Path

import torch

from . import routes
from . import nogil
from .constants import SharedConstants
from .exported import HeadForward, TreeForward, build_package
from .llama import LlamaModel, split_masks
from .packages import blob_path, compile_report, head_prefix, package_dir, unpack, write_meta

# the target's buckets; which one runs each tree size is timed on the machine (routes.py). One row
# has its own: on a Zen 4 at 1 thread (the app's layout on 2 vCPUs) T1 took 23.5 ms against 38.3 ms
# padded to T4 and 48 ms eager; at 2 threads 21.1 against 23.2 (benchmarks/forward-routes)
BUCKETS = (1, 4, 8)
# draft head, measured: 1-4 nodes take 1.3-2.0 ms against 2.2-3.6 eager; padded to 8 or 16 the
# compiled head was slower than eager (3.0-8 ms), so larger calls stay eager
HEAD_BUCKETS = (4,)
ROUTE_DEFAULT = object()  # a tree size without a measured route: the smallest loaded bucket holding it


RUN_SLOTS = 4  # model instances per package: callers that can run one at once (they share the weights)


class Runner:
    """A compiled function loaded from its .so, its constants the shared copies (constants.py);
    called like the function, from any number of threads. The graph runs no Python, so a call lets
    go of the GIL where the GIL-free runner is built (nogil.py); a caller beyond the `slots`
    instances waits for one inside the container."""

    def __init__(self, so: Path, blob: Path, constants: SharedConstants, function, slots: int = RUN_SLOTS):
        self.container = constants.load(so, blob, function, slots)
        self._run, _ = nogil.run_function()  # the GIL-free one when built

    def __call__(self, *args):
        return self._run(self.container, list(args))


class PackageSet:
    """The compiled packages of one function ("target" or "head"), one per bucket, loaded as they
    land. On disk each is T{n}.so + T{n}.blob, its constants (unpacked from AOTInductor's .pt2 once built)."""

    def __init__(self, kind: str, module, buckets, folder: Path, constants: SharedConstants, prefix: str = ""):
        self.kind, self.module, self.folder, self.prefix = kind, module, folder, prefix
        self.constants = constants
        self.function = TreeForward(module) if kind == "target" else HeadForward(module)  # what was exported
        self.buckets = tuple(sorted(set(buckets)))
        self.runners: dict[int, object] = {}
        # tree size -> the bucket that runs it (None: eager), measured on this machine (choose_routes);
        # until then the smallest loaded bucket that holds it
        self.routes: dict[int, int | None] = {}
        self._trying = threading.local()  # a route tried by the measuring thread only

    def path(self, T: int) -> Path:
        return self.folder / f"{self.prefix}T{T}.so"

    def landed(self) -> list[int]:
        """Buckets whose package is on disk but not loaded yet."""
        return [T for T in self.buckets if T not in self.runners and self.path(T).exists()]

    def missing(self) -> list[int]:
        return [T for T in self.buckets if not self.path(T).exists()]

    def complete(self) -> bool:
        return len(self.runners) == len(self.buckets)

    def load_landed(self) -> str | None:
        """Load what has landed; the error line of a package that would not load (it is removed)."""
        error = None
        for T in self.landed():
            try:
                runner = Runner(self.path(T), blob_path(self.path(T)), self.constants, self.function)
            except Exception as e:  # a corrupt or foreign package: rebuilt later, eager meanwhile
                error = f"{self.kind} package T={T} unusable ({type(e).__name__}); removed"
                for f in (self.path(T), blob_path(self.path(T))):
                    f.unlink(missing_ok=True)
                continue
            self.runners[T] = runner  # from here on `run` uses it (one dict store: atomic)
        return error

    def build(self, log=None) -> None:
        if self.missing():
            write_meta(self.folder)
        for T in self.missing():
            pt2 = self.path(T).with_suffix(".pt2")
            if pt2.exists():  # built before (an older layout, or stopped before unpacking)
                try:
                    unpack(pt2, self.path(T))
                    continue
                except (zipfile.BadZipFile, StopIteration, OSError):
                    pt2.unlink(missing_ok=True)
            s = build_package(self.kind, self.module, T, pt2)
            unpack(pt2, self.path(T))
            if log:
                log(f"compiled the {self.kind} for T={T} in {s:.0f} s -> {self.path(T)}")

    def bucket(self, T: int) -> int | None:
        """The loaded bucket that runs T rows, or None (the eager path)."""
        b = getattr(self._trying, "route", {}).get(T, self.routes.get(T, ROUTE_DEFAULT))
        if b is ROUTE_DEFAULT or (b is not None and b not in self.runners):
            b = next((b for b in self.buckets if b >= T and b in self.runners), None)
        return b

    def sizes(self) -> range:
        """The tree sizes a bucket can hold."""
        return range(1, max(self.buckets) + 1)

    def set_trial(self, routes: dict[int, int | None]) -> None:
        """Routes that override the chosen ones in this thread only ({}: none): other threads keep
        the chosen routes, so timing while the page serves changes nobody's forward."""
        self._trying.route = routes


def _pad_rows(B: int, tokens, positions, tree_mask, tree: int = 0, features=None):
    """T rows -> a bucket of B: pad tokens (id 0) at the last position, seeing only themselves
    (mask [T, tree + T] -> [B, tree + B]); their outputs are dropped. A None mask is causal."""
    T = tokens.numel()
    mask = torch.ones(T, T, dtype=torch.bool, device=tokens.device).tril() if tree_mask is None else tree_mask
    if B == T:
        return tokens, positions, mask, features
    full = torch.zeros(B, tree + B, dtype=torch.bool, device=mask.device)
    full[:T, :tree + T] = mask
    idx = torch.arange(T, B, device=mask.device)
    full[idx, tree + idx] = True
    if features is not None:
        features = torch.cat([features, features.new_zeros(B - T, features.shape[1])])
    return (torch.cat([tokens, tokens.new_zeros(B - T)]), torch.cat([positions, positions[-1:].expand(B - T)]),
            full, features)


class CompiledTarget:
    """The compiled packages of one target and its draft head, loaded as they become
    available. `run` / `run_head` return their outputs through the bucket T's route names
    (routes.py: timed on this machine; until then the smallest loaded bucket that holds T, its
    rows padded), or None where the route is the eager forward (the caller then runs it). Packages are built by `python -m eagle2 compile`
    in a background process (`start_background`) or in the foreground (`build`); `poll` picks
    them up."""

    def __init__(self, model: LlamaModel, head=None, buckets=BUCKETS, head_buckets=HEAD_BUCKETS,
                 folder: Path | None = None):
        self.model, self.head = model, head
        self.folder = folder or package_dir(model)
        self.constants = SharedConstants()  # one copy of the weights for every package below
        self.target = PackageSet("target", model, buckets, self.folder, self.constants)
        self.sets = [self.target]
        self.head_set = None
        if head is not None and head_buckets:
            self.head_set = PackageSet("head", head, head_buckets, self.folder, self.constants, head_prefix(head))
            self.sets.append(self.head_set)
        self.worker: subprocess.Popen | None = None
        self.error: str | None = None
        self._lock = threading.Lock()
        self._loading = False
        self._watcher: threading.Thread | None = None
        self._stopped = threading.Event()
        # called once (in the loading thread) when every package has loaded: the app measures the
        # compiled forward's t(N) there, so no visitor's first Step waits for it
        self.on_complete = None
        self.measuring = False
        # attach() sets it: once every package is in, each tree size gets the fastest forward,
        # timed here (routes.py); the model's forwards must route through this object by then
        self.choose_routes = False
        self.log = None

    # the target's buckets (the t(N) cache keys its tables on them: timing._cache_key)
    @property
    def buckets(self) -> tuple[int, ...]:
        return self.target.buckets

    @property
    def runners(self) -> dict[int, object]:
        return self.target.runners

    # ------------------------------------------------------------------ availability
    def landed(self) -> list[tuple[str, int]]:
        return [(s.kind, T) for s in self.sets for T in s.landed()]

    def missing(self) -> list[tuple[str, int]]:
        return [(s.kind, T) for s in self.sets for T in s.missing()]

    def complete(self) -> bool:
        return all(s.complete() for s in self.sets)

    def poll(self) -> None:
        """Load the packages that have landed (returns at once if another thread is loading)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._loading = True
            for s in self.sets:
                self.error = s.load_landed() or self.error
            if self.complete() and (self.on_complete is not None or self.choose_routes):
                hook, self.on_complete = self.on_complete, None
                self.measuring = True
                try:
                    if self.choose_routes:
                        self.choose_routes = False
                        routes.choose(self, self.log)
                    if hook is not None:
                        hook()
                except Exception as e:  # timing is an optimisation: the packages serve on their default routes
                    logging.getLogger(__name__).warning("timing the compiled forward failed", exc_info=True)
                    self.error = f"not timed per tree size: {type(e).__name__}: {e}"
                finally:
                    self.measuring = False
        finally:
            self._loading = False
            self._lock.release()
        if self.worker is not None and self.worker.poll() not in (None, 0) and self.error is None:
            self.error = f"background compile exited with code {self.worker.returncode}"

    def _watch(self) -> None:
        """The one thread that picks up packages while the background compile runs: it looks at
        the folder every 2 s and loads what landed (seconds each, which no forward waits for: the
        eager path serves until then), and ends when every package is in or the compile ended."""
        while not self._stopped.wait(2.0):
            done = self.worker is None or self.worker.poll() is not None
            if self.landed():
                self.poll()
            if self.complete() or done:
                self.poll()  # the last packages, and the compile's exit status
                return

    def build(self, log=None) -> None:
        """Compile every missing package in this process (the target's take minutes each on a
        2-core CPU, the head's well under one), and the GIL-free runner first (nogil.py)."""
        nogil.build(log)
        for s in self.sets:
            s.build(log)
        self.poll()

    def start_background(self, argv: list[str]) -> None:
        """Build the missing packages in a low-priority child process (`python -m eagle2 compile`
        with `argv` naming the same target, head and threads); the eager path serves meanwhile."""
        if (not self.missing() and nogil.built().exists()) or self.worker is not None:
            return
        cmd = [sys.executable, "-m", "eagle2", "compile", *argv, "--background",
               "--buckets", ",".join(map(str, self.target.buckets))]
        self.worker = subprocess.Popen(cmd,  # `-m eagle2` finds the installed package from any cwd
                                       stdin=subprocess.PIPE,  # its end of file tells it the app is gone
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       preexec_fn=(lambda: os.nice(15)) if hasattr(os, "nice") else None)
        atexit.register(self.stop)  # a half-built package is never renamed into place: safe to stop
        self.watch(self.worker)

    def watch(self, worker: subprocess.Popen) -> None:
        """Load the packages `worker` (the background compile) writes, as they land, in one thread."""
        self.worker = worker
        self._watcher = threading.Thread(target=self._watch, daemon=True, name="eagle2-load-compiled")
        self._watcher.start()

    def stop(self) -> None:
        self._stopped.set()
        if self.worker is not None and self.worker.poll() is None:
            self.worker.terminate()

    def describe(self) -> str:
        """One line for the CLI and the page: which path runs."""
        ready = sorted(self.target.runners)
        n, total = sum(len(s.runners) for s in self.sets), sum(len(s.buckets) for s in self.sets)
        head = ""
        if self.head_set is not None and self.head_set.complete():
            head = " and draft head"
        if self._loading and not self.complete():
            return f"eager forward while the compiled one loads ({n} of {total} packages ready)"
        if self.complete():
            note = "; timing it per tree size in the background" if self.measuring else ""
            return f"compiled forward{head} (AOTInductor, {self.routes_text()}{note})"
        if self.worker is not None and self.worker.poll() is None:
            part = f"; compiled for {', '.join(map(str, ready))}" if ready else ""
            return f"eager forward while compiling in the background ({n} of {total} packages ready{part})"
        note = f" ({self.error})" if self.error else ""
        if ready:
            return (f"compiled forward{head} up to {ready[-1]} tree tokens (buckets {', '.join(map(str, ready))}), "
                    f"eager above{note}")
        return f"eager forward{note}"

    def routes_text(self) -> str:
        """Which forward runs each tree size: 'target 1-2 eager, 3-4 as 4, 5-8 as 8, above eager;
        head 1-4 as 4', or the buckets when not timed yet."""
        parts = []
        for s in self.sets:
            if s.routes:
                parts.append(f"{s.kind} {routes.describe(s.routes)}, above eager")
            elif s.runners:
                parts.append(f"{s.kind} buckets {', '.join(map(str, sorted(s.runners)))}")
        return "; ".join(parts)

    # ------------------------------------------------------------------ the forwards
    @torch.no_grad()
    def run(self, cache, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None,
            clock=None):
        """The target: (what the draft head reads [T, F]: the final features, or with aux_layers
        those layers' states; logits [T, V]), K/V written at cache slots length.. . `clock`: its
        verify_inputs phase closes when the inputs are ready (padded, rotary rows, masks)."""
        T = tokens.numel()
        B = self.target.bucket(T)
        start = cache.length
        if B is None or cache.k.shape[1] != 1 or start == 0:  # the graphs read >= 1 cached slot
            return None
        if start + T > cache.max_len:
            raise RuntimeError("KV cache full")
        tokens, positions, mask, _ = _pad_rows(B, tokens, positions, tree_mask)
        cos, sin = self.model.rope_at(positions)
        past = torch.ones(B, start, dtype=torch.bool, device=tokens.device)
        mask = mask.contiguous()  # a package reads every input with the strides it was exported with
        if clock is not None:
            clock.lap("verify_inputs")
        feats, logits, new_k, new_v = self.target.runners[B](tokens, cos, sin, cache.k, cache.v, past, mask)
        cache.k[:, :, :, start:start + T] = new_k[:, :, :, :T]
        cache.v[:, :, :, start:start + T] = new_v[:, :, :, :T]
        return feats[:T], logits[:T].float()

    @torch.no_grad()
    def run_head(self, cache, features: torch.Tensor, tokens: torch.Tensor, positions: torch.Tensor, start: int,
                 tree_mask: torch.Tensor | None, k: int = 0):
        """The draft head (its forward_cached + draft_logprobs): (g [T, D], log-probs
        [T, V_draft], None: DraftHead.forward_draft ranks them), K/V written at cache slots start.. ."""
        hs = self.head_set
        T = tokens.numel()
        B = hs.bucket(T) if hs is not None else None
        committed = cache.length
        if B is None or committed == 0:
            return None
        h = self.head
        if start + T > cache.max_len:
            return None  # the eager path raises the cache-full error
        tree = start - committed
        features = h.hidden_input(features)
        tokens, positions, mask, features = _pad_rows(B, tokens, positions, tree_mask, tree, features)
        past, new = split_masks(committed, start, mask, B, tokens.device)
        if past is None:
            past = torch.ones(B, start, dtype=torch.bool, device=tokens.device)
        cos, sin = h.rope_at(positions)
        g, logp, new_k, new_v = hs.runners[B](h.embed_tokens(tokens), features.contiguous(), cos, sin, cache.k[0],
                                              cache.v[0], past.contiguous(), new.contiguous())
        cache.k[0, :, :, start:start + T] = new_k[:, :, :T]
        cache.v[0, :, :, start:start + T] = new_v[:, :, :T]
        return g[:T], logp[:T], None


def compilable_head(bundle):
    """The bundle's head when its forward can be compiled (an attached EAGLE-1/2 or EAGLE-3 head),
    else None."""
    h = bundle.head
    return h if h is not None and getattr(h, "lm_weight", None) is not None else None


def attach(bundle, mode: str = "auto", background_argv: list[str] | None = None, log=None) -> str:
    """Give the bundle's target and head their compiled forwards; returns the line that says which
    path runs. mode "no": eager only. "yes": build the missing packages now (minutes), then use
    them. "auto": use the packages on disk (loaded before returning); with `background_argv` (the
    app), build the missing ones in a low-priority child process, each loaded in a thread as it
    lands."""
    t = bundle.target
    if getattr(bundle, "precision", "") == "q4_1":  # nothing to compile: the kernels are the forward
        head = "draft step" if bundle.head.compiled is not None else "matmuls"
        return f"q4_1 forward (integer kernels, {t.isa}); the draft head's {head} in Q8_0 on the same kernels"
    t.compiled = None
    bundle.head.compiled = None
    if mode == "no":
        return "eager forward"
    if bundle.device.type != "cpu" or bundle.dtype != torch.float32:
        return f"eager forward (the compiled forward is built for CPU float32, not {bundle.device.type} {bundle.dtype})"
    if not hasattr(getattr(torch._C, "_aoti", None), "AOTIModelContainerRunnerCpu"):
        # without the loader every package would look corrupt and be rebuilt at each start
        return f"eager forward (torch {torch.__version__} cannot load compiled packages)"
    folder = package_dir(t)
    # buckets built beyond the defaults (`compile --buckets 1,4,8`) are loaded and timed too
    built = {int(f.stem[1:]) for f in folder.glob("T*.so") if f.stem[1:].isdigit()}
    ct = CompiledTarget(t, compilable_head(bundle), tuple(sorted(set(BUCKETS) | built)), folder=folder)
    t.compiled = ct  # no package loaded: the eager forward runs until they are
    if ct.head_set is not None:
        bundle.head.compiled = ct
    ct.choose_routes, ct.log = True, log
    if ct.folder.is_dir():
        try:
            write_meta(ct.folder)  # built before folders had a record: keep it from being pruned
        except OSError:
            pass
    if mode == "yes":
        ct.build(log)
    else:
        ct.poll()
    if background_argv is not None:
        ct.start_background(background_argv)
    line = ct.describe()
    if mode == "auto" and background_argv is None and ct.missing():
        n = torch.get_num_threads()
        line += (f" (no compiled packages for {n} thread{'s' * (n > 1)} yet: `python -m eagle2 compile "
                 f"--threads {n}` builds them once, a few minutes, or --compile yes here)")
    return line


if __name__ == "__main__":  # pragma: no cover - a debugging aid: python -m eagle2.model.compiled
    from .loading import load_bundle
    print(json.dumps(compile_report(load_bundle().target), indent=1))
