"""The engine's lockstep race (eagle2/decoding/race.py) on the real default model, without the page:
greedy decoders that agree token for token, side-by-side previews numbered like the main cycle
they share, settings that apply from the next cycle, and each decoder timed on its own work."""
from __future__ import annotations

import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch

from eagle2.decoding.race import Race, RaceSettings
from eagle2.errors import UserError
from eagle2.policies.registry import EAGLE2

ROOT = Path(__file__).resolve().parent.parent
SMALL = RaceSettings(policy=EAGLE2, total_tokens=10, depth=3, top_k=4, max_new_tokens=40)   # EAGLE-2 against the static tree


def race(bundle, prompt: str, ticks: int, **kw) -> Race:
    r = Race()
    r.start(bundle, prompt, SMALL.with_(**kw))
    for _ in range(ticks):
        r.tick()
    return r


def drafted(r: Race) -> list:
    return [s for s in r.main.trace.steps if s.tree is not None]


@pytest.mark.slow   # the full suite's: a fresh interpreter importing torch (the fast tier stays under two minutes)
def test_the_race_imports_no_gradio():
    code = ("import sys, eagle2.decoding.race\n"
            "assert 'gradio' not in sys.modules, sorted(m for m in sys.modules if m.startswith('gradio'))\n"
            "print('ok')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


@pytest.mark.slow  # the real model's decodes (several seconds each)
def test_greedy_lockstep_gives_identical_tokens(real_bundle):
    r = race(real_bundle, "Write a short story about a lighthouse keeper.", 3, max_new_tokens=20)
    m, c, p = r.decoders
    assert r.finished is None
    assert r.labels() == ("eagle2", "static", "plain")
    n = len(m.generated)
    assert n >= 4                                                    # prefill token + at least one per cycle
    assert c.generated[:n] == m.generated and p.generated == m.generated   # plain stops exactly at the goal
    assert len(c.generated) >= n                                     # the comparison caught up (may overshoot)
    while not r.finished:                                            # to the end: all three agree in full
        r.tick()
    assert r.finished in ("max_new_tokens", "eos")
    assert m.generated == c.generated == p.generated
    assert r.finished == "eos" or len(m.generated) == 20
    lengths = [len(d.trace.steps) for d in r.decoders]
    r.tick()                                                         # a finished race ticks no more
    assert [len(d.trace.steps) for d in r.decoders] == lengths


@pytest.mark.slow  # the real model's decodes (several seconds each)
def test_previews_are_numbered_like_the_main_cycle_they_share(real_bundle):
    r = race(real_bundle, "Name three rivers in Europe.", 4)
    steps = drafted(r)
    assert sorted(r.previews) == [s.cycle for s in steps] == [1, 2, 3, 4]
    for s in steps:
        pv = r.previews[s.cycle]
        assert pv.cycle == s.cycle and pv.root == s.root == s.tree.tokens[0]   # same context
        assert pv.policy == r.cmp.policy_name == "static" and s.policy == "eagle2"
        assert pv.tree is not None and pv.cumulative == {}                     # drafted, not committed
    # previews commit nothing: without them the main decoder drafts the same trees, keeps the same tokens
    off = race(real_bundle, "Name three rivers in Europe.", 2, side_by_side=False)
    assert off.previews == {} and len(drafted(off)) == 2
    assert [s.tree.tokens for s in drafted(off)] == [s.tree.tokens for s in steps[:2]]
    assert r.main.generated[:len(off.main.generated)] == off.main.generated


@pytest.mark.slow  # the real model's decodes (several seconds each)
def test_settings_applied_mid_run_take_effect_next_cycle(real_bundle):
    r = race(real_bundle, "Say hello.", 1)
    kept_policy = r.main.policy
    assert r.apply(r.settings) == []                                 # nothing changed
    assert r.apply(r.settings.with_(temperature=0.0, top_p=1.0)) == []
    notes = r.apply(r.settings.with_(policy="static", compare="eagle2", temperature=0.5, seed=3))
    assert notes == ["The new seed applies when a prompt starts (Reset)."]
    assert r.main.policy is not kept_policy
    assert all(d.sampling.temperature == 0.5 for d in r.decoders)
    assert r.settings.policy == "static"
    r.tick()
    steps = r.main.trace.steps
    assert [s.policy for s in steps[1:]] == ["eagle2", "static"]
    assert r.previews[1].policy == "static" and r.previews[2].policy == "eagle2"
    assert r.labels() == ("static", "eagle2", "plain")
    # sampling-only changes keep the tree policy's object (and what it has learnt)
    same = r.main.policy
    r.apply(r.settings.with_(temperature=0.0))
    assert r.main.policy is same
    # a max-new-tokens below what is already generated is refused with a note
    have = len(r.main.generated)
    notes = r.apply(r.settings.with_(max_new_tokens=1))
    assert any(f"{have} tokens are already generated" in n for n in notes)
    assert r.main.max_new_tokens == SMALL.max_new_tokens
    r.apply(r.settings.with_(max_new_tokens=have + 1))
    r.tick()
    assert r.finished == "max_new_tokens" and len(r.main.generated) == have + 1


@pytest.mark.slow  # the real model's decodes (several seconds each)
def test_each_decoder_is_timed_on_its_own(real_bundle):
    t0 = time.perf_counter()
    r = race(real_bundle, "Write a haiku about autumn leaves.", 3)
    elapsed = time.perf_counter() - t0
    walls = []
    for d in r.decoders:
        assert d.trace.steps[-1].cumulative["wall_s"] == pytest.approx(d.wall)   # the trace says what it ran
        walls.append(d.wall)
    assert len(set(walls)) == 3 and all(w > 0 for w in walls)
    # the three ran one after another, each clock stopped while the others worked; the prompt's
    # forward ran once for the three and is charged to each (as a run alone would pay it)
    first = r.main.trace.steps[0].timings
    shared = first["verify_inputs_s"] + first["target_forward_s"]
    assert sum(walls) - 2 * shared <= elapsed
    # previews are timed on their own (test_a_preview_changes_nothing_of_the_next_step: a step's
    # timings are the same with or without one before it)
    m = r.main
    assert all(pv.timings["verify_s"] > 0 for pv in r.previews.values())
    # forward passes: one per cycle each (plain: one per token); previews' forwards are not counted
    assert m.target_forwards == m.cycle and r.plain.target_forwards == len(r.plain.generated)


@pytest.mark.slow  # the real model's decodes (several seconds each)
def test_a_preview_teaches_the_comparison_policy_nothing(real_bundle):
    """The side-by-side preview drafts with a fork of the comparison's policy: the policies that
    keep statistics (the auto budget, DDD) count exactly their own decoder's cycles, with or
    without side-by-side, so the auto budget's exploration schedule does not shift either."""
    for side in (True, False):
        r = race(real_bundle, "Explain why the sky is blue.", 5, policy="ddd", compare="eagle2-auto",
                 side_by_side=side, max_new_tokens=200)
        m, c, _ = r.decoders
        assert len(r.previews) == (5 if side else 0)
        assert m.policy.stats["cycles"] == m.cycle - 1                       # prefill is cycle 0
        assert c.policy.stats["cycles"] == c.cycle - 1 == sum(c.policy.stats["n"].values())
        if side:  # the fork read what the budget had learnt (its costs), and kept its own counts
            assert all(pv.tree.record is not None for pv in r.previews.values())


# ------------------------------------------------------------------ a Step on a tiny model
# (conftest's random Llama with a random head and a word-level tokenizer: "w1 w2 ..." prompts)

TINY = RaceSettings(policy="eagle2", compare="static", total_tokens=8, depth=3, top_k=4, max_new_tokens=24)


@pytest.fixture(scope="module")
def tiny_bundle(tiny_target):
    from eagle2.model.loading import load_bundle
    folder, _ = tiny_target("race", vocab=64, lm_std=0.4)
    return load_bundle(target=str(folder), head="random")


class Clock:
    """A fake clock for one decoder: every reading is one second later than the last, so a step's
    timings count the clock readings inside it and nothing that ran between steps."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_a_preview_changes_nothing_of_the_next_step(tiny_bundle, temperature):
    """Two decoders on one prompt, one previewing another policy before each step (with and without
    absorbing first, as Race.tick does): the same tokens, trees, counts and step timings."""
    from eagle2.cycle.sampling import SamplingParams
    from eagle2.decoding.decoder import Decoder
    runs = []
    for mode in ("none", "preview", "absorb+preview"):
        d = Decoder(tiny_bundle, "eagle2", SamplingParams(temperature=temperature, seed=3), max_new_tokens=24,
                    total_tokens=8, depth=3, top_k=4)
        d._now = Clock()
        d.start(input_ids=[5, 9, 14, 3, 27])
        while d.finished is None:
            if mode != "none":
                if mode == "absorb+preview":
                    d.absorb()
                before = d.state
                d.preview("static")
                d.preview(d.policy)
                assert d.state is before
            d.step()
        runs.append(d)
    ref = runs[0]
    for d in runs[1:]:
        assert d.generated == ref.generated and d.target_forwards == ref.target_forwards
        assert d.draft_calls == ref.draft_calls and d.split == ref.split
        for a, b in zip(d.trace.steps, ref.trace.steps):
            assert a.timings == b.timings
            assert (a.tree is None) == (b.tree is None) and (a.tree is None or a.tree.tokens == b.tree.tokens)


def rows_per_call(monkeypatch, obj, name: str, arg: int) -> list[int]:
    """obj.name counted while the test runs: the rows (numel) of its argument `arg`, one entry a call."""
    calls, real = [], getattr(obj, name)

    def counted(*a, **kw):
        calls.append(a[arg].numel())
        return real(*a, **kw)

    monkeypatch.setattr(obj, name, counted)
    return calls


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_three_decoders_share_one_prefill_and_decode_as_alone(tiny_bundle, monkeypatch, temperature):
    """The race runs the prompt's forward once for its three decoders: each starts from a copy of
    its K/V, is charged its seconds, and decodes what it would have decoded started alone (its first
    token drawn from its own random stream, the same tokens after, sampled or greedy)."""
    from eagle2.decoding.decoder import Decoder
    settings = TINY.with_(temperature=temperature, seed=3, max_new_tokens=12)
    calls = rows_per_call(monkeypatch, tiny_bundle.forward, "prefill", 1)
    r = Race()
    r.start(tiny_bundle, "w5 w9 w14 w3 w7", settings)
    assert len(calls) == 1                                   # one forward over the prompt for three
    seconds = {d.trace.steps[0].timings["target_forward_s"] for d in r.decoders}
    assert len(seconds) == 1 and seconds.pop() > 0          # each charged the shared forward's seconds
    while not r.finished:
        r.tick()
    for d, name in zip(r.decoders, (settings.policy, settings.compare, "plain")):
        alone = Decoder(tiny_bundle, settings.policy_for(name), settings.sampling(), max_new_tokens=12)
        alone.start("w5 w9 w14 w3 w7")
        while alone.state.finished is None:
            alone.step()
        assert alone.generated == d.generated, name
        assert torch.equal(alone.state.cache.k[:, :, :, :5], d.state.cache.k[:, :, :, :5]), name


@pytest.mark.parametrize("temperature", [0.0, 0.8])
def test_the_head_reads_the_prompt_once_for_both_tree_decoders(tiny_bundle, monkeypatch, temperature):
    """The comparison decoder takes the main decoder's reading of the prompt (the same head on the
    same pairs): the head absorbs the prompt once, the comparison's head cache and reading are what
    absorbing them itself gives, its first step is charged the reading's seconds, and it decodes
    as alone."""
    from eagle2.decoding.decoder import Decoder
    settings = TINY.with_(temperature=temperature, seed=3, max_new_tokens=12)
    reads = rows_per_call(monkeypatch, tiny_bundle.draft, "step", 2)
    r = Race()
    r.start(tiny_bundle, "w5 w9 w14 w3 w7", settings)
    n = len(r.main.state.prompt_ids)
    assert reads == [n]                                      # the prompt's pairs, read once
    m, c = r.main.state, r.cmp.state
    assert c.pending is None and c.hcache.length == m.hcache.length == n
    monkeypatch.undo()
    alone = Decoder(tiny_bundle, settings.policy_for(settings.compare), settings.sampling(), max_new_tokens=12)
    alone.start("w5 w9 w14 w3 w7")
    alone.absorb()
    a = alone.state
    assert torch.equal(a.hcache.k[:, :, :, :n], c.hcache.k[:, :, :, :n])
    assert torch.equal(a.hcache.v[:, :, :, :n], c.hcache.v[:, :, :, :n])
    assert torch.equal(a.reading.g, c.reading.g) and torch.equal(a.reading.logp, c.reading.logp)
    assert c.reading.seconds == m.reading.seconds > 0 and not c.reading.charged
    assert c.reading.g.data_ptr() != m.reading.g.data_ptr()  # its own copy (the main one's calls may reuse theirs)
    r.tick()
    assert r.cmp.trace.steps[1].timings["draft_head_s"] >= c.reading.seconds
    while not r.finished:
        r.tick()
    while alone.state.finished is None:
        alone.step()
    assert alone.generated == r.cmp.generated


def test_a_reading_is_taken_only_from_the_same_context(tiny_bundle):
    from eagle2.decoding.decoder import Decoder
    a = Decoder(tiny_bundle, "eagle2", max_new_tokens=8, total_tokens=8, depth=3, top_k=4)
    b = Decoder(tiny_bundle, "eagle2", max_new_tokens=8, total_tokens=8, depth=3, top_k=4)
    a.start(input_ids=[5, 9, 14, 3])
    b.start(input_ids=[5, 9, 14, 2])
    a.absorb()
    before = b.state
    assert not b.take_reading(a) and b.state is before        # another prompt: nothing taken
    b.start(input_ids=[5, 9, 14, 3])
    assert not b.take_reading(b)                              # nothing absorbed to take
    assert b.take_reading(a) and b.state.pending is None
    assert not b.take_reading(a)                              # absorbed already: nothing to take


class WriteWatch:
    """Python's audit events for every file opened for writing (os.open included), renamed,
    removed or made, while watching. A hook stays for the life of the process: it is added once
    and records nothing unless a test watches."""
    EVENTS = ("os.rename", "os.remove", "os.mkdir", "os.truncate", "shutil.copyfile", "shutil.move")
    seen: list | None = None
    hooked = False

    @classmethod
    def hook(cls, event, args):
        seen = cls.seen
        if seen is None:
            return
        if event == "open":
            path, mode, flags = args
            if any(c in mode for c in "wax+") if mode is not None else flags & cls.write_flags:
                seen.append((event, path, mode))
        elif event in cls.EVENTS:
            seen.append((event, args[0]))

    def __enter__(self) -> list:
        import os
        import sys
        cls = type(self)
        cls.write_flags = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
        if not cls.hooked:
            sys.addaudithook(cls.hook)
            cls.hooked = True
        cls.seen = []
        return cls.seen

    def __exit__(self, *exc):
        type(self).seen = None


def test_a_step_writes_no_file(tiny_bundle, tmp_path, monkeypatch):
    """Start, Steps with side-by-side previews, settings applied mid-run: nothing opens a file for
    writing, renames, removes or makes one."""
    monkeypatch.setenv("EAGLE2_CACHE", str(tmp_path / "cache"))
    with WriteWatch() as writes:
        r = Race()
        r.start(tiny_bundle, "w5 w9 w14 w3", TINY.with_())
        for _ in range(3):
            r.tick()
        r.apply(TINY.with_(depth=2, temperature=0.5).validate())
        for _ in range(3):
            r.tick()
        in_step = list(writes)
        (tmp_path / "control.txt").write_text("x")    # the watch sees a write
    assert len(r.previews) == 6 and len(r.main.trace.steps) >= 7
    assert in_step == [], in_step
    assert [w[1] for w in writes] == [str(tmp_path / "control.txt")]


def test_settings_are_values_and_a_race_keeps_its_policies_until_they_change(tiny_bundle):
    """Settings compare and hash by value and checking them leaves nothing behind. The page applies
    them at every Step: a policy whose parameters did not change keeps running (with what it has
    learnt); one whose parameters changed is replaced by a new one; a new race starts afresh."""
    s = TINY.with_().validate()
    assert s == TINY.with_() and hash(s) == hash(TINY.with_()) and s.validate() is s
    r = Race()
    r.start(tiny_bundle, "w5 w9 w14 w3", s)
    main, cmp = r.main.policy, r.cmp.policy
    for _ in range(2):                                               # Steps with the same settings
        assert r.apply(replace(s).validate()) == []
        r.tick()
        assert r.main.policy is main and r.cmp.policy is cmp
    s2 = replace(s, compare="eagle2", temperature=0.5).validate()   # the comparison changed
    r.apply(s2)
    r.tick()
    assert r.main.policy is main and r.cmp.policy is not cmp and r.cmp.policy_name == "eagle2"
    cmp2 = r.cmp.policy
    s3 = replace(s2, depth=2).validate()                             # the tree changed: both policies
    r.apply(s3)
    r.tick()
    assert r.main.policy is not main and r.cmp.policy is not cmp2 and r.main.policy.depth == 2
    r2 = Race()                                                      # the same settings again: new policies
    r2.start(tiny_bundle, "w5 w9", s3)
    assert r2.main.policy is not r.main.policy and r2.cmp.policy is not r.cmp.policy
    with pytest.raises(UserError, match="depth"):
        replace(s, depth=0).validate()
