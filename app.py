"""eagle2-viz: step through EAGLE-2 speculative decoding in the browser.

    python app.py                       # http://127.0.0.1:7860 (GRADIO_SERVER_NAME / _PORT honoured)
    python app.py --host 0.0.0.0 --port 8080 --device cuda
    python app.py --record-traces       # re-record the shipped traces in assets/traces/

Three decoders race on the same prompt in lockstep (eagle2/cycle/race.py); the page is ui/ (one
module per tab), its figures viz/. This file only reads the options and serves the page.
"""
from __future__ import annotations

import argparse
import os


def main(argv=None) -> int:
    env = os.environ.get
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default=env("GRADIO_SERVER_NAME", "127.0.0.1"))
    ap.add_argument("--port", type=int, default=int(env("GRADIO_SERVER_PORT", env("PORT", 7860))))
    ap.add_argument("--target", default=env("EAGLE2_TARGET"), help="model preset, folder or HF id")
    ap.add_argument("--head", default=env("EAGLE2_HEAD"), help="EAGLE head folder/id or 'random'")
    ap.add_argument("--device", default=env("EAGLE2_DEVICE", "cpu"), help="cpu or cuda")
    ap.add_argument("--dtype", default=env("EAGLE2_DTYPE"))
    ap.add_argument("--concurrency", type=int, default=int(env("EAGLE2_CONCURRENCY", 2)),
                    help="sessions decoding at the same time (each has its own decoders)")
    ap.add_argument("--record-traces", action="store_true", help="re-record assets/traces/*.json and exit")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="with --record-traces")
    ap.add_argument("--threads", type=int, default=int(env("EAGLE2_THREADS", 0)) or None,
                    help="torch CPU threads per decode (default: CPU cores / concurrency)")
    a = ap.parse_args(argv)

    from ui.threads import default_threads, set_threads
    set_threads(a.threads or default_threads(a.concurrency))
    if a.record_traces:
        from eagle2.errors import UserError
        from eagle2.model.loading import load_bundle
        from ui.traces import record_traces
        try:
            record_traces(load_bundle(a.target, a.head, a.device, a.dtype), max_new_tokens=a.max_new_tokens)
        except UserError as e:
            print(f"error: {e}")
            return 2
        return 0
    from ui.model import MODEL
    from ui.page import launch
    MODEL.start(a.target, a.head, a.device, a.dtype)
    launch(a.host, a.port, a.concurrency)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
