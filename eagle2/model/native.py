"""Building this project's own C++ once on the user's machine, cached, with torch's choice of C++
compiler ($CXX or g++).

Each library lives in a folder keyed by its source, its flags and torch's version, under the cache
folder; it is built under a file lock and renamed into place when whole, so concurrent processes
build it once and nobody loads half a file. A failed build is a line in the log and the caller's
fallback, never an exception. The process that builds a library removes its older builds (each
source edit made one more: 29 of one library on a developer's machine).
"""
from __future__ import annotations

import hashlib
import logging
import subprocess
from pathlib import Path

import torch
from filelock import FileLock, Timeout

from ..files import atomic_path
from . import cache_tidy

LOCK = "build.lock"


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
        with FileLock(str(target.parent / LOCK), timeout=timeout):
            if target.exists():
                return target
            with atomic_path(target, suffix=".so") as tmp:
                cmd = [compiler(), str(source), *flags, "-o", str(tmp)]  # libraries after the source
                done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout)
                if done.returncode != 0:
                    lines = done.stderr.strip().splitlines()
                    raise RuntimeError(lines[-1] if lines else f"exit {done.returncode}")
            removed, freed = remove_older_builds(target.parent)
    except Exception as e:  # no compiler, no disk, a timeout: the caller falls back
        (log or logging.getLogger(__name__).warning)(f"{name} not built ({type(e).__name__}: {e})")
        return None
    if log:
        log(f"built {name} -> {target}")
    if removed:
        (log or logging.getLogger(__name__).info)(f"removed {removed} older build(s) of {name} ({freed / 1e6:.1f} MB)")
    return target


def remove_older_builds(keep: Path) -> tuple[int, int]:
    """Remove the builds beside `keep` (the same library of another source, flags or torch), each
    under its own lock taken without waiting: one another process is building right now stays.
    Called by the process that built `keep`, under keep's lock. A process that loaded an older
    build keeps running it (the file goes, its mapping stays); what cannot be removed (a file in
    use on Windows) stays until the next build. Returns (folders removed, bytes freed)."""
    removed = freed = 0
    try:
        others = [d for d in keep.parent.iterdir() if d != keep and d.is_dir()]
    except OSError:
        return 0, 0
    for d in others:
        try:
            with FileLock(str(d / LOCK), timeout=0):
                gone = cache_tidy.remove(d)
        except (Timeout, OSError):   # being built; or a lock that cannot be taken there
            continue
        removed, freed = removed + (not d.exists()), freed + gone
    return removed, freed
