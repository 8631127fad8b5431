"""The configuration: every setting that comes from the environment, in one frozen value.

The app builds one from the environment and its flags (app.py: `Config.from_env()` gives the
flags' defaults, the parsed flags replace them) and installs it with `use()`; the engine's modules
read theirs through `current()`. No other module reads the environment.

    EAGLE2_TARGET, EAGLE2_HEAD    the model preset/folder/hub id and the draft head (app.py)
    EAGLE2_DEVICE, EAGLE2_DTYPE   cpu or cuda; the weights' dtype (app.py)
    EAGLE2_CONCURRENCY            sessions decoding at the same time (app.py; default 2)
    EAGLE2_COMPILE                0/no/false/off: the eager forward only (app.py; a Space's setting)
    EAGLE2_THREADS                torch CPU threads per decode, the app's and the commands' (0 or unset:
                                  the CPUs shared between the decodes at once; eagle2/threads.py)
    EAGLE2_CACHE                  the cache folder (default ~/.cache/eagle2)
    EAGLE2_TIMING_CACHE           the t(N) table file (default verify_times.json in the cache folder)
    EAGLE2_MAX_SESSIONS           sessions holding decoders at once (default 64; benchmarks/classroom/)
    EAGLE2_SESSION_IDLE           seconds after which an idle session's decoders are freed (default 900)
    EAGLE2_Q4_KERNELS             avx2, avx-vnni or avx512-vnni: the q4_1 dot products to use (default:
                                  the CPU's best; the same results, for timing a slower CPU's path)
    EAGLE2_HEAD_BLOCKS            q4_1 (default) or q8_0: the blocks an EAGLE-3 head's matrices take on
                                  the kernels (drafts change speed only, never the output;
                                  scripts/head_blocks.py measures both)
    CHROMIUM                      the browser ui/screenshot.py drives (default /usr/bin/chromium)
    SPACES_ZERO_GPU               set by a Hugging Face Space on ZeroGPU hardware (1, t or true, as the
                                  `spaces` package reads it): the page then runs on the CPU and only
                                  "Record on the GPU" reaches a GPU (ui/gpu_record.py). Its main
                                  process reports CUDA (emulated), so torch cannot tell.
"""
from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

YES_ZERO_GPU = ("1", "t", "true")   # SPACES_ZERO_GPU's true values, as the `spaces` package reads them


@dataclass(frozen=True)
class Config:
    target: str | None = None
    head: str | None = None
    device: str = "cpu"
    dtype: str | None = None
    concurrency: int = 2
    threads: int | None = None       # None: the CPUs / the decodes at once (eagle2/threads.py)
    cache_dir: Path = field(default_factory=lambda: Path.home() / ".cache" / "eagle2")
    timing_cache: Path | None = None  # None: cache_dir / verify_times.json
    max_sessions: int = 64
    session_idle_s: float = 900.0
    chromium: str = "/usr/bin/chromium"
    q4_kernels: str | None = None    # None: the CPU's best (qlib.library)
    head_blocks: str = "q4_1"        # the draft head's matrices on the kernels (quantized.KernelDraft)
    zero_gpu: bool = False           # a ZeroGPU Space's main process (SPACES_ZERO_GPU)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> "Config":
        """The settings the environment gives (os.environ unless `environ`); a malformed number
        is a ValueError naming its variable."""
        env = os.environ if environ is None else environ
        d = cls()

        def number(name: str, kind, default):
            raw = env.get(name, "").strip()
            try:
                return kind(raw) if raw else default
            except ValueError:
                raise ValueError(f"{name} must be a number (got {raw!r}).") from None

        timing = env.get("EAGLE2_TIMING_CACHE")
        return cls(target=env.get("EAGLE2_TARGET") or None, head=env.get("EAGLE2_HEAD") or None,
                   device=env.get("EAGLE2_DEVICE") or d.device, dtype=env.get("EAGLE2_DTYPE") or None,
                   concurrency=number("EAGLE2_CONCURRENCY", int, d.concurrency),
                   threads=number("EAGLE2_THREADS", int, 0) or None,
                   cache_dir=Path(env.get("EAGLE2_CACHE") or d.cache_dir),
                   timing_cache=Path(timing) if timing else None,
                   max_sessions=number("EAGLE2_MAX_SESSIONS", int, d.max_sessions),
                   session_idle_s=number("EAGLE2_SESSION_IDLE", float, d.session_idle_s),
                   chromium=env.get("CHROMIUM") or d.chromium,
                   q4_kernels=(env.get("EAGLE2_Q4_KERNELS") or "").strip().lower() or None,
                   head_blocks=(env.get("EAGLE2_HEAD_BLOCKS") or "").strip().lower() or d.head_blocks,
                   zero_gpu=(env.get("SPACES_ZERO_GPU") or "").strip().lower() in YES_ZERO_GPU)


_installed: Config | None = None


def use(config: Config) -> Config:
    """Install the process's configuration (app.py, once, before anything reads it)."""
    global _installed
    _installed = config
    return config


def child_env(**overrides: str) -> dict[str, str]:
    """The environment a child process of ours (the app, the CLI) starts with: this process's,
    with `overrides` (EAGLE2_* settings, so the child builds its own configuration from them)."""
    return {**os.environ, **overrides}


def current() -> Config:
    """The installed configuration; without one (the CLI, scripts, tests), the environment's as it
    is now, so a variable set in-process (a test's private cache) takes effect."""
    return _installed if _installed is not None else Config.from_env()
