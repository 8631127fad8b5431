"""How a forward is timed: the wait a wall-clock reading needs on a device, torch's benchmark timer,
variants timed in turn (fair against machine drift), and the one harness that times target
forwards' verification of n tree tokens after a committed context. Measuring t(N) and keeping it
is calibration.py's; the decoder's clock reads only `syncer`.
"""
from __future__ import annotations

import numpy as np
import torch

from ..devices import is_cuda


def syncer(dev: torch.device):
    """What to call before each wall-clock reading on `dev`, decided once: CUDA runs asynchronously,
    so a reading there must wait for the device to cover the work; a CPU's work is done on return."""
    if is_cuda(dev):
        return lambda: torch.cuda.synchronize(dev)
    return lambda: None


@torch.no_grad()
def prefilled_cache(forward, context: int, room: int):
    """A KV cache of `forward` (forward.TargetForward) holding `context` committed random tokens,
    with `room` free slots after them."""
    dev = forward.device
    cache = forward.new_cache(context + room)
    forward.prefill(cache, torch.randint(0, forward.args.vocab_size, (context,), device=dev),
                    torch.arange(context, device=dev))
    cache.advance(context)
    return cache


def timer(call):
    """torch's benchmark timer for `call()`, at this process's thread count (its default is one
    thread) and synchronising CUDA around each timing. Imported here, where a measurement starts:
    torch.utils.benchmark brings cpp_extension and setuptools (5 MiB resident) into every process
    that only reads a cached table."""
    from torch.utils.benchmark import Timer
    return Timer(stmt="call()", globals={"call": call}, num_threads=torch.get_num_threads())


def interleaved_medians(variants: dict, call, repeats: int) -> dict[str, float]:
    """Median seconds of `call()` under each variant (`variants[name]()` switches to it), the
    variants taken in turn within every repeat (fair against machine drift); one warm-up round."""
    times = {name: [] for name in variants}
    t = timer(call)
    for r in range(repeats + 1):
        for name, switch in variants.items():
            switch()
            seconds = t.timeit(1).times[0]
            if r:
                times[name].append(seconds)
    return {name: float(np.median(v)) for name, v in times.items()}


@torch.no_grad()
def time_forwards(forwards: dict, sizes, context: int = 256, repeats: int = 5,
                  stop=None) -> dict[int, dict[str, float]]:
    """The one harness timing target forwards' verification (forward + logits) of n tree tokens (a
    causal chain) after `context` committed ones: for each n in `sizes`, the median seconds of
    each of `forwards` ({name: forward.TargetForward}, each on a cache of its own: two bundles'
    backends compared), interleaved repeat by repeat. `stop()`, asked before each n, ends it early
    with the sizes timed so far (a background measurement gives way to a visitor's Step). t(N) and
    `profile` time through it."""
    first = next(iter(forwards.values()))
    dev = first.device
    caches = {name: prefilled_cache(f, context, max(sizes) + 1) for name, f in forwards.items()}
    g = torch.Generator().manual_seed(0)
    out = {}
    for n in sizes:
        if stop is not None and stop():
            break
        toks = torch.randint(0, first.args.vocab_size, (n,), generator=g).to(dev)
        pos = torch.arange(context, context + n, device=dev)
        mask = torch.ones(n, n, dtype=torch.bool, device=dev).tril()
        now = {}
        variants = {name: (lambda name=name: now.update(f=forwards[name], c=caches[name])) for name in forwards}
        out[n] = interleaved_medians(variants, lambda: now["f"].verify(now["c"], toks, pos, mask), repeats)
    return out


