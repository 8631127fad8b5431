"""One configuration: the environment is read by eagle2/config.py only, each variable keeps its
meaning, and the engine's cache folder and t(N) file follow the configuration in force."""
from __future__ import annotations

import ast
from pathlib import Path

import pytest

from eagle2 import config
from eagle2.config import Config
from eagle2.model.calibration import times_path
from eagle2.model.weights import cache_dir

ROOT = Path(__file__).resolve().parent.parent


def test_every_variable_keeps_its_meaning(tmp_path):
    env = {"EAGLE2_TARGET": "my-target", "EAGLE2_HEAD": "random", "EAGLE2_DEVICE": "cuda", "EAGLE2_DTYPE": "float16",
           "EAGLE2_CONCURRENCY": "4", "EAGLE2_THREADS": "3",
           "EAGLE2_CACHE": str(tmp_path / "c"), "EAGLE2_TIMING_CACHE": str(tmp_path / "t.json"),
           "EAGLE2_MAX_SESSIONS": "8", "EAGLE2_SESSION_IDLE": "1.5", "CHROMIUM": "/opt/chrome"}
    assert Config.from_env(env) == Config(target="my-target", head="random", device="cuda", dtype="float16",
                                          concurrency=4, threads=3, cache_dir=tmp_path / "c",
                                          timing_cache=tmp_path / "t.json", max_sessions=8, session_idle_s=1.5,
                                          chromium="/opt/chrome")
    d = Config.from_env({"EAGLE2_THREADS": "0"})
    assert d == Config() and d.threads is None and d.device == "cpu"
    assert d.cache_dir == Path.home() / ".cache" / "eagle2" and d.timing_cache is None
    with pytest.raises(ValueError, match="EAGLE2_MAX_SESSIONS must be a number"):
        Config.from_env({"EAGLE2_MAX_SESSIONS": "many"})


def test_the_engine_reads_the_configuration_in_force(tmp_path, monkeypatch):
    monkeypatch.setenv("EAGLE2_CACHE", str(tmp_path / "env-cache"))
    monkeypatch.delenv("EAGLE2_TIMING_CACHE", raising=False)
    assert cache_dir() == tmp_path / "env-cache" and times_path() == tmp_path / "env-cache" / "verify_times.json"
    # one installed (app.py): the environment no longer counts
    monkeypatch.setattr(config, "_installed", None)
    config.use(Config(cache_dir=tmp_path / "app-cache", timing_cache=tmp_path / "times.json"))
    monkeypatch.setenv("EAGLE2_CACHE", str(tmp_path / "ignored"))
    assert config.current().cache_dir == tmp_path / "app-cache" and cache_dir() == tmp_path / "app-cache"
    assert times_path() == tmp_path / "times.json"


def environment_reads(path: Path):
    """(line, text) of each `os.environ` / `os.getenv` / `environ` use in a file."""
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Attribute) and node.attr in ("environ", "getenv", "environb"):
            yield node.lineno, ast.unparse(node)
        elif isinstance(node, ast.ImportFrom) and node.module == "os":
            for a in node.names:
                if a.name in ("environ", "getenv", "environb"):
                    yield node.lineno, f"from os import {a.name}"


def test_no_module_reads_the_environment_but_the_configuration():
    files = [p for d in ("eagle2", "eagle2_train", "ui", "viz") for p in (ROOT / d).rglob("*.py")] + [ROOT / "app.py"]
    found = {(p.relative_to(ROOT).as_posix(), n, text) for p in files for n, text in environment_reads(p)}
    # a child process's environment (ui/screenshot.py starting app.py) comes from config.child_env
    allowed = {"eagle2/config.py"}
    assert {f for f, _, _ in found} <= allowed, sorted(found)
