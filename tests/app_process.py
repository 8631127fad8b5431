"""`python app.py` in its own process, for tests that need the real server (a free port, its
output in files, every wait bounded, the whole process group stopped at the end)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest

from ui.screenshot import free_port, stop_group

REPO = Path(__file__).resolve().parent.parent


class App:
    """`python app.py ARGS` on a free port, stdout and stderr each in a file; `env` adds variables.
    The host and port are given as --host / --port, or (`by_env`) as GRADIO_SERVER_NAME /
    GRADIO_SERVER_PORT, which Gradio reads itself."""

    def __init__(self, tmp_path: Path, *args: str, env: dict | None = None, by_env: bool = False):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.out, self.err = tmp_path / "stdout.txt", tmp_path / "stderr.txt"
        where = {"GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(self.port)}
        full_env = {k: v for k, v in os.environ.items() if k not in where}
        full_env.update(GRADIO_ANALYTICS_ENABLED="False", EAGLE2_THREADS="1", PYTHONUNBUFFERED="1",
                        **(where if by_env else {}), **(env or {}))
        flags = [] if by_env else ["--host", "127.0.0.1", "--port", str(self.port)]
        with open(self.out, "w") as o, open(self.err, "w") as e:
            self.proc = subprocess.Popen([sys.executable, str(REPO / "app.py"), *flags, *args], cwd=REPO,
                                         env=full_env, stdout=o, stderr=e, start_new_session=True)

    def text(self) -> tuple[str, str]:
        return self.out.read_text(), self.err.read_text()

    def wait_for(self, fragment: str, stream: int, timeout: float = 240.0) -> str:
        deadline = time.time() + timeout
        while time.time() < deadline:
            text = self.text()[stream]
            if fragment in text:
                return text
            if self.proc.poll() is not None:
                break
            time.sleep(0.5)
        out, err = self.text()
        pytest.fail(f"no {fragment!r} (exit {self.proc.poll()}):\nstdout: {out[-2000:]}\nstderr: {err[-2000:]}")

    def serves(self) -> bool:
        with urllib.request.urlopen(self.url + "/", timeout=10) as r:
            return r.status == 200

    def stop(self) -> None:
        stop_group(self.proc)
