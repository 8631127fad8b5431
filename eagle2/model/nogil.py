"""Running a compiled package without holding the GIL (aoti_runner.cpp, a few lines of C++).

torch's Python binding of the package runner keeps the GIL for the whole forward, so while one
session's forward runs no other Python thread moves: not another session's forward, not the page.
The packages run no Python (llama.attend), so nothing stops the GIL from being let go: the
extension does exactly that. It is built once per torch and source (about 30 s with the C++
compiler the packages themselves are built with) into the cache folder, by whatever builds packages
(`python -m eagle2 compile`, the app's background compile); the forward only imports what was
built. Without it a package runs through torch's binding: the same results, one forward at a time.
"""
from __future__ import annotations

import importlib.util
import logging
import sysconfig
from pathlib import Path

import torch

from . import native

NAME = "eagle2_aoti_runner"
SOURCE = Path(__file__).with_name("aoti_runner.cpp")
_loaded: dict[Path, object] = {}


def flags() -> list[str]:
    """The compiler flags that build the extension: torch's headers and libraries, and the pybind11
    ABI torch was built with (so that the extension takes torch's own runner objects)."""
    from torch.utils.cpp_extension import include_paths, library_paths
    abi = [f'-DPYBIND11_{n}="{getattr(torch._C, f"_PYBIND11_{n}")}"' for n in ("COMPILER_TYPE", "STDLIB", "BUILD_ABI")
           if getattr(torch._C, f"_PYBIND11_{n}", None) is not None]
    libs = library_paths()
    return ["-O2", "-shared", "-fPIC", "-std=c++20",
            f"-D_GLIBCXX_USE_CXX11_ABI={int(torch._C._GLIBCXX_USE_CXX11_ABI)}",
            f"-DTORCH_EXTENSION_NAME={NAME}", "-DTORCH_API_INCLUDE_EXTENSION_H", *abi,
            *[f"-I{d}" for d in include_paths()], f"-I{sysconfig.get_paths()['include']}",
            *[f"-L{d}" for d in libs], *[f"-Wl,-rpath,{d}" for d in libs],
            "-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]


def built() -> Path:
    """Where the built extension lives (native.py: keyed by torch, the flags and the source)."""
    return native.library_path(NAME, SOURCE, flags())


def build(log=None) -> bool:
    """Build the extension unless it is there; False (with the reason logged) when it cannot be."""
    return native.build_library(NAME, SOURCE, flags(), log) is not None


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
