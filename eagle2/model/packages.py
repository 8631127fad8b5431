"""The compiled packages on disk: the folder that holds one model's, keyed by what a package bakes
in, its record (meta.json), unpacking a built package, and pruning the folders that no current
build can load (older formats, another torch): on one machine they had grown to 3.8 GB."""
from __future__ import annotations

import hashlib
import json
import os
import shutil
import zipfile
from pathlib import Path

import torch

from ..files import atomic_write, read_json
from .llama import LlamaModel

FORMAT = 3  # bump when an exported function's signature or a package's layout changes: old ones are not loaded
META = "meta.json"


def fingerprint(module: torch.nn.Module, *extra: torch.Tensor) -> str:
    """Identifies the weights (a package bakes them in): shapes and a cheap checksum of each."""
    h = hashlib.sha256()
    for name, p in [*module.state_dict().items(), *((f"extra{i}", t) for i, t in enumerate(extra))]:
        h.update(f"{name}{tuple(p.shape)}{p.dtype}{float(p.double().sum()):.10e}".encode())
    return h.hexdigest()[:16]


def package_dir(model: LlamaModel) -> Path:
    """Where this model's packages live: keyed by the weights, torch, the CPU's vector ISA, the
    thread count (inductor's GEMM template splits the work for the threads it was built for) and
    the aux layers the packages return (EAGLE-3)."""
    from .weights import cache_dir
    cap = torch.backends.cpu.get_cpu_capability()
    key = f"{fingerprint(model)}|torch {torch.__version__}|{cap}|{torch.get_num_threads()}t|v{FORMAT}"
    if model.aux_layers:  # its packages return those layers' states (an EAGLE-3 head's input)
        key += f"|aux {','.join(map(str, model.aux_layers))}"
    return cache_dir() / "compiled" / hashlib.sha256(key.encode()).hexdigest()[:16]


def head_prefix(head) -> str:
    """File-name prefix of a head's packages (beside its target's, keyed by the head's weights)."""
    return f"head-{fingerprint(head, head.lm_weight)}-"


def blob_path(so: Path) -> Path:
    """The constants blob beside a package's shared library (constants.py reads it)."""
    return so.with_suffix(".blob")


def unpack(pt2: Path, so: Path) -> None:
    """Extract a package's shared library and its constants blob (built apart: constants.py), then
    drop the package: loading the .so takes well under a second, where loading the .pt2 extracts
    it again at every start."""
    with zipfile.ZipFile(pt2) as z:
        names = z.namelist()
        lib = next(n for n in names if n.endswith(".wrapper.so"))
        blob = next(n for n in names if n.endswith(".blob"))
        for member, dst in ((blob, blob_path(so)), (lib, so)):  # the .so last: it marks completion
            tmp = dst.with_name(f"{dst.name}.{os.getpid()}.part")
            with z.open(member) as src, open(tmp, "wb") as out:
                shutil.copyfileobj(src, out, 1 << 24)
            os.replace(tmp, dst)
    pt2.unlink()


def compile_report(model: LlamaModel) -> dict:
    """What is on disk for this model (for `python -m eagle2 compile --status`)."""
    folder = package_dir(model)
    return {"folder": str(folder), "packages": {p.name: p.stat().st_size for p in sorted(folder.glob("*.so"))
                                                if ".part" not in p.name}}


def write_meta(folder: Path) -> None:
    """Record what the folder's packages were built for (prune_stale reads it)."""
    meta = {"format": FORMAT, "torch": torch.__version__, "isa": torch.backends.cpu.get_cpu_capability(),
            "threads": torch.get_num_threads()}
    if read_json(folder / META, None) != meta:
        folder.mkdir(parents=True, exist_ok=True)
        atomic_write(folder / META, json.dumps(meta))


def _size(folder: Path) -> int:
    return sum(f.stat().st_size for f in folder.rglob("*") if f.is_file())


def prune_stale(keep: Path) -> tuple[int, int]:
    """Remove the package folders beside `keep` that no build of this version loads: another
    format or torch, or no record at all (built before folders had one). Folders of other thread
    counts, ISAs or weights stay: the app, bench and generate may each use their own. Returns
    (folders removed, bytes freed)."""
    removed = freed = 0
    for d in keep.parent.glob("*"):
        if d == keep or not d.is_dir():
            continue
        meta = read_json(d / META, None)
        if isinstance(meta, dict) and meta.get("format") == FORMAT and meta.get("torch") == torch.__version__:
            continue
        size = _size(d)
        shutil.rmtree(d, ignore_errors=True)
        if not d.exists():
            removed, freed = removed + 1, freed + size
    return removed, freed
