"""The dependency files agree: requirements.txt repeats pyproject.toml's dependencies,
requirements-dev.txt adds its `dev` extra, constraints.txt pins every one of them inside its
range, and the installed packages are every top-level package of the checkout."""
from __future__ import annotations

import tomllib
from pathlib import Path

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


def test_requirements_files_repeat_pyproject():
    assert as_text(file_reqs("requirements.txt")) == as_text(DEPS)
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


def test_every_top_level_package_is_installed():
    include = set(PROJECT["tool"]["setuptools"]["packages"]["find"]["include"])
    packages = {d.name for d in REPO.iterdir() if (d / "__init__.py").is_file()}
    assert packages == {p for p in include if "." not in p}
