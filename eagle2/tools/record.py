"""`python -m eagle2 record`: the page's race on one prompt, run to the end on one device in one
call, written as a trace file that Replay opens (what the page's "Record on the GPU" button does;
decoding/recorded_race.py).

    python -m eagle2 record --prompt "Explain speculative decoding." --device cuda --out gpu.json

--device defaults to cuda; there the weights are fp32 unless --dtype says otherwise (on a CPU, the
model's own default). The trace carries the device's t(N), measured first, and its name.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

from ..decoding.recorded_race import DIGITS, SECONDS, record, summary_line
from ..errors import UserError
from .flags import add_model_args, apply_threads


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m eagle2 record", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--prompt", required=True)
    ap.add_argument("--out", required=True, help="the trace file to write (JSON)")
    ap.add_argument("--max-new-tokens", type=int, default=64)
    ap.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    ap.add_argument("--top-p", type=float, default=1.0)
    ap.add_argument("--seed", type=int, default=0)
    add_model_args(ap)
    ap.set_defaults(device="cuda")
    return ap


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    out = Path(a.out)
    if out.is_dir():
        raise UserError(f"--out {out} is a folder; name the trace file to write.")
    apply_threads(a)
    tr = record(a.prompt, a.device, a.target, a.head, a.dtype, a.max_new_tokens, a.temperature, a.top_p, a.seed)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(tr.to_json(digits=DIGITS), encoding="utf-8")
    s = tr.meta[SECONDS]
    print(f"wrote {out} ({out.stat().st_size // 1024} KiB, {len(tr.steps)} cycles; loading {s['load']:.1f} s, "
          f"t(N) {s['costs']:.1f} s, race {s['race']:.1f} s)", file=sys.stderr)
    print(summary_line(tr))
    return 0
