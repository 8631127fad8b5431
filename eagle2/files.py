"""Writing files so that a reader never sees half of one, and updating a shared JSON file from
several processes without losing anyone's update.

`atomic_path` hands out a unique temporary file in the target's folder (so the final rename stays
on one file system), then fsyncs and renames it over the target only when the writer finished;
`atomic_write` is that for bytes or text in hand; `locked_update` is a read-modify-write of a JSON
file under an exclusive lock on a sibling `.lock` file (`filelock`, which picks the platform's lock).
"""
from __future__ import annotations

import contextlib
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable, Iterator

from filelock import FileLock

_UMASK = os.umask(0)   # mkstemp creates 0600 files; the finished file gets the usual 0666 & ~umask
os.umask(_UMASK)


def _fsync_dir(folder: Path) -> None:
    """Make a rename inside `folder` durable (best effort: not every platform opens folders)."""
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path, suffix: str = ".part") -> Iterator[Path]:
    """A temporary path to write `path`'s new content to; when the block ends without an error it
    is flushed to disk and renamed over `path` (readers see the old file or the new one, never a
    part), and on an error it is removed. The name is unique (several processes or threads may
    write the same target at once: the last rename wins) and ends in `suffix` (a tool that wants
    `.pt2` gets it)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=suffix)
    os.close(fd)
    tmp = Path(name)
    try:
        yield tmp
        fd = os.open(tmp, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        os.chmod(tmp, 0o666 & ~_UMASK)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    _fsync_dir(path.parent)


def atomic_write(path, data: bytes | str, encoding: str = "utf-8") -> None:
    """Replace `path` with `data` (text is encoded with `encoding`) atomically."""
    raw = data.encode(encoding) if isinstance(data, str) else bytes(data)
    with atomic_path(path) as tmp:
        tmp.write_bytes(raw)


def read_json(path, default: Any = None) -> Any:
    """The JSON in `path`, or `default` when it is missing or unreadable (a corrupt cache)."""
    try:
        return json.loads(Path(path).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return default


def locked_update(path, fn: Callable[[dict], dict], indent: int | None = 1) -> dict:
    """Read-modify-write the JSON object in `path` under an exclusive lock on `path` + ".lock": `fn`
    gets its content ({} when the file is missing, unreadable or not an object) and returns the new
    content, written atomically and returned. Two processes (or threads: each call holds a lock
    object of its own) updating different keys both keep theirs."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(path.with_name(path.name + ".lock")):
        old = read_json(path, {})
        new = fn(old if isinstance(old, dict) else {})
        atomic_write(path, json.dumps(new, indent=indent))
        return new
