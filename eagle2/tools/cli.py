"""`python -m eagle2 generate|fetch|bench|tau|profile|record ...`: the command-line entry points.
Training a draft head and writing its prompts are the training package's own commands:
`python -m eagle2_train train|prompts ...`.

A UserError (bad input, missing weights) prints one clear line on stderr and exits 2, never a
traceback.
"""
from __future__ import annotations

import argparse
import json
import sys
from typing import Callable

from ..errors import UserError
from ..logs import show_on_stderr
from ..model.weights import DEFAULT_PRESET
from ..policies.registry import default_policy
from .flags import (add_cost_args, add_model_args, add_policy_args, add_sampling_args, add_tree_args, apply_threads,
                    costs_first, recalibrate, sampling_from)

TOOLS = ("bench", "tau", "profile", "record")  # sub-commands with parsers of their own
# The training package sits above the engine, which never imports it: its commands have their own entry point.
TRAINING = ("train", "prompts")


def run_tool(name: str, argv: list[str]) -> int:
    """A sub-command's own main, imported only when it runs."""
    if name == "bench":
        from .bench import main
    elif name == "tau":
        from .tau import main
    elif name == "profile":
        from .profile import main
    else:
        from .record import main
    return main(argv)


def reporting_errors(run: Callable[[list[str]], int], argv: list[str]) -> int:
    """`run(argv)`'s exit code; a UserError is one "error: ..." line on stderr and 2 (never a
    traceback), an interrupt 130; the engine's log lines shown on stderr. The training package's
    entry point shares it."""
    show_on_stderr()
    try:
        return run(argv)
    except UserError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m eagle2", description=__doc__)
    sub = ap.add_subparsers(dest="cmd", required=True)

    g = sub.add_parser("generate", help="decode one prompt with a policy")
    g.add_argument("--prompt", required=True)
    g.add_argument("--policy", default=None,
                   help="plain or a tree policy: eagle2, eagle2-auto (N and depth chosen per cycle from measured "
                        "costs; --total-tokens and --depth are its caps), static, ddd, dyspec, lantern, ... "
                        f"(default: the one that pays on --device: {default_policy('cpu')} on a CPU, "
                        f"{default_policy('cuda')} on a GPU)")
    g.add_argument("--max-new-tokens", type=int, default=128)
    g.add_argument("--raw", action="store_true", help="no chat template")
    g.add_argument("--trace-out", default=None, help="write the step trace JSON here")
    g.add_argument("--json", action="store_true", help="last stdout line: one JSON summary object")
    add_sampling_args(g)
    add_tree_args(g)
    add_policy_args(g)
    add_model_args(g)
    add_cost_args(g)

    f = sub.add_parser("fetch", help="fetch and convert the embedded default model (once)")
    f.add_argument("--target", default=DEFAULT_PRESET)

    for name in TOOLS:
        s = sub.add_parser(name, help=f"see python -m eagle2 {name} --help", add_help=False)
        s.add_argument("rest", nargs=argparse.REMAINDER)
    return ap


def resolve_policy(a) -> str:
    """--policy, or (not given) the policy that pays on --device (registry.default_policy)."""
    return a.policy if a.policy else default_policy(str(a.device or "cpu").strip().lower())


def check_generate(a) -> dict:
    """Every generate flag checked before anything is loaded; returns the policy's own parameters."""
    from ..decoding.decoder import MAX_NEW_TOKENS
    from ..errors import check
    from ..policies.registry import cli_kwargs, is_plain, policy_class

    check(isinstance(a.prompt, str) and a.prompt.strip() != "", "The prompt is empty: type something first.")
    check(1 <= a.max_new_tokens <= MAX_NEW_TOKENS,
          f"max new tokens must be an integer in [1, {MAX_NEW_TOKENS}] (got {a.max_new_tokens}).")
    if not is_plain(a.policy):
        policy_class(a.policy)  # an unknown name fails here, not after the model has loaded
    return cli_kwargs(a.policy, a)  # the tree flags and --ddd-*/--dyspec-*/--lantern-*, by building it


def cmd_generate(a) -> int:
    from ..decoding.decoder import Decoder
    from ..decoding.prefill import checked_ids
    from ..model.chat import prompt_ids
    from ..model.loading import load_bundle
    from ..model.calibration import verify_profile
    from ..model.verify_times import RECORD_KEY

    a.policy = resolve_policy(a)
    sp = sampling_from(a)
    own = check_generate(a)  # validate everything, then load
    apply_threads(a)
    bundle = load_bundle(a.target, a.head, a.device, a.dtype)
    ids = checked_ids(bundle, prompt_ids(bundle.tokenizer, a.prompt, None, a.raw))  # before t(N) is measured
    recalibrate(a, bundle)
    costs_first(bundle, a.policy)
    dec = Decoder(bundle, a.policy, sp, max_new_tokens=a.max_new_tokens, record=a.trace_out is not None,
                  total_tokens=a.total_tokens, depth=a.depth, top_k=a.top_k, **own)
    note = dec.policy.lossy_note(sp.greedy) if dec.policy is not None else None
    if note:  # LANTERN: say whether it is lossy before any output
        print(note, file=sys.stderr)
    dec.start(input_ids=ids)
    while dec.finished is None:
        st = dec.step()
        if not a.json:
            print(st.text_delta, end="", flush=True)
    if a.trace_out:
        dec.trace.meta[RECORD_KEY] = verify_profile(bundle, measure=False)  # for the what-if views
        dec.trace.save(a.trace_out)
    s = dec.summary()
    if a.json:
        print(json.dumps(s))
    else:
        print(f"\n\n[{s['policy']}] {s['new_tokens']} tokens, {s['target_forwards']} target forwards, "
              f"tau {s['tau']:.2f}, {s['tokens_per_s']:.1f} tok/s", file=sys.stderr)
    return 0


def cmd_fetch(a) -> int:
    from ..model.weights import resolve_target
    print(resolve_target(a.target))
    return 0


def dispatch(argv: list[str]) -> int:
    if argv and argv[0] in TRAINING:
        raise UserError(f"`{argv[0]}` is a command of the training package: python -m eagle2_train {argv[0]} ...")
    from ..model import cache_tidy, measurer
    cache_tidy.tidy()   # what earlier versions left in the cache
    # A tool measures t(N) in the foreground before its timed work (flags.costs_first), never in
    # the background beside it: a budget without a plausible table starts from an estimate.
    measurer.MEASURER.close()
    if argv and argv[0] in TOOLS:
        return run_tool(argv[0], argv[1:])
    a = build_parser().parse_args(argv)
    if a.cmd == "generate":
        return cmd_generate(a)
    if a.cmd == "fetch":
        return cmd_fetch(a)
    return 1


def main(argv=None) -> int:
    return reporting_errors(dispatch, sys.argv[1:] if argv is None else argv)
