"""Device names: the one place that reads a device string (torch-free, so the page's settings and
the registry can use it without loading torch)."""
from __future__ import annotations


def device_kind(device) -> str:
    """"cuda" for any CUDA device ("cuda", "cuda:1", a torch.device), else "cpu"."""
    kind = getattr(device, "type", None) or str(device or "cpu")
    return "cuda" if kind.strip().lower().startswith("cuda") else "cpu"


def is_cuda(device) -> bool:
    return device_kind(device) == "cuda"
