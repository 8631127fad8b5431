"""A long prompt's first Step over the page's HTTP API, as a visitor pasting a document meets it:
serve `python app.py` at its defaults, send /step with a prompt of about N characters (the start of
docs/algorithms.md after "Summarise this document:"), and time the first Step (the race's prefill
and its first cycle) and the next ones.

    python scripts/long_prompt.py --chars 13000 --steps 3 --threads 2 --out benchmarks/long-prompts/page-t2
"""
from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))
from classroom import Server, machine, step_args  # noqa: E402


def long_prompt(chars: int) -> str:
    """About `chars` characters of real prose and markdown (a document to summarise)."""
    text = (ROOT / "docs" / "algorithms.md").read_text(encoding="utf-8")
    return ("Summarise this document:\n\n" + text * (1 + chars // len(text)))[:chars]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--chars", type=int, default=13000)
    ap.add_argument("--steps", type=int, default=3, help="Steps after the first")
    ap.add_argument("--threads", type=int, default=None, help="app.py --threads (default: the app's)")
    ap.add_argument("--timeout", type=float, default=600.0, help="seconds one Step may take")
    ap.add_argument("--out", type=Path, required=True)
    a = ap.parse_args(argv)
    a.out.mkdir(parents=True, exist_ok=True)
    server = Server(["--threads", str(a.threads)] if a.threads else [], a.out / "server.log", {})
    prompt = long_prompt(a.chars)
    result = {"command": "python scripts/long_prompt.py " + " ".join(argv if argv is not None else sys.argv[1:]),
              "machine": machine(), "chars": len(prompt)}
    try:
        result["ready"] = server.wait_ready()
        from gradio_client import Client
        from eagle2.model.chat import prompt_ids
        from eagle2.model.tokenizer import load_tokenizer
        from eagle2.model.weights import DEFAULT_PRESET, resolve_target
        tok = load_tokenizer(Path(resolve_target(DEFAULT_PRESET)))
        result["prompt_tokens"] = len(prompt_ids(tok, prompt, None, False))
        c = Client(server.url + "/", verbose=False, download_files=False)
        args = step_args(prompt, 64)   # before the clock: its first call imports the engine (torch, seconds)
        seconds = []
        for _ in range(1 + a.steps):
            t0 = time.perf_counter()
            c.submit(*args, api_name="/step").result(timeout=a.timeout)
            seconds.append(round(time.perf_counter() - t0, 2))
            print(f"Step {len(seconds)}: {seconds[-1]} s", flush=True)
        result["step_s"] = seconds
    finally:
        server.stop()
    (a.out / "summary.json").write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
