"""The machine a measurement ran on, as benchmarks record it: the CPU's model (and family, since a
virtual machine may only say "AMD EPYC"), its vector flags, cores, threads and torch's version."""
from __future__ import annotations

import os
import platform
from pathlib import Path

VECTOR_FLAGS = ("avx", "amx", "fma", "f16c")   # what decides which kernels a CPU runs


def cpu_info() -> dict:
    fields: dict[str, str] = {}
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            key, _, value = line.partition(":")
            key = key.strip()
            if key in ("model name", "cpu family", "model", "flags") and key not in fields:
                fields[key] = value.strip()
    except OSError:
        pass
    flags = [f for f in fields.get("flags", "").split() if f.startswith(VECTOR_FLAGS)]
    return {"cpu": fields.get("model name") or platform.processor() or platform.machine(),
            "family": fields.get("cpu family"), "model": fields.get("model"),
            "cores": os.cpu_count(), "flags": " ".join(flags), "arch": platform.machine()}


def describe_cpu(threads: int) -> str:
    """One line: "AMD EPYC (family 26 model 2), 2 cores, 2 threads, avx2 avx512f ..."."""
    c = cpu_info()
    fam = f" (family {c['family']} model {c['model']})" if c["family"] else ""
    return f"{c['cpu']}{fam}, {c['cores']} cores, {threads} threads, {c['flags']}"
