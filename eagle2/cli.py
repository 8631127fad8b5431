"""`python -m eagle2 generate|fetch|bench|train ...`: the command-line entry points.

A UserError (bad input, missing weights) prints one clear line on stderr and exits 2, never a
traceback.
"""
from __future__ import annotations

import argparse
import json
import sys

from .errors import UserError


def _add_model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--target", default="smollm2-135m", help="preset, local folder or Hugging Face id")
    p.add_argument("--head", default=None, help="EAGLE head folder or id; 'random' for an untrained head "
                                                "(default: the preset's shipped head)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    p.add_argument("--dtype", default=None, help="float32 (CPU default), bfloat16 (CUDA default), float16")


def add_tree_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--total-tokens", type=int, default=None, help="N: tokens the target verifies per cycle")
    p.add_argument("--depth", type=int, default=None, help="expansion levels of the dynamic tree")
    p.add_argument("--top-k", type=int, default=None, help="children per expanded node and beam width")


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k-sampling", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m eagle2", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="decode one prompt with a policy")
    g.add_argument("--prompt", required=True)
    g.add_argument("--policy", default="eagle2",
                   help="plain, static, eagle2, eagle2-auto (N and depth chosen per cycle from measured costs; "
                        "--total-tokens and --depth are its caps), ddd, dyspec, lantern")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--raw", action="store_true", help="no chat template")
    g.add_argument("--trace-out", default=None, help="write the step trace JSON here")
    g.add_argument("--json", action="store_true", help="last stdout line: one JSON summary object")
    add_sampling_args(g)
    add_tree_args(g)
    from .extra_policies import add_cli_args as _add_policy_args
    _add_policy_args(g)  # --ddd-*, --dyspec-*, --lantern-*
    _add_model_args(g)

    f = sub.add_parser("fetch", help="fetch and convert the embedded default model (once)")
    f.add_argument("--target", default="smollm2-135m")

    for name in ("bench", "train", "profile"):
        s = sub.add_parser(name, help=f"see python -m eagle2 {name} --help", add_help=False)
        s.add_argument("rest", nargs=argparse.REMAINDER)
    return ap


def cmd_generate(a) -> int:
    from .decoder import Decoder
    from .loading import load_bundle
    from .sampling import SamplingParams

    sp = SamplingParams(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k_sampling, seed=a.seed)
    sp.validate()
    from .extra_policies import cli_kwargs
    own = cli_kwargs(a.policy, a)  # --ddd-*/--dyspec-*/--lantern-* flags, checked before loading
    bundle = load_bundle(a.target, a.head, a.device, a.dtype)
    dec = Decoder(bundle, a.policy, sp, max_new_tokens=a.max_new_tokens, record=a.trace_out is not None,
                  total_tokens=a.total_tokens, depth=a.depth, top_k=a.top_k, **own)
    if hasattr(dec.policy, "lossy_note"):  # LANTERN: say whether it is lossy before any output
        print(dec.policy.lossy_note(sp.greedy), file=sys.stderr)
    dec.start(a.prompt, raw=a.raw)
    while dec.finished is None:
        st = dec.step()
        if not a.json:
            print(st.text_delta, end="", flush=True)
    if a.trace_out:
        dec.trace.save(a.trace_out)
    s = dec.summary()
    if a.json:
        print(json.dumps(s))
    else:
        print(f"\n\n[{s['policy']}] {s['new_tokens']} tokens, {s['target_forwards']} target forwards, "
              f"tau {s['tau']:.2f}, {s['tokens_per_s']:.1f} tok/s", file=sys.stderr)
    return 0


def cmd_fetch(a) -> int:
    from .weights import resolve_target
    print(resolve_target(a.target))
    return 0


def main(argv=None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    try:
        if argv and argv[0] in ("bench", "train", "profile"):
            import importlib
            return importlib.import_module(f".{argv[0]}", __package__).main(argv[1:])
        a = build_parser().parse_args(argv)
        if a.cmd == "generate":
            return cmd_generate(a)
        if a.cmd == "fetch":
            return cmd_fetch(a)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    return 1
