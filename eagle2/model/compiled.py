"""The target's forward compiled ahead of time (gpt-fast's idea, AOTInductor's packaging).

What is compiled: one pure function per tree-size bucket T (1, 2, 4, 8, 16 by default),
    (tokens[T], cos[T], sin[T], k_cache, v_cache, start, tree_mask[T, T])
        -> (features[T, D], logits[T, V], new K[L, 1, kv, T, d], new V[...]),
exported with torch.export and built by AOTInductor with max-autotune and frozen weights, so
inductor packs every weight once and streams it through its own C++ micro-GEMM (on this CPU
~2x faster than the eager oneDNN/MKL path at 1-4 rows: benchmarks/compiled-forward).

Why this shape (each measured; benchmarks/compiled-forward/README.md):
- attention over the committed cache is an opaque custom op that runs eagerly over the live
  length, so the graph's shapes are static in T alone and the cache may be any size;
- the op does not write the cache (a mutating op came out of AOTInductor with wrong logits): the
  graph returns the new K/V and `run` writes them, so the compiled graph is a pure function;
- AOTInductor, not torch.compile: inductor's on-disk FX cache refuses graphs whose frozen,
  prepacked weights are mkldnn tensors, so a JIT compile would cost 1-2 minutes at every start;
  a package compiles once (in a background process) and later loads in a few seconds.
Tree sizes between buckets are padded up (pad rows see only themselves and are dropped).
The eager path in llama.py stays the reference and the fallback for anything else (prefill,
T above the largest bucket, no package yet).
"""
from __future__ import annotations

import atexit
import hashlib
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn

from .llama import LlamaModel, apply_rope

BUCKETS = (4, 8)  # measured: N = 1-4 run as fast padded to 4 as alone; above 8 the eager path wins
FORMAT = 1  # bump when the exported function's signature changes: old packages are not loaded


@torch.library.custom_op("eagle2::prefix_tree_attention", mutates_args=())
def prefix_tree_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                          v_cache: torch.Tensor, start: torch.Tensor, tree_mask: torch.Tensor) -> torch.Tensor:
    """Attention of T new queries over the committed cache slots [0, start) and the T new keys
    under `tree_mask` [T, T]. q [1, H, T, d]; k, v [1, kv, T, d]; caches [1, kv, C, d]. One
    softmax over both parts, so it equals SDPA over the concatenation without copying the cache."""
    s = int(start)
    _, H, T, d = q.shape
    kv = k.shape[1]
    g = H // kv
    qq = q[0].reshape(kv, g * T, d) * d ** -0.5  # query heads grouped under their K/V head
    scores_new = (qq @ k[0].transpose(1, 2)).view(kv, g, T, T).masked_fill(~tree_mask, float("-inf"))
    scores_new = scores_new.view(kv, g * T, T)
    if s == 0:
        return (torch.softmax(scores_new, -1) @ v[0]).reshape(1, H, T, d)
    scores_old = qq @ k_cache[0, :, :s].transpose(1, 2)
    p = torch.softmax(torch.cat([scores_old, scores_new], -1), -1)
    out = p[..., :s] @ v_cache[0, :, :s] + p[..., s:] @ v[0]
    return out.reshape(1, H, T, d)


@prefix_tree_attention.register_fake
def _(q, k, v, k_cache, v_cache, start, tree_mask):
    # contiguous, as the op returns it: empty_like(q) would keep q's transposed strides, and the
    # compiled graph would then read every T > 1 output scrambled
    return q.new_empty(q.shape)


