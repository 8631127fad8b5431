"""Removing what the cache folder no longer needs: the folders no code of this version uses,
once per start (the app and the command line), and a library's older builds (native.py).

Removing is best effort: a file another process holds open where that forbids it (Windows) stays,
and the next tidy tries again; the bytes counted are those actually gone.
"""
from __future__ import annotations

import logging
import os
import shutil
from pathlib import Path

from .weights import cache_dir

# The cache's folders of earlier versions, which no code of this one writes or reads: nogil/ (the
# GIL-free runner of the fp32 compiled packages) and compiled/ (the packages themselves, about a
# gigabyte each), both of the retired compiled forward.
RETIRED = ("nogil", "compiled")


def size(path: Path) -> int:
    """Bytes of the files under `path` (links counted as links, not followed)."""
    total = 0
    for root, _, files in os.walk(path):
        for f in files:
            try:
                total += os.lstat(os.path.join(root, f)).st_size
            except OSError:
                pass   # removed meanwhile
    return total


def remove(path: Path) -> int:
    """Remove the folder `path` as far as it can be; the bytes freed."""
    before = size(path)
    shutil.rmtree(path, ignore_errors=True)
    return before - (size(path) if path.exists() else 0)


def retired() -> list[Path]:
    """The retired folders present in the cache."""
    return [cache_dir() / name for name in RETIRED if (cache_dir() / name).is_dir()]


def tidy(log=None) -> int:
    """Remove the cache's retired folders; one line (`log`, else this module's logger) says which
    and the bytes freed. Returns the bytes freed."""
    found = retired()
    if not found:
        return 0
    freed = sum(remove(p) for p in found)
    (log or logging.getLogger(__name__).info)(
        f"removed the cache's retired {', '.join(p.name + '/' for p in found)} ({freed / 1e6:.1f} MB freed)")
    return freed
