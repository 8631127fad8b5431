"""The controls' help texts. The policies' come from the engine's registry, so a new policy
brings its own line and the page never names one."""
from __future__ import annotations

from eagle2.decoding.race import RaceSettings
from eagle2.devices import is_cuda
from eagle2.policies.registry import HARDWARE_AWARE, describe, names

HELP = {
    "compare": "Runs in lockstep with the selected policy; its tree for the same cycle is drawn alongside.",
    "total_tokens": "N: tokens the target verifies per cycle (root + the N-1 best drafted nodes).",
    "depth": "Expansion levels after the first: the tree reaches depth + 1.",
    "top_k": "Children per expanded node and the beam width (nodes expanded per level).",
    "temperature": "0 = greedy (output identical to plain decoding). Above 0: sampled, same distribution.",
    "top_p": "Nucleus sampling: keep the smallest set of tokens with this much probability.",
    "seed": "Seeds the samplers; applies when a prompt starts (Step on a new prompt, or Reset).",
    "max_new_tokens": "Generation stops here (or at end-of-sequence).",
    "side_by_side": "Costs one extra draft + verify per step (not timed).",
    "colour_by": "Path value = product of draft probabilities from the root (≈ chance of acceptance); "
                 "draft prob = the node's own.",
    "examples": "By category; picks fill the prompt box.",
    "follow_code": "Your class opens the link (or types this code and presses Follow): their pages follow "
                   "your race live, decoding nothing. Step and Run as usual; only you drive.",
}


def policy_help() -> str:
    """The policy dropdown's help: what a policy is, then one line per registered policy."""
    return " ".join(["How the draft tree is built."] + [f"{n} — {describe(n)}" for n in names()])


def preset_label(s: RaceSettings) -> str:
    """A tree preset as a button says it: the policy and its (N, depth, top-k), caps for the
    hardware-aware budget (it picks N and depth below them every cycle)."""
    caps = "caps " if s.policy == HARDWARE_AWARE else ""
    return f"{s.policy} ({caps}{s.total_tokens}, {s.depth}, {s.top_k})"


def presets_help(kind: str) -> str:
    """Why the page starts where it does on this kind of device, and the other device's choice."""
    gpu = RaceSettings.for_device("cuda")
    here = "This page runs on a GPU." if is_cuda(kind) else "This page runs on a CPU."
    return (f"On a CPU, verifying a {gpu.total_tokens}-token tree costs several times one token, so the "
            f"hardware-aware budget (small trees) wins; on a GPU {gpu.total_tokens} tokens cost about what one "
            f"does, and EAGLE-2 ({gpu.total_tokens}, {gpu.depth}, {gpu.top_k}) wins. {here}")