class TreeForward(nn.Module):
    """The function that is exported: the target's blocks with the custom attention op."""

    def __init__(self, model: LlamaModel):
        super().__init__()
        self.model = model

    def forward(self, tokens, cos, sin, k_cache, v_cache, start, tree_mask):
        m = self.model
        a = m.args
        T = tokens.shape[0]
        x = m.embed_tokens(tokens)[None]
        new_k, new_v = [], []
        for i, blk in enumerate(m.layers):
            at = blk.self_attn
            h = blk.input_layernorm(x)
            q = F.linear(h, at.q_proj.weight, at.q_proj.bias).view(1, T, a.n_heads, a.head_dim).transpose(1, 2)
            k = F.linear(h, at.k_proj.weight, at.k_proj.bias).view(1, T, a.n_kv_heads, a.head_dim).transpose(1, 2)
            v = F.linear(h, at.v_proj.weight, at.v_proj.bias).view(1, T, a.n_kv_heads, a.head_dim).transpose(1, 2)
            q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
            o = torch.ops.eagle2.prefix_tree_attention(q, k, v, k_cache[i], v_cache[i], start, tree_mask)
            x = x + F.linear(o.transpose(1, 2).reshape(1, T, -1), at.o_proj.weight)
            mlp = blk.mlp
            h = blk.post_attention_layernorm(x)
            x = x + F.linear(F.silu(F.linear(h, mlp.gate_proj.weight)) * F.linear(h, mlp.up_proj.weight),
                             mlp.down_proj.weight)
            new_k.append(k)
            new_v.append(v)
        feats = m.norm(x)[0]
        return feats, F.linear(feats, m.lm_head.weight), torch.stack(new_k), torch.stack(new_v)


def _example(model: LlamaModel, T: int, context: int = 8):
    a = model.args
    w = model.lm_head.weight
    cos, sin = model.rope(context + T + 1)
    pos = torch.arange(context, context + T, device=w.device)
    cache = torch.zeros(a.n_layers, 1, a.n_kv_heads, context + T + 64, a.head_dim, dtype=w.dtype, device=w.device)
    return (torch.zeros(T, dtype=torch.long, device=w.device), cos[pos], sin[pos], cache, cache.clone(),
            torch.tensor(context), torch.ones(T, T, dtype=torch.bool, device=w.device).tril())


def build_package(model: LlamaModel, T: int, path: Path, autotune: bool = True) -> float:
    """Export the T-row function and compile it with AOTInductor into `path` (atomically).
    Returns the seconds it took."""
    t0 = time.perf_counter()
    C = torch.export.Dim("C", min=16, max=1 << 20)  # any cache capacity
    shapes = {"tokens": None, "cos": None, "sin": None, "k_cache": {3: C}, "v_cache": {3: C},
              "start": None, "tree_mask": None}
    with torch.no_grad():
        ep = torch.export.export(TreeForward(model).eval(), _example(model, T), dynamic_shapes=shapes)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f"{path.stem}.{os.getpid()}.part.pt2")  # renamed when whole
    torch._inductor.aoti_compile_and_package(ep, package_path=str(tmp), inductor_configs={
        "freezing": True, "max_autotune": autotune, "max_autotune_gemm_backends": "CPP,ATEN"})
    os.replace(tmp, path)
    return time.perf_counter() - t0


def fingerprint(model: LlamaModel) -> str:
    """Identifies the weights (a package bakes them in): shapes and a cheap checksum of each."""
    h = hashlib.sha256()
    for name, p in model.state_dict().items():
        h.update(f"{name}{tuple(p.shape)}{p.dtype}{float(p.double().sum()):.10e}".encode())
    return h.hexdigest()[:16]


def package_dir(model: LlamaModel) -> Path:
    """Where this model's packages live: keyed by the weights, torch, the CPU's vector ISA and the
    thread count (inductor's GEMM template splits the work for the threads it was built for)."""
    from .weights import cache_dir
    cap = torch.backends.cpu.get_cpu_capability()
    key = f"{fingerprint(model)}|torch {torch.__version__}|{cap}|{torch.get_num_threads()}t|v{FORMAT}"
    return cache_dir() / "compiled" / hashlib.sha256(key.encode()).hexdigest()[:16]


