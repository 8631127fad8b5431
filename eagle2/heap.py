"""Freed memory handed back to the system.

glibc's malloc keeps freed pages with the process: once a large block (a KV cache of ~10 MB, the
fp32 weights the q4_1 kernels replace) has been freed, its dynamic mmap threshold rises above that
size, later blocks come from the heap, and their pages stay resident after they are freed
(measured: benchmarks/classroom, benchmarks/app-memory). `trim_heap` returns them; the moments
that free much call it (a model loaded, sessions released).
"""
from __future__ import annotations

import contextlib
import ctypes

_libc = None


def _glibc():
    """glibc with malloc_trim and mallopt declared, resolved once; None where the C library is
    another."""
    global _libc
    if _libc is None:
        try:
            _libc = ctypes.CDLL("libc.so.6")
            _libc.malloc_trim.argtypes = [ctypes.c_size_t]
            _libc.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        except (OSError, AttributeError):
            _libc = False
    return _libc or None


def trim_heap() -> None:
    """malloc_trim(0); a no-op where the C library has none (not glibc)."""
    libc = _glibc()
    if libc:
        libc.malloc_trim(0)


M_MMAP_THRESHOLD = -3          # glibc's mallopt parameter
LOAD_THRESHOLD = 256 << 10     # blocks this large or larger: their own mapping while a model loads
STEADY_THRESHOLD = 32 << 20    # glibc's own ceiling, where its moving threshold settles after a load


@contextlib.contextmanager
def transient_blocks_mapped():
    """While a model loads, every block of 256 KiB or more gets its own mapping, handed back to the
    system when freed. A load allocates and frees hundreds of MB of such blocks (a checkpoint's
    tensors, a GGUF's, the copies the kernels pack). glibc otherwise raises its mmap threshold past
    the first large block freed, and the later ones stay in the heap, which trim_heap cannot
    always shrink. `python app.py` at ready then read 543-596 MiB from run to run, against 539-544
    MiB this way, ready as soon (benchmarks/app-memory). Afterwards the threshold is glibc's
    ceiling, where its own rule settles after such a load. So decoding's per-forward buffers come
    from the heap, as before, never from new mappings."""
    ok = _mallopt(M_MMAP_THRESHOLD, LOAD_THRESHOLD)
    try:
        yield
    finally:
        if ok:
            _mallopt(M_MMAP_THRESHOLD, STEADY_THRESHOLD)


def _mallopt(param: int, value: int) -> bool:
    libc = _glibc()
    return bool(libc.mallopt(param, value)) if libc else False
