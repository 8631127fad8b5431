"""torch's CPU threads: what --threads (the app's and every command's) and EAGLE2_THREADS mean,
resolved in this one place.

A number >= 1 is that many threads per decode. 0, or nothing given, is the CPUs this process may
use (its affinity mask, capped by its cgroup quota), read when the app or a command starts, shared
between the decodes that run at once: the app's --concurrency sessions, a command's one. Not torch's own default: torch counts the
machine's cores, not a container's quota, and oversubscribing a small CPU (2 sessions x 2 threads
on 2 vCPUs) made tree verification an order of magnitude slower.

A forked child runs on one thread (`one_thread_after_fork`, registered on import): ZeroGPU's
@spaces.GPU worker is forked from the page's process after visitors' Steps have run there, and a
child inherits the OpenMP runtime's state (the kernels' team and torch's, one runtime) without its
threads, so its first parallel region waited for threads that do not exist, for ever.
"""
from __future__ import annotations

import os
import sys
from pathlib import Path

from .errors import check

HELP = ("torch CPU threads per decode (0, the default: the CPUs this process may use, shared between "
        "the decodes running at once; EAGLE2_THREADS)")


def available_cpus() -> int:
    """CPUs this process may use: its affinity mask, and fewer where its cgroup's quota allows
    fewer (containers, Spaces: a quota of 2 CPUs on a 16-core host's mask is 2)."""
    try:
        cpus = len(os.sched_getaffinity(0))
    except AttributeError:
        cpus = os.cpu_count() or 1
    quota = cgroup_cpus()
    return max(1, min(cpus, quota) if quota else cpus)


def cgroup_cpus() -> int | None:
    """The CPUs this process's cgroup quota allows (v2's cpu.max, else v1's CFS quota), None
    without a quota."""
    try:
        quota, period = Path("/sys/fs/cgroup/cpu.max").read_text().split()[:2]
        if quota != "max":
            return max(1, int(int(quota) / int(period)))
    except (OSError, ValueError):
        pass
    try:
        q = int(Path("/sys/fs/cgroup/cpu/cpu.cfs_quota_us").read_text())
        if q > 0:
            return max(1, q // int(Path("/sys/fs/cgroup/cpu/cpu.cfs_period_us").read_text()))
    except (OSError, ValueError):
        pass
    return None


def check_threads(requested: int | None) -> None:
    """A negative count is a UserError (the app and the commands report it before loading)."""
    check(requested is None or requested >= 0,
          f"--threads must be >= 1, or 0 for the default: the CPUs shared between the decodes at once "
          f"(got {requested}).")


def threads_per_decode(requested: int | None, concurrency: int = 1) -> int:
    """The threads each decode gets: `requested` if >= 1, else the available CPUs / `concurrency`."""
    check_threads(requested)
    return requested or max(1, available_cpus() // max(1, concurrency))


def use_threads(requested: int | None, concurrency: int = 1) -> int:
    """Set torch's threads for this process's decodes (threads_per_decode); returns the count."""
    import torch   # here, not above: the app checks its flags before torch loads
    n = threads_per_decode(requested, concurrency)
    torch.set_num_threads(n)
    return n


def one_thread_after_fork() -> None:
    """In a forked child: torch's threads set to 1, which the q4_1 kernels follow too (each call
    asks torch), so no parallel region starts on the thread team the parent left behind. The
    child's CPU work is a GPU worker's (loading, a t(N) on the device) or a short record."""
    torch = sys.modules.get("torch")   # a parent that never loaded torch ran no team
    if torch is not None:
        torch.set_num_threads(1)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=one_thread_after_fork)
