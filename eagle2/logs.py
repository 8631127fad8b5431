"""The engine's lines for the person running it (a download, a conversion, why a backend is not
used, a t(N) measurement) go through `logging` under the "eagle2" logger: a library caller keeps
Python's defaults (warnings only) or its own handlers; the entry points (the command-line tools,
app.py) show them on stderr from INFO up, each line "eagle2: ...".
"""
from __future__ import annotations

import logging
import sys


class _Stderr(logging.StreamHandler):
    """Writes to sys.stderr as it is at each line (a redirected or captured stream), not as it was
    when the handler was made."""

    def __init__(self):
        super().__init__(sys.stderr)

    @property
    def stream(self):
        return sys.stderr

    @stream.setter
    def stream(self, _value):
        pass


def show_on_stderr() -> None:
    """The engine's lines from INFO up on stderr, once however often it is called."""
    engine = logging.getLogger("eagle2")
    if not any(isinstance(h, _Stderr) for h in engine.handlers):
        handler = _Stderr()
        handler.setFormatter(logging.Formatter("eagle2: %(message)s"))
        engine.addHandler(handler)
    engine.setLevel(logging.INFO)   # (still passed on to the root's handlers, where an embedding program has any)
