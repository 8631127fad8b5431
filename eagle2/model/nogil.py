"""Running a compiled package without holding the GIL (aoti_runner.cpp, a few lines of C++).

torch's Python binding of the package runner keeps the GIL for the whole forward, so while one
session's forward runs no other Python thread moves: not another session's forward, not the page.
The packages run no Python (llama.attend), so nothing stops the GIL from being let go: the
extension does exactly that. It is built once per torch and source (about 30 s: a C++ compiler
and ninja, as the packages themselves need) into the cache folder, by whatever builds packages
(`python -m eagle2 compile`, the app's background compile); the forward only imports what was
built. Without it a package runs through torch's binding: the same results, one forward at a time.
"""
from __future__ import annotations

import hashlib
import importlib.util
import logging
import shutil
import tempfile
from pathlib import Path

import torch
from filelock import FileLock

NAME = "eagle2_aoti_runner"
SOURCE = Path(__file__).with_name("aoti_runner.cpp")
_loaded: dict[Path, object] = {}


def folder() -> Path:
    """Where the built extension lives: keyed by torch and the source."""
    from .weights import cache_dir
    key = hashlib.sha256(f"{torch.__version__}|{SOURCE.read_text()}".encode()).hexdigest()[:12]
    return cache_dir() / "compiled" / f"nogil-{key}"


def built() -> Path:
    return folder() / f"{NAME}.so"


def build(log=None) -> bool:
    """Build the extension unless it is there; False (with the reason logged) when it cannot be."""
    target = built()
    if target.exists():
        return True
    target.parent.mkdir(parents=True, exist_ok=True)
    try:
        with FileLock(str(target.parent / "build.lock"), timeout=600):
            if target.exists():
                return True
            from torch.utils.cpp_extension import load
            with tempfile.TemporaryDirectory(dir=target.parent) as tmp:  # the .so is renamed in whole
                load(name=NAME, sources=[str(SOURCE)], build_directory=tmp, extra_cflags=["-O2"], verbose=False)
                shutil.move(str(Path(tmp) / f"{NAME}.so"), str(target.with_suffix(".so.part")))
            target.with_suffix(".so.part").rename(target)
    except Exception as e:  # no compiler or ninja: packages run through torch's binding
        (log or logging.getLogger(__name__).warning)(f"GIL-free runner not built ({type(e).__name__}: {e})")
        return False
    if log:
        log(f"built the GIL-free package runner -> {target}")
    return True


def run_function():
    """(run(runner, inputs) -> outputs, whether it lets go of the GIL): the extension's when it is
    built, else torch's binding."""
    path = built()
    mod = _loaded.get(path)
    if mod is None and path.exists():
        try:
            spec = importlib.util.spec_from_file_location(NAME, path)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            _loaded[path] = mod
        except Exception:  # built for another torch, or corrupt: torch's binding serves
            logging.getLogger(__name__).warning("GIL-free runner unusable", exc_info=True)
            mod = None
    if mod is not None:
        return mod.run, True
    return (lambda runner, inputs: runner.run(inputs)), False
