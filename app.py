"""eagle2-viz: step through EAGLE-2 speculative decoding in the browser.

    python app.py                       # http://127.0.0.1:7860 (Gradio reads GRADIO_SERVER_NAME / _PORT)
    python app.py --host 0.0.0.0 --port 8080 --device cuda
    python app.py --record-traces       # re-record the shipped traces in assets/traces/

Three decoders race on the same prompt in lockstep (eagle2/decoding/race.py); the page is ui/ (one
module per tab), its figures viz/. This file only reads the options and serves the page.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace


def main(argv=None) -> int:
    from eagle2 import config, threads
    from eagle2.errors import UserError
    from eagle2.logs import show_on_stderr
    try:
        env = config.Config.from_env()   # the flags' defaults; a flag given wins
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    zero_gpu_first(env)
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--host", default=None, help="default: Gradio's (GRADIO_SERVER_NAME, else 127.0.0.1)")
    ap.add_argument("--port", type=int, default=None,
                    help="default: Gradio's (GRADIO_SERVER_PORT, else the first free port from 7860)")
    ap.add_argument("--target", default=env.target, help="model preset, folder or HF id (EAGLE2_TARGET)")
    ap.add_argument("--head", default=env.head, help="EAGLE head folder/id or 'random' (EAGLE2_HEAD)")
    ap.add_argument("--device", default=env.device, help="cpu or cuda (EAGLE2_DEVICE)")
    ap.add_argument("--dtype", default=env.dtype, help="q4_1 (the embedded model's default on a CPU), float32, bfloat16 (EAGLE2_DTYPE)")
    ap.add_argument("--concurrency", type=int, default=env.concurrency,
                    help="sessions decoding at the same time (each has its own decoders; EAGLE2_CONCURRENCY)")
    ap.add_argument("--recalibrate", action="store_true",
                    help="re-measure this machine's verification costs t(N) once the model is loaded (the "
                         "hardware-aware budget's prior; it also corrects itself while it runs)")
    ap.add_argument("--record-traces", action="store_true", help="re-record assets/traces/*.json and exit")
    ap.add_argument("--max-new-tokens", type=int, default=48, help="with --record-traces")
    ap.add_argument("--threads", type=int, default=env.threads, help=threads.HELP)
    a = ap.parse_args(argv)
    # Checked before anything is imported or loaded (argparse's "error: ..." line, exit 2).
    try:
        threads.check_threads(a.threads)
    except UserError as e:
        ap.error(str(e))
    if a.concurrency < 1:
        ap.error(f"--concurrency must be >= 1 (got {a.concurrency}).")
    if a.port is not None and not 1 <= a.port <= 65535:   # Gradio cannot serve on 0 (a port of the OS's choosing)
        ap.error(f"--port must be in [1, 65535] (got {a.port}).")
    if a.max_new_tokens < 1:
        ap.error(f"--max-new-tokens must be >= 1 (got {a.max_new_tokens}).")
    a.device = live_device(env, a.device)
    cfg = config.use(replace(env, target=a.target, head=a.head, device=a.device, dtype=a.dtype,
                             concurrency=a.concurrency, threads=a.threads or None))

    threads.use_threads(cfg.threads, cfg.concurrency)
    # The engine's lines on stderr from INFO up: a download or conversion, why a backend is not
    # used, and each t(N) measurement (naming the thread that measured and whether the table was
    # cached, so a server's log shows that no visitor's Step measured).
    show_on_stderr()
    if a.record_traces:
        from eagle2.model.loading import load_bundle
        from ui.traces import record_traces
        try:
            record_traces(load_bundle(cfg.target, cfg.head, cfg.device, cfg.dtype), max_new_tokens=a.max_new_tokens)
        except UserError as e:
            print(f"error: {e}", file=sys.stderr)
            return 2
        return 0
    from eagle2.model import cache_tidy
    from ui.model import MODEL
    from ui.page import launch
    cache_tidy.tidy()   # what earlier versions left in the cache: one line in the log when any goes
    MODEL.start(cfg.target, cfg.head, cfg.device, cfg.dtype, recalibrate=a.recalibrate)
    try:
        demo = launch(a.host, a.port, cfg.concurrency, block=False)
    except OSError as e:
        print(f"error: cannot serve on {a.host or 'the default host'}:{a.port or 'the default port'} ({e}).",
              file=sys.stderr)
        return leave(2, MODEL)
    url = demo.local_url.rstrip("/")
    print(f"serving {url}; loading the model (the page shows a recorded trace meanwhile)...", flush=True)
    try:
        announce(MODEL, url)
        demo.block_thread()
    except KeyboardInterrupt:
        print("interrupted; closing the server.", file=sys.stderr)
        demo.close()
        return leave(130, MODEL)
    return 0


def leave(code: int, model) -> int:
    """The exit code, or an exit now while the model still loads: the interpreter's own exit tears
    down torch's C++ state under the loader's thread, which then aborts the process ("terminate
    called without an active exception", exit 134) after the line that said why it stopped."""
    if model.loading is not None and not model.loading.done():
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(code)
    return code


def zero_gpu_first(env) -> None:
    """On a ZeroGPU Space (SPACES_ZERO_GPU): `spaces` imported before torch and Gradio (it stands
    in for CUDA in this process, which has no GPU, and Gradio reads it when imported), and its
    wrapping of every event into a GPU call switched off: the live page decodes on the CPU, and
    only "Record on the GPU" asks for a GPU (ui/gpu_record.py). Elsewhere nothing."""
    if not env.zero_gpu:
        return
    try:
        import spaces
    except Exception as e:  # noqa: BLE001  (the page still serves; its GPU button says why it cannot record)
        print(f"warning: SPACES_ZERO_GPU is set but `spaces` cannot be imported ({type(e).__name__}: {e}).",
              file=sys.stderr)
        return
    spaces.disable_gradio_auto_wrap()


def live_device(env, device: str) -> str:
    """The device the live page decodes on: `device`, but the CPU on a ZeroGPU Space, whose main
    process has no GPU (torch there reports an emulated one); a line says so if CUDA was asked."""
    from eagle2.devices import is_cuda
    if env.zero_gpu and is_cuda(device):
        print(f"note: on a ZeroGPU Space the page decodes on the CPU (--device {device} ignored); "
              f"'Record on the GPU' runs a race on the Space's GPU.", file=sys.stderr)
        return "cpu"
    return device


def announce(model, url: str, poll: float = 0.5) -> None:
    """Wait for the model, then say in the terminal whether the page can decode: "ready at URL
    (model loaded in X s)" on stdout, or the loading error as one line on stderr."""
    while not model.wait(poll):
        pass
    if model.warning:
        print(f"warning: {model.warning}", file=sys.stderr, flush=True)
    if model.ready:
        print(f"ready at {url} (model loaded in {model.elapsed or 0:.1f} s; {model.forward_line()})", flush=True)
    else:
        print(f"error: the model could not be loaded: {str(model.error).rstrip('.')}; the page at {url} "
              f"still serves Replay, but cannot decode.", file=sys.stderr, flush=True)


if __name__ == "__main__":
    raise SystemExit(main())
