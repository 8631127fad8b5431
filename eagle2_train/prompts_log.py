"""Self-instruct's log (selfinstruct.py): every candidate and its verdict, the run's state and the
shipped prompts' provenance, kept xz-compressed beside the prompts (OUT.log.xz: 8,000 jobs' JSON
lines are 3.5 MB, 0.6 MB compressed) and rewritten whole, atomically, once a block."""
from __future__ import annotations

import lzma
from pathlib import Path

from eagle2.errors import UserError
from eagle2.files import atomic_write


def log_path(out: Path) -> Path:
    """The log of the prompts file `out`."""
    return out.with_name(out.name + ".log.xz")


def read_log(path: Path) -> str | None:
    """The log's text, None if there is none; a file that is no xz is one clear error, and so is an
    uncompressed log of an earlier version (its run resumes once it is compressed)."""
    try:
        return lzma.decompress(path.read_bytes()).decode("utf-8")
    except FileNotFoundError:
        plain = path.with_suffix("")
        if plain.exists():
            raise UserError(f"{plain} is an uncompressed log of an earlier version: `xz {plain}` to resume from it.") from None
        return None
    except (lzma.LZMAError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not a prompts log ({e}); delete it to start over.") from None


def write_log(path: Path, text: str) -> None:
    atomic_write(path, lzma.compress(text.encode("utf-8")))
