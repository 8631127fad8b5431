"""CPU threads for torch: the container's CPU quota shared between the sessions decoding at once."""
from __future__ import annotations

import os
from pathlib import Path


def available_cpus() -> int:
    """CPUs this process may use: the cgroup quota (containers, Spaces) if any, else the affinity mask."""
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
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:
        return os.cpu_count() or 1


def set_threads(n: int) -> None:
    """CPU threads for torch. Oversubscribing a small CPU (2 sessions x 2 threads on 2 vCPUs)
    makes tree verification an order of magnitude slower, so the default is cores / concurrency."""
    import torch
    torch.set_num_threads(max(1, int(n)))


def default_threads(concurrency: int) -> int:
    """Threads per decode when --threads is not given: the available CPUs / sessions at once."""
    return max(1, available_cpus() // max(1, concurrency))
