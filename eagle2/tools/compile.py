"""`python -m eagle2 compile`: build the compiled forward packages of the target and its draft head once
(model/compiled.py).

Each tree-size bucket takes one to three minutes on a 2-core CPU and is cached on disk under
the cache folder, keyed by the weights, torch, the CPU's vector ISA and the thread count; later
starts load a package in about a second. The app runs this in a low-priority background process
by itself; the CLIs use whatever packages exist (`--compile` builds them first).
"""
from __future__ import annotations

import argparse
import json
import os
import sys
import threading

from .flags import add_model_args, apply_threads


def parse_buckets(text: str) -> tuple[int, ...]:
    from ..errors import check
    try:
        out = tuple(sorted({int(x) for x in text.split(",") if x.strip()}))
    except ValueError:
        out = ()
    check(bool(out) and all(1 <= b <= 64 for b in out),
          f"--buckets must be a comma-separated list of tree sizes in [1, 64] (got {text!r}).")
    return out


def exit_with_parent() -> None:
    """A daemon thread that ends this process once its parent is gone: the app holds the write end
    of this process's stdin, which the kernel closes when the app exits, however it exits."""
    def watch():
        sys.stdin.buffer.read()  # blocks until end of file
        os._exit(0)  # a half-written package is a .part file, never renamed into place

    threading.Thread(target=watch, daemon=True, name="exit-with-parent").start()


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(prog="python -m eagle2 compile", description=__doc__)
    add_model_args(ap, dtype=False)
    ap.add_argument("--buckets", default=None, help="the target's tree sizes to compile, e.g. 1,2,4,8,16 (default: those; the draft head's are fixed)")
    ap.add_argument("--status", action="store_true", help="only say which packages exist")
    ap.add_argument("--background", action="store_true",
                    help="started by the app: exit when the app does (a killed parent leaves no orphan compiling)")
    a = ap.parse_args(argv)
    if a.background:
        exit_with_parent()
    from ..model.compiled import BUCKETS, CompiledTarget, compilable_head
    from ..model.packages import compile_report, prune_stale
    buckets = parse_buckets(a.buckets) if a.buckets else BUCKETS
    apply_threads(a)
    from ..model.loading import load_bundle
    from ..errors import check
    from ..devices import is_cuda
    check(not is_cuda(a.device), "The compiled forward is built for CPU fp32; on CUDA the eager path runs.")
    # the packages run the fp32 forward (`--dtype float32`): the q4_1 default runs its own kernels
    bundle = load_bundle(a.target, a.head, a.device, dtype="float32", pack=False)
    if a.status:
        print(json.dumps(compile_report(bundle.target), indent=1))
        return 0
    ct = CompiledTarget(bundle.target, compilable_head(bundle), buckets)
    removed, freed = prune_stale(ct.folder)
    if removed:
        print(f"removed {removed} package folder(s) of an older format or torch ({freed / 1e9:.1f} GB)", flush=True)
    ct.build(log=lambda s: print(s, flush=True))
    print(ct.describe())
    return 0
