"""The dependency files agree: requirements.txt (the Space's) pins pyproject.toml's dependencies
inside their ranges with a torch and a Python that ZeroGPU runs, requirements-dev.txt adds its
`dev` extra, constraints.txt pins every one of them inside its range, and the installed packages
are every top-level package of the checkout; a wheel install finds the shipped heads, traces and
prompts."""
from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

REPO = Path(__file__).resolve().parent.parent
PROJECT = tomllib.loads((REPO / "pyproject.toml").read_text())


def reqs(lines) -> dict[str, Requirement]:
    out = {}
    for line in lines:
        line = line.split("#", 1)[0].strip()
        if line and not line.startswith("-"):
            r = Requirement(line)
            out[canonicalize_name(r.name)] = r
    return out


def file_reqs(name: str) -> dict[str, Requirement]:
    return reqs((REPO / name).read_text().splitlines())


def as_text(rs: dict[str, Requirement]) -> dict[str, str]:
    return {k: str(r.specifier) for k, r in rs.items()}


DEPS = reqs(PROJECT["project"]["dependencies"])
DEV = reqs(PROJECT["project"]["optional-dependencies"]["dev"])
SPACE = reqs(PROJECT["project"]["optional-dependencies"]["space"])
# What ZeroGPU runs (hub-docs spaces-zerogpu.md): the newest torch, the Pythons it offers
ZEROGPU_TORCH_MAX = "2.11.0"
ZEROGPU_PYTHONS = ("3.10.13", "3.12.12")


def test_requirements_files_repeat_pyproject():
    """requirements.txt, the Space's: pyproject's dependencies, torch pinned to one ZeroGPU runs
    (inside pyproject's range), the others as pyproject says them; not `spaces`, which ZeroGPU's
    runtime brings (a pin would replace its version) and which the app imports only there."""
    from packaging.version import Version
    space = file_reqs("requirements.txt")
    assert set(space) == set(DEPS) and "spaces" in SPACE and "spaces" not in space
    for name, r in DEPS.items():
        if name == "torch":
            (pin,) = space[name].specifier
            assert pin.operator == "==" and r.specifier.contains(pin.version), f"requirements.txt: {space[name]} outside {r}"
        else:
            assert str(space[name].specifier) == str(r.specifier), name
    assert Version(next(iter(space["torch"].specifier)).version) <= Version(ZEROGPU_TORCH_MAX)
    dev_file = (REPO / "requirements-dev.txt").read_text()
    assert "-r requirements.txt" in dev_file.splitlines()
    assert as_text(file_reqs("requirements-dev.txt")) == as_text(DEV)


def test_every_dependency_has_a_pinned_version_inside_its_range():
    pins = file_reqs("constraints.txt")
    for name, r in {**DEPS, **DEV}.items():
        assert name in pins, f"constraints.txt does not pin {r.name}"
        (spec,) = pins[name].specifier
        assert spec.operator == "==", f"constraints.txt: {pins[name]} is not an exact pin"
        assert r.specifier.contains(spec.version, prereleases=True), f"{pins[name]} is outside {r}"
    assert all(len(p.specifier) == 1 and next(iter(p.specifier)).operator == "==" for p in pins.values())


def test_the_space_front_matter_runs_on_zero_gpu():
    """README's front matter configures the Space: Gradio at the pinned version, a Python that
    ZeroGPU offers and the project accepts, ZeroGPU suggested."""
    from packaging.specifiers import SpecifierSet
    front = (REPO / "README.md").read_text().split("---")[1]
    meta = dict(line.split(":", 1) for line in front.strip().splitlines())
    meta = {k.strip(): v.strip().strip('"') for k, v in meta.items()}
    assert meta["sdk"] == "gradio" and meta["sdk_version"] == str(DEPS["gradio"].specifier).lstrip("=")
    assert meta["python_version"] in ZEROGPU_PYTHONS
    assert SpecifierSet(PROJECT["project"]["requires-python"]).contains(meta["python_version"])
    assert meta["suggested_hardware"] == "zero-a10g" and meta["app_file"] == "app.py"


def test_every_top_level_package_is_installed():
    include = set(PROJECT["tool"]["setuptools"]["packages"]["find"]["include"])
    packages = {d.name for d in REPO.iterdir() if (d / "__init__.py").is_file()}
    assert packages == {p for p in include if "." not in p}


def test_the_checkout_reads_its_own_assets():
    from eagle2.model.weights import ASSETS, PRESETS
    assert ASSETS == REPO / "assets"                  # through the link eagle2/assets
    assert (Path(PRESETS["smollm2-135m"].head) / "model.safetensors").is_file()


# Run from a folder outside the checkout against the installed copy alone: the engine's head, the
# page's traces and example prompts, tau's held-out prompts, the trainer's prompt files and the
# q4_1 kernels' C++ sources (built on the user's machine).
FOUND_INSTALLED = """
import sys
from pathlib import Path
import eagle2, eagle2_train.train, ui.traces
from eagle2.model import qlib
from eagle2.model.weights import ASSETS, PRESETS
from eagle2.tools.tau import build_parser as tau_parser
site = Path(sys.argv[1]).resolve()
train = eagle2_train.train.build_parser().parse_args(["--out", "run"])
files = [Path(eagle2.__file__), ASSETS, Path(PRESETS["smollm2-135m"].head) / "model.safetensors",
         qlib.SOURCE, *qlib.HEADERS,
         ui.traces.EXAMPLES_FILE, Path(tau_parser().parse_args(["--out", "o"]).prompts), Path(train.heldout),
         *ui.traces.shipped_traces().values(), *map(Path, train.prompts.split(","))]
outside = [str(f) for f in files if not f.exists() or not f.resolve().is_relative_to(site)]
assert not outside, outside
assert len(ui.traces.shipped_traces()) >= 3 and len(train.prompts.split(",")) >= 6, files
print("ok", len(files))
"""


@pytest.mark.slow
def test_a_wheel_install_finds_the_shipped_assets(tmp_path):
    """`pip install .` (not editable) carries the heads, traces and prompts as package data."""
    src = tmp_path / "src"           # a copy, so the build leaves no build/ or egg-info in the checkout
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(REPO / name, src / name)
    for name in ("eagle2", "eagle2_train", "ui", "viz", "assets"):
        shutil.copytree(REPO / name, src / name, symlinks=True, ignore=shutil.ignore_patterns("__pycache__"))
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run([*pip, "wheel", str(src), "--no-deps", "--no-build-isolation", "-w", str(tmp_path / "dist")],
                   check=True, cwd=tmp_path, timeout=600)
    (wheel,) = (tmp_path / "dist").glob("eagle2_viz-*.whl")
    site = tmp_path / "site"
    subprocess.run([*pip, "install", "--no-deps", "--target", str(site), str(wheel)], check=True, cwd=tmp_path,
                   timeout=600)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    r = subprocess.run([sys.executable, "-c", FOUND_INSTALLED, str(site)], cwd=elsewhere, env=env,
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and r.stdout.startswith("ok"), r.stdout + r.stderr[-3000:]
