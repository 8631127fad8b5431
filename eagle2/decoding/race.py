"""The lockstep race: three decoders on the same prompt, each timed on its own work.

The selected policy, a comparison policy and plain decoding. A tick runs one cycle of the main
decoder (after drafting the comparison policy's tree on the same context, for a side-by-side
view), then steps the comparison and plain decoders until they have caught up with its token
count, so all three are compared at equal lengths. No UI here: the page and the trace recorder
drive it, and its tests need no Gradio.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

from ..cycle.sampling import SamplingParams
from ..cycle.series import series
from ..cycle.trace import VIZ_KEY, StepTrace, Trace
from ..errors import UserError, check
from ..model.calibration import verify_profile
from ..model.verify_times import RECORD_KEY
from ..policies.base import TreePolicy
from ..policies.registry import BASELINE, PLAIN, check_policy, default_policy, is_plain, make_policy
from .decoder import MAX_NEW_TOKENS, Decoder
from .prefill import prefill

# Each decoder's role in the race, in the order of Race.decoders (a trace's series say which is which)
ROLES = ("main", "compare", PLAIN)


@dataclass(frozen=True)
class RaceSettings:
    """What a race runs: values only. `validate` checks them; the race builds its policies from
    them (`policy_for`) when it starts and when they change."""
    policy: str = default_policy("cpu")   # RaceSettings.for_device: the default of the device in use
    compare: str = BASELINE
    total_tokens: int = 60
    depth: int = 5
    top_k: int = 10
    temperature: float = 0.0
    top_p: float = 1.0
    seed: int = 0
    max_new_tokens: int = 64
    side_by_side: bool = True

    @classmethod
    def for_device(cls, kind: str) -> "RaceSettings":
        """The defaults that pay on this kind of device (registry.default_policy), against the
        static tree and plain decoding; the tree settings are the hardware-aware policy's caps."""
        return cls(policy=default_policy(kind))

    @property
    def tree(self) -> dict:
        return {"total_tokens": self.total_tokens, "depth": self.depth, "top_k": self.top_k}

    def sampling(self) -> SamplingParams:
        return SamplingParams(temperature=self.temperature, top_p=self.top_p, seed=self.seed)

    def validate(self) -> "RaceSettings":
        """Every value checked before any model work (a UserError names the bad one); returns self.
        A policy's parameters are checked by its own rules (registry.check_policy)."""
        self.sampling().validate()
        for name in (self.policy, self.compare):
            if not is_plain(name):
                check_policy(name, **self.tree)
        check(isinstance(self.max_new_tokens, int) and 1 <= self.max_new_tokens <= MAX_NEW_TOKENS,
              f"max new tokens must be an integer in [1, {MAX_NEW_TOKENS}] (got {self.max_new_tokens!r}).")
        return self

    def policy_for(self, name: str) -> TreePolicy | None:
        """A new policy of these settings for one decoder to own (None: plain)."""
        return None if is_plain(name) else make_policy(name, **self.tree)

    def with_(self, **kw) -> "RaceSettings":
        return replace(self, **kw)


class Race:
    """Three decoders in lockstep. Not thread-safe: one tick at a time (the page holds its
    session's lock through a Step)."""

    def __init__(self):
        self.prompt: str | None = None
        self.main = self.cmp = self.plain = None
        self.previews: dict[int, StepTrace] = {}   # cycle -> the comparison's tree on that context
        self.settings: RaceSettings | None = None

    @property
    def started(self) -> bool:
        return self.main is not None

    @property
    def finished(self) -> str | None:
        return self.main.finished if self.main is not None else None

    @property
    def decoders(self) -> tuple[Decoder, Decoder, Decoder]:
        return self.main, self.cmp, self.plain

    def start(self, bundle, prompt: str, s: RaceSettings) -> None:
        if not isinstance(prompt, str) or not prompt.strip():
            raise UserError("The prompt is empty: type something first (or pick an example).")
        main, cmp = s.policy_for(s.policy), s.policy_for(s.compare)   # bad settings fail here, before any model work
        decs = [Decoder(bundle, p, s.sampling(), max_new_tokens=s.max_new_tokens) for p in (main, cmp, None)]
        costs = verify_profile(bundle, measure=False)  # this machine's t(N): the what-if views price with it
        # One forward over the prompt for the three (the same model and bits, so the same K/V):
        # each copies it and is charged its seconds, as a run alone would pay them.
        ids = decs[0].ids_of(prompt)
        shared = prefill(bundle, ids, bundle.forward.new_cache(len(ids)), decs[0].clock())
        for d in decs:
            d.start(input_ids=ids, prefilled=shared)
            d.trace.meta[RECORD_KEY] = costs
        # The head reads the prompt once for both tree decoders (the same head on the same pairs):
        # the comparison takes the main decoder's reading, each charged its seconds in its first step.
        if main is not None and cmp is not None:
            decs[0].absorb()
            decs[1].take_reading(decs[0])
        self.main, self.cmp, self.plain = decs
        self.prompt, self.settings, self.previews = prompt, s, {}

    def apply(self, s: RaceSettings) -> list[str]:
        """Settings changed mid-run: they apply from the next cycle. Returns notes for the user."""
        old = self.settings
        if old is None or s == old:
            return []
        notes = []
        changed = [(d, s.policy_for(name)) for d, name, was in
                   ((self.main, s.policy, old.policy), (self.cmp, s.compare, old.compare))
                   if (name, s.tree) != (was, old.tree)]   # otherwise keep the policy's state (what it learnt)
        for d, policy in changed:
            d.set_policy(policy)
        for d in self.decoders:
            d.sampling = s.sampling()
            if s.max_new_tokens > len(d.generated):
                d.max_new_tokens = s.max_new_tokens
            elif s.max_new_tokens != old.max_new_tokens:
                notes.append(f"{len(d.generated)} tokens are already generated; max new tokens stays "
                             f"{d.max_new_tokens}.")
        if s.seed != old.seed:
            notes.append("The new seed applies when a prompt starts (Reset).")
        self.settings = s
        return sorted(set(notes))

    def tick(self) -> None:
        m = self.main
        if m.finished is not None:
            return
        if self.settings.side_by_side and self.cmp.policy is not None:
            m.absorb()   # the head reads the context once, for the preview and the step (its seconds count in the step)
            pv = m.preview(self.cmp.policy)  # a fork of the comparison's policy: what it learnt, unchanged by this
            self.previews[pv.cycle] = pv
        m.step()
        goal = len(m.generated)
        for d in (self.cmp, self.plain):
            while d.finished is None and len(d.generated) < goal:
                d.step()

    def labels(self) -> tuple[str, str, str]:
        a, b = self.main.policy_name, self.cmp.policy_name
        return a, (b if b != a else f"{b} (compare)"), PLAIN

    def export(self) -> Trace:
        """The race as one trace: the main decoder's steps, with the other decoders' series and the
        comparison's previews in meta[VIZ_KEY] (what Replay draws beside the main decoder)."""
        meta = dict(self.main.trace.meta)
        others = [series(label, d.trace.steps, role)
                  for d, label, role in list(zip(self.decoders, self.labels(), ROLES))[1:]]
        meta[VIZ_KEY] = {"series": others, "previews": [p.to_dict() for p in self.previews.values()],
                         "compare_policy": self.cmp.policy_name}
        return Trace(meta=meta, steps=list(self.main.trace.steps))
