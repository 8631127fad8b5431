"""The cache tidies itself (eagle2/model/native.py, eagle2/model/cache_tidy.py): building a library
removes that library's other builds, but not one another process is building, nor another
library's, and a build that cannot be removed is no error; each start of the command line removes
the folders earlier versions left (nogil/, compiled/) in one line with the bytes freed. Each test's EAGLE2_CACHE is a temporary folder (conftest.py)."""
from __future__ import annotations

from pathlib import Path

import pytest
from filelock import FileLock

from eagle2.model import cache_tidy, native
from eagle2.model.weights import cache_dir
from eagle2.tools.cli import main as cli_main

SOURCE = 'extern "C" int answer() { return 42; }\n'


def old_build(name: str, key: str, size: int) -> Path:
    folder = cache_dir() / "native" / name / key
    folder.mkdir(parents=True)
    (folder / f"{name}.so").write_bytes(b"\0" * size)
    return folder


def build(tmp_path, name: str, lines: list[str]):
    src = tmp_path / f"{name}.cpp"
    src.write_text(SOURCE)
    return native.build_library(name, src, ["-O0", "-shared", "-fPIC"], log=lines.append)


def test_a_build_removes_its_older_builds_but_not_one_being_built(tmp_path):
    stale, busy = old_build("lib_a", "0123456789ab", 3_000_000), old_build("lib_a", "ba9876543210", 1000)
    other = old_build("lib_b", "0123456789ab", 1000)   # another library: not this build's business
    lines = []
    with FileLock(str(busy / native.LOCK), timeout=0):   # another process building that one now
        built = build(tmp_path, "lib_a", lines)
    assert built is not None and built.is_file() and built.parent.parent == stale.parent
    assert not stale.exists() and (busy / "lib_a.so").is_file() and (other / "lib_b.so").is_file()
    assert lines == [f"built lib_a -> {built}", "removed 1 older build(s) of lib_a (3.0 MB)"]
    assert build(tmp_path, "lib_a", lines) == built and len(lines) == 2   # built already: nothing done


def test_a_build_that_cannot_be_removed_stays_and_is_no_error(tmp_path, monkeypatch):
    stale = old_build("lib_a", "0123456789ab", 1000)
    monkeypatch.setattr(cache_tidy.shutil, "rmtree", lambda path, ignore_errors=False: None)  # a file in use
    lines = []
    built = build(tmp_path, "lib_a", lines)
    assert built is not None and built.is_file() and (stale / "lib_a.so").is_file()
    assert lines == [f"built lib_a -> {built}"]


def retired_folders() -> dict[str, int]:
    sizes = {"nogil": 1_500_000, "compiled": 2_500_000}
    for name, size in sizes.items():
        (cache_dir() / name / "sub").mkdir(parents=True)
        (cache_dir() / name / "sub" / "lib.so").write_bytes(b"\0" * size)
    return sizes


def test_the_retired_folders_go_and_live_ones_stay():
    retired_folders()
    (cache_dir() / "lantern").mkdir()   # a live folder: stays
    lines = []
    assert cache_tidy.tidy(log=lines.append) == 4_000_000
    assert lines == ["removed the cache's retired nogil/, compiled/ (4.0 MB freed)"]
    assert not (cache_dir() / "nogil").exists() and not (cache_dir() / "compiled").exists()
    assert (cache_dir() / "lantern").is_dir()
    assert cache_tidy.tidy(log=lines.append) == 0 and len(lines) == 1   # nothing left to say


def test_the_command_line_tidies_at_its_start(capsys):
    retired_folders()
    with pytest.raises(SystemExit):
        cli_main(["generate"])   # --prompt missing: argparse stops it after the tidy
    assert not (cache_dir() / "nogil").exists() and not (cache_dir() / "compiled").exists()
    assert "removed the cache's retired nogil/, compiled/ (4.0 MB freed)" in capsys.readouterr().err
