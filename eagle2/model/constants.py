"""One copy of the weights behind every compiled package (compiled.py).

Packages are built without their weights in the shared library (AOTInductor's
`package_constants_in_so=False`); each comes with a blob of its constants instead: the frozen
parameters under their own names, and the copies inductor packed for its GEMM kernels. A package's
blob is read for a moment, then every constant is pointed (`user_managed`, no copy) at one
tensor held here: a parameter at the model's own tensor, a packed copy at the first identical one
any package brought (buckets of one model pack alike: measured identical across T = 1, 4 and 8),
and the package's own copy is dropped. Three target buckets and a head then hold the model's weights
once plus one packed copy, where each used to hold both (1.08 GB a package for SmolLM2-135M).
"""
from __future__ import annotations

import hashlib
import threading
from pathlib import Path

import torch
from torch import nn


def _content_key(t: torch.Tensor) -> tuple:
    data = t.detach().contiguous().view(-1).view(torch.uint8).numpy()
    return tuple(t.shape), t.dtype, hashlib.blake2b(data, digest_size=16).hexdigest()


class SharedConstants:
    """The constants the packages of one model (its target and head buckets) point at."""

    def __init__(self):
        self._by_content: dict[tuple, torch.Tensor] = {}
        self._lock = threading.Lock()

    def bytes_held(self) -> int:
        """Bytes of the packed copies held here (the parameters are the model's own)."""
        return sum(t.numel() * t.element_size() for t in self._by_content.values())

    def load(self, so: Path, blob: Path, function: nn.Module, instances: int):
        """A runner (AOTIModelContainerRunnerCpu) of the package `so` built from `function`, every
        constant pointed at the shared tensor with its content. The blob is read once, into a
        probe runner dropped before the real one is made: a runner frees no blob it has loaded,
        not even after swapping its constants for others (measured: 1 GB kept per package)."""
        probe = torch._C._aoti.AOTIModelContainerRunnerCpu(str(so), 1)
        probe.update_constant_buffer_from_blob(str(blob))
        internal = {fqn: name for name, fqn in probe.get_constant_names_to_original_fqns().items()}
        own = probe.extract_constants_map(False)  # original name -> tensor in the probe's blob
        with self._lock:
            shared = {internal.get(fqn, fqn): self._shared(fqn, t, function) for fqn, t in own.items()}
        del own, probe  # the blob's copy goes with the probe
        runner = torch._C._aoti.AOTIModelContainerRunnerCpu(str(so), instances)
        runner.update_constant_buffer(shared, False, True, True)  # active buffer, all names, user-managed
        return runner

    def _shared(self, fqn: str, t: torch.Tensor, function: nn.Module) -> torch.Tensor:
        own = _module_tensor(function, fqn)
        if own is not None and own.shape == t.shape and own.dtype == t.dtype and torch.equal(own, t):
            return own
        key = _content_key(t)
        if key not in self._by_content:
            self._by_content[key] = t.clone()  # `t` lives in the buffer about to be freed
        return self._by_content[key]


def _module_tensor(function: nn.Module, fqn: str) -> torch.Tensor | None:
    """The tensor at `fqn` in the exported module (a parameter, buffer or plain tensor attribute),
    or None."""
    obj = function
    for part in fqn.split("."):
        obj = getattr(obj, part, None)
        if obj is None:
            return None
    return obj.detach() if isinstance(obj, torch.Tensor) else None
