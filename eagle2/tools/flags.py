"""Command-line flag groups shared by generate, bench, profile and train: defined once here."""
from __future__ import annotations

import argparse

from .. import config, threads
from ..model.weights import DEFAULT_PRESET


def add_model_args(p: argparse.ArgumentParser, head: bool = True, dtype: bool = True) -> None:
    p.add_argument("--target", default=DEFAULT_PRESET, help="preset, local folder or Hugging Face id")
    if head:
        p.add_argument("--head", default=None, help="EAGLE head folder or id; 'random' for an untrained head "
                                                    "(default: the preset's shipped head)")
    p.add_argument("--device", default="cpu", help="cpu or cuda")
    if dtype:
        p.add_argument("--dtype", default=None, help="q4_1 (the GGUF's blocks on integer kernels: the CPU default for the embedded "
                                                     "model), float32 (the CPU default for other models), bfloat16 (CUDA default), float16")
    p.add_argument("--threads", type=int, default=None, help=threads.HELP)


def add_tree_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--total-tokens", type=int, default=None, help="N: tokens the target verifies per cycle")
    p.add_argument("--depth", type=int, default=None, help="expansion levels of the dynamic tree")
    p.add_argument("--top-k", type=int, default=None, help="children per expanded node and beam width")


def add_cost_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--recalibrate", action="store_true",
                   help="re-measure this machine's verification costs t(N) (the hardware-aware budget's prior, "
                        "cached per device, model, torch version and thread count)")


def recalibrate(a, bundle) -> None:
    if getattr(a, "recalibrate", False):
        from ..model.calibration import verify_profile
        verify_profile(bundle, refresh=True)


def costs_first(bundle, policy: str) -> None:
    """t(N) measured now, before the timed work, when `policy` prices its trees with it and the
    cache holds no plausible table for the forward in use: a tool runs no visitors, so its
    measurement is quiet, and the policy itself never measures (it would start from an estimate)."""
    from ..policies.registry import uses_costs
    if uses_costs(policy):
        from ..model.calibration import verify_profile
        verify_profile(bundle)


def add_sampling_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--top-k-sampling", type=int, default=0)
    p.add_argument("--seed", type=int, default=0)


def add_policy_args(p: argparse.ArgumentParser) -> None:
    """Every registered policy's own parameters (--ddd-*, --dyspec-*, --lantern-*)."""
    from ..policies.registry import add_cli_args
    add_cli_args(p)


def sampling_from(a):
    from ..cycle.sampling import SamplingParams
    sp = SamplingParams(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k_sampling, seed=a.seed)
    sp.validate()
    return sp


def apply_threads(a) -> None:
    """torch's threads as --threads says, else EAGLE2_THREADS (eagle2/threads.py): a command runs
    one decode at a time."""
    given = getattr(a, "threads", None)
    threads.use_threads(config.current().threads if given is None else given)
