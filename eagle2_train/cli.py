"""`python -m eagle2_train train|prompts ...`: the training package's commands, beside the runtime's
`python -m eagle2 ...` (the engine never imports this package).

    python -m eagle2_train train --out runs/head        # train a draft head (eagle2_train/train.py)
    python -m eagle2_train prompts --n 8000             # more training prompts (eagle2_train/prompts.py)

A UserError (bad input, missing weights) prints one clear line on stderr and exits 2, never a
traceback.
"""
from __future__ import annotations

import argparse
import sys

from eagle2.tools.cli import reporting_errors

COMMANDS = {"train": "train an EAGLE draft head for a target (data, features, train stages)",
            "prompts": "write more training prompts (self-instruct, or a pinned PyPI prompt set)"}


def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m eagle2_train", description=__doc__,
                                 formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    for name, about in COMMANDS.items():
        s = sub.add_parser(name, help=f"{about}; see python -m eagle2_train {name} --help", add_help=False)
        s.add_argument("rest", nargs=argparse.REMAINDER)
    return ap


def dispatch(argv: list[str]) -> int:
    """A command's own main (its own parser and options), imported only when it runs."""
    if not argv or argv[0] not in COMMANDS:
        build_parser().parse_args(argv)  # --help, or argparse's message for a missing or unknown command
        return 2
    if argv[0] == "train":
        from .train import main
    else:
        from .prompts import main
    return main(argv[1:])


def main(argv=None) -> int:
    return reporting_errors(dispatch, sys.argv[1:] if argv is None else argv)
