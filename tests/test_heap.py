"""eagle2/heap.py: freed memory handed back, and a model's load with its large blocks mapped."""
from __future__ import annotations

import pytest

from eagle2 import heap


@pytest.mark.skipif(not heap._glibc(), reason="mallopt is glibc's")
def test_on_glibc_the_load_threshold_is_set_and_the_steady_one_restored(monkeypatch):
    calls = []
    real = heap._mallopt
    monkeypatch.setattr(heap, "_mallopt", lambda p, v: calls.append((p, v)) or real(p, v))
    with heap.transient_blocks_mapped():
        assert calls == [(heap.M_MMAP_THRESHOLD, heap.LOAD_THRESHOLD)]
        heap.trim_heap()
    assert calls[1:] == [(heap.M_MMAP_THRESHOLD, heap.STEADY_THRESHOLD)]
    assert real(heap.M_MMAP_THRESHOLD, heap.STEADY_THRESHOLD)   # glibc takes the value


def test_without_glibc_both_are_no_ops_and_the_body_still_runs(monkeypatch):
    monkeypatch.setattr(heap, "_libc", False)   # another C library: resolved as absent
    ran = []
    with heap.transient_blocks_mapped():
        heap.trim_heap()
        ran.append(True)
    assert ran == [True] and heap._mallopt(heap.M_MMAP_THRESHOLD, heap.LOAD_THRESHOLD) is False


def test_an_error_in_the_load_restores_the_steady_threshold(monkeypatch):
    calls = []
    monkeypatch.setattr(heap, "_mallopt", lambda p, v: calls.append(v) or True)
    with pytest.raises(RuntimeError):
        with heap.transient_blocks_mapped():
            raise RuntimeError("load failed")
    assert calls == [heap.LOAD_THRESHOLD, heap.STEADY_THRESHOLD]