class CompiledTarget:
    """The compiled packages of one target, loaded as they become available.

    `run` returns (features, logits) through the smallest bucket that holds T, or None (the caller
    then runs the eager path). Packages are built by `python -m eagle2 compile` in a background
    process (`start_background`) or in the foreground (`build`); `poll` picks them up."""

    def __init__(self, model: LlamaModel, buckets=BUCKETS, folder: Path | None = None):
        self.model = model
        self.buckets = tuple(sorted(set(buckets)))
        self.folder = folder or package_dir(model)
        self.runners: dict[int, object] = {}
        self.worker: subprocess.Popen | None = None
        self.error: str | None = None
        self._last_poll = 0.0
        self._lock = threading.Lock()
        self._loader: threading.Thread | None = None

    def path(self, T: int) -> Path:
        return self.folder / f"T{T}.pt2"

    # ------------------------------------------------------------------ availability
    def landed(self) -> list[int]:
        """Buckets whose package is on disk but not loaded yet."""
        return [T for T in self.buckets if T not in self.runners and self.path(T).exists()]

    def poll(self) -> None:
        """Load the packages that have landed (returns at once if another thread is loading)."""
        if not self._lock.acquire(blocking=False):
            return
        try:
            self._last_poll = time.monotonic()
            for T in self.landed():
                try:
                    runner = torch._inductor.aoti_load_package(str(self.path(T)))
                except Exception as e:  # a corrupt or foreign package: rebuild it, run eagerly meanwhile
                    self.error = f"package T={T} unusable ({type(e).__name__}); removed"
                    self.path(T).unlink(missing_ok=True)
                    continue
                self.runners[T] = runner  # from here on `run` uses it (one dict store: atomic)
        finally:
            self._lock.release()
        if self.worker is not None and self.worker.poll() not in (None, 0) and self.error is None:
            self.error = f"background compile exited with code {self.worker.returncode}"

    def poll_in_background(self) -> None:
        """`poll` in a thread, checked at most every 2 s: loading a package takes seconds, which a
        decode step must not wait for (the eager path serves until it lands)."""
        now = time.monotonic()
        if (now - self._last_poll < 2.0 or len(self.runners) == len(self.buckets)
                or (self._loader is not None and self._loader.is_alive())):
            return
        self._last_poll = now
        if self.landed():
            self._loader = threading.Thread(target=self.poll, daemon=True, name="eagle2-load-compiled")
            self._loader.start()

    def missing(self) -> list[int]:
        return [T for T in self.buckets if not self.path(T).exists()]

    def build(self, log=None) -> None:
        """Compile every missing bucket in this process (minutes each on a 2-core CPU)."""
        for T in self.missing():
            s = build_package(self.model, T, self.path(T))
            if log:
                log(f"compiled T={T} in {s:.0f} s -> {self.path(T)}")
        self.poll()

    def start_background(self, argv: list[str]) -> None:
        """Build the missing buckets in a low-priority child process (`python -m eagle2 compile`
        with `argv` naming the same target and threads); the eager path serves meanwhile."""
        if not self.missing() or self.worker is not None:
            return
        cmd = [sys.executable, "-m", "eagle2", "compile", *argv, "--background",
               "--buckets", ",".join(map(str, self.missing()))]
        self.worker = subprocess.Popen(cmd, cwd=Path(__file__).resolve().parents[2],
                                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                                       preexec_fn=(lambda: os.nice(15)) if hasattr(os, "nice") else None)
        atexit.register(self.stop)  # a half-built package is never renamed into place: safe to stop

    def stop(self) -> None:
        if self.worker is not None and self.worker.poll() is None:
            self.worker.terminate()

    def describe(self) -> str:
        """One line for the CLI and the page: which path runs."""
        self.poll_in_background()
        ready = sorted(self.runners)
        if self._loader is not None and self._loader.is_alive():
            return (f"eager forward while the compiled one loads ({len(ready)} of {len(self.buckets)} tree sizes "
                    f"ready)")
        if len(ready) == len(self.buckets):
            return f"compiled forward (AOTInductor, tree sizes {', '.join(map(str, ready))})"
        if self.worker is not None and self.worker.poll() is None:
            part = f"; compiled for {', '.join(map(str, ready))}" if ready else ""
            return (f"eager forward while compiling in the background "
                    f"({len(ready)} of {len(self.buckets)} tree sizes ready{part})")
        note = f" ({self.error})" if self.error else ""
        if ready:
            return f"compiled forward for tree sizes {', '.join(map(str, ready))}, eager above{note}"
        return f"eager forward{note}"

    # ------------------------------------------------------------------ the forward
    def bucket(self, T: int) -> int | None:
        return next((b for b in self.buckets if b >= T and b in self.runners), None)

    @torch.no_grad()
    def run(self, cache, tokens: torch.Tensor, positions: torch.Tensor, tree_mask: torch.Tensor | None):
        self.poll_in_background()
        T = tokens.numel()
        B = self.bucket(T)
        if B is None or cache.k.shape[1] != 1:
            return None
        m = self.model
        dev = tokens.device
        start = cache.length
        if start + T > cache.max_len:
            raise RuntimeError("KV cache full")
        pad = B - T
        mask = torch.ones(T, T, dtype=torch.bool, device=dev).tril() if tree_mask is None else tree_mask
        if pad:
            tokens = torch.cat([tokens, tokens.new_zeros(pad)])
            positions = torch.cat([positions, positions[-1:].expand(pad)])
            full = torch.eye(B, dtype=torch.bool, device=dev)  # a pad row sees itself only
            full[:T, :T] = mask
            mask = full
        cos, sin = m._cos[positions], m._sin[positions]
        feats, logits, new_k, new_v = self.runners[B](tokens, cos, sin, cache.k, cache.v,
                                                      torch.tensor(start), mask)
        cache.k[:, :, :, start:start + T] = new_k[:, :, :, :T]
        cache.v[:, :, :, start:start + T] = new_v[:, :, :, :T]
        return feats[:T], logits[:T].float()


