"""Building this project's own C++ once on the user's machine, cached, with the compiler the
compiled packages use (torch's choice: $CXX or g++).

Each library lives in a folder keyed by its source, its flags and torch's version, under the cache
folder; it is built under a file lock and renamed into place when whole, so concurrent processes
build it once and nobody loads half a file. A failed build is a line in the log and the caller's
fallback, never an exception.
"""
from __future__ import annotations

import hashlib
import logging
import subprocess
from pathlib import Path

import torch
from filelock import FileLock

from ..files import atomic_path


def compiler() -> str:
    from torch._inductor.cpp_builder import get_cpp_compiler
    return get_cpp_compiler()


def library_path(name: str, source: Path, flags: list[str], headers: tuple[Path, ...] = ()) -> Path:
    """Where the library built from `source` (which includes `headers`) with `flags` lives (whether
    or not it is built yet)."""
    from .weights import cache_dir
    text = "".join(p.read_text() for p in (source, *headers))
    key = hashlib.sha256(f"{torch.__version__}|{' '.join(flags)}|{text}".encode()).hexdigest()[:12]
    return cache_dir() / "native" / name / key / f"{name}.so"


def build_library(name: str, source: Path, flags: list[str], log=None, timeout: float = 600,
                  headers: tuple[Path, ...] = ()) -> Path | None:
    """The built library (built now unless it is there), or None with the reason logged."""
    target = library_path(name, source, flags, headers)
    if target.exists():
        return target
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target.parent / "build.lock"), timeout=timeout):
            if target.exists():
                return target
            with atomic_path(target, suffix=".so") as tmp:
                cmd = [compiler(), str(source), *flags, "-o", str(tmp)]  # libraries after the source
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
                if done.returncode != 0:
                    lines = done.stderr.strip().splitlines()
                    raise RuntimeError(lines[-1] if lines else f"exit {done.returncode}")
    except Exception as e:  # no compiler, no disk, a timeout: the caller falls back
        (log or logging.getLogger(__name__).warning)(f"{name} not built ({type(e).__name__}: {e})")
        return None
    if log:
        log(f"built {name} -> {target}")
    return target
