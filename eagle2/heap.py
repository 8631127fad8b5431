"""Freed memory handed back to the system.

glibc's malloc keeps freed pages with the process: once a large block (a KV cache of ~10 MB, the
fp32 weights the q4_1 kernels replace) has been freed, its dynamic mmap threshold rises above that
size, later blocks come from the heap, and their pages stay resident after they are freed
(measured: benchmarks/classroom, benchmarks/app-memory). `trim_heap` returns them; the moments
that free much call it (a model loaded, sessions released).
"""
from __future__ import annotations

import ctypes

_libc = None


def trim_heap() -> None:
    """malloc_trim(0); a no-op where the C library has none (not glibc)."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
        except (OSError, AttributeError):
            _libc = False
    if _libc:
        _libc.malloc_trim(0)