def attach(bundle, mode: str = "auto", background_argv: list[str] | None = None, log=None) -> str:
    """Give the bundle's target its compiled forward; returns the line that says which path runs.
    mode "no": eager only. "yes": build the missing packages now (minutes), then use them.
    "auto": use the packages on disk (loaded before returning); with `background_argv` (the app),
    build the missing ones in a low-priority child process, each loaded in a thread as it lands."""
    t = bundle.target
    t.compiled = None
    if mode == "no":
        return "eager forward"
    if t.aux_layers:
        return "eager forward (an EAGLE-3 head reads inner layers' states, which the compiled forward does not return)"
    if bundle.device.type != "cpu" or bundle.dtype != torch.float32:
        return f"eager forward (the compiled forward is built for CPU float32, not {bundle.device.type} {bundle.dtype})"
    ct = CompiledTarget(t)
    if mode == "yes":
        ct.build(log)
    else:
        ct.poll()
    if background_argv is not None:
        ct.start_background(background_argv)
    t.compiled = ct
    line = ct.describe()
    if mode == "auto" and background_argv is None and ct.missing():
        line += " (python -m eagle2 compile builds the rest once, a few minutes)"
    return line


def compile_report(model: LlamaModel) -> dict:
    """What is on disk for this model (for `python -m eagle2 compile --status`)."""
    folder = package_dir(model)
    return {"folder": str(folder), "packages": {p.name: p.stat().st_size for p in sorted(folder.glob("T*.pt2")) if ".part." not in p.name}}


if __name__ == "__main__":  # pragma: no cover - a debugging aid: python -m eagle2.model.compiled
    from .loading import load_bundle
    print(json.dumps(compile_report(load_bundle().target), indent=1))
