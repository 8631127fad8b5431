"""Where a cycle's time goes (eagle2/phases.py): every step's seconds split into phases that add up
to its total, each phase charged with the work it names. A fake clock, one second per reading,
makes the accounting exact: a phase's seconds count the laps closed on it."""
from __future__ import annotations

import pytest

from eagle2.phases import FORWARDS, GROUPS, PHASES, PhaseClock, key, split_of


@pytest.fixture(scope="module")
def tiny_bundle(tiny_target):
    from eagle2.model.loading import load_bundle
    folder, _ = tiny_target("phases", vocab=64, lm_std=0.4)
    return load_bundle(target=str(folder), head="random")


class Clock:
    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        self.t += 1.0
        return self.t


def test_a_clock_charges_each_lap_to_its_phase_and_adds_up():
    c = PhaseClock(Clock())
    c.lap("draft_head")
    c.lap("draft_tree")
    c.lap("draft_head")
    c.add("draft_head", 0.5)
    t = c.timings()
    assert t[key("draft_head")] == 2.5 and t[key("draft_tree")] == 1.0 and t[key("target_forward")] == 0.0
    assert t["draft_s"] == 3.5 and t["verify_s"] == 0.0 and t["total_s"] == 3.5
    assert split_of(t) == {p: t[key(p)] for p in PHASES}
    assert split_of({"draft_s": 1.0, "verify_s": 1.0, "commit_s": 0.0, "total_s": 2.0}) is None  # an old trace


def test_a_lap_split_by_what_was_timed_inside_it_adds_up():
    """The kernels' one-call cycle times its parts itself: the lap's seconds go to those parts,
    what they leave to the rest, never more than the lap."""
    c = PhaseClock(Clock())
    c.lap("draft_tree")
    c.lap_split({"draft_head": 0.25, "target_forward": 0.5}, rest="verify_inputs")
    t = c.timings()
    assert (t[key("draft_head")], t[key("target_forward")], t[key("verify_inputs")]) == (0.25, 0.5, 0.25)
    c.lap_split({"draft_head": 0.75, "target_forward": 0.75}, rest="verify_inputs")   # more than the lap
    t = c.timings()
    assert (t[key("draft_head")], t[key("target_forward")], t[key("verify_inputs")]) == (1.0, 0.75, 0.25)
    assert t["total_s"] == 3.0


def _decoder(bundle, policy, **kw):
    from eagle2.cycle.sampling import SamplingParams
    from eagle2.decoding.decoder import Decoder
    d = Decoder(bundle, policy, SamplingParams(), max_new_tokens=20, **kw)
    d._now = Clock()
    d.start(input_ids=[5, 9, 14, 3, 27])
    return d


class Work:
    """A clock that moves only when the model works: each target forward takes FORWARD seconds and
    each draft-head call HEAD seconds, all else none. A step's phases must then hold exactly that
    work, each where it was done: the forwards in target_forward, the head's calls in draft_head."""
    FORWARD, HEAD = 100.0, 1.0

    def __init__(self, bundle, monkeypatch):
        self.t, self.forwards, self.calls = 0.0, 0, 0
        for cls, name, cost, count in ((type(bundle.forward), "verify", self.FORWARD, "forwards"),
                                       (type(bundle.draft), "step", self.HEAD, "calls")):
            real = getattr(cls, name)

            def timed(obj, *a, _real=real, _cost=cost, _count=count, **kw):
                out = _real(obj, *a, **kw)
                self.t += _cost
                setattr(self, _count, getattr(self, _count) + 1)
                return out
            monkeypatch.setattr(cls, name, timed)

    def __call__(self) -> float:
        return self.t


def _worked(bundle, policy, monkeypatch, **kw):
    from eagle2.cycle.sampling import SamplingParams
    from eagle2.decoding.decoder import Decoder
    d = Decoder(bundle, policy, SamplingParams(), max_new_tokens=20, **kw)
    d.start(input_ids=[5, 9, 14, 3, 27])
    work = Work(bundle, monkeypatch)
    d._now = work
    return d, work


def test_a_plain_steps_time_is_its_forward(tiny_bundle, monkeypatch):
    d, work = _worked(tiny_bundle, "plain", monkeypatch)
    for _ in range(3):
        before = work.forwards
        ph = split_of(d.step().timings)
        assert work.forwards == before + 1
        assert ph["target_forward"] == Work.FORWARD and sum(ph.values()) == Work.FORWARD, ph


def test_each_phase_holds_the_work_it_names(tiny_bundle, monkeypatch):
    """A tree's cycle: the head's calls in draft_head (as many as the tree records), the one
    verification in target_forward, nothing elsewhere; the coarse groups, the step's total and
    the run's totals add the same seconds up."""
    d, work = _worked(tiny_bundle, "eagle2", monkeypatch, total_tokens=8, depth=3, top_k=4)
    while d.finished is None:
        calls, forwards = work.calls, work.forwards
        st = d.step()
        ph = split_of(st.timings)
        assert work.forwards == forwards + 1 and work.calls - calls == st.tree.draft_calls
        assert ph["target_forward"] == Work.FORWARD and ph["draft_head"] == Work.HEAD * st.tree.draft_calls
        assert all(v == 0 for p, v in ph.items() if p not in FORWARDS), ph   # the rest took no model time
        assert st.timings["total_s"] == sum(ph.values())
        for g, parts in GROUPS.items():
            assert st.timings[g] == sum(ph[p] for p in parts)
    steps = d.trace.steps
    assert d.phases == {p: sum(s.timings[key(p)] for s in steps) for p in PHASES}
    assert d.wall == sum(s.timings["total_s"] for s in steps)
    assert d.wall - steps[0].timings["total_s"] == work.t        # after the prefill: the model's work, all of it
    assert d.summary()["phases_s"] == d.phases


def test_absorbing_ahead_of_a_step_counts_in_that_step_as_the_head(tiny_bundle):
    """The page absorbs before its preview (Race.tick): the step charges those seconds to its
    draft_head phase, as if it had absorbed itself, and the preview's own time to nobody."""
    a = _decoder(tiny_bundle, "eagle2", total_tokens=8, depth=2, top_k=4)
    b = _decoder(tiny_bundle, "eagle2", total_tokens=8, depth=2, top_k=4)
    for _ in range(3):
        b.absorb()
        b.preview("static")
        sa, sb = a.step(), b.step()
        assert sa.timings == sb.timings and sa.new_tokens == sb.new_tokens


def test_the_page_draws_each_decoders_phases_per_token_and_its_own_work(tiny_bundle):
    """The race's series carry each cycle's phases; the chart's bars are ms per generated token
    (lengths compare as the wall-clock speedup does) and add up to each decoder's wall time."""
    import viz
    from eagle2.cycle.series import series as make_series
    from eagle2.decoding.race import Race, RaceSettings
    r = Race()
    r.start(tiny_bundle, "hello there", RaceSettings(policy="eagle2", compare="static", total_tokens=8, depth=2,
                                                     top_k=4, max_new_tokens=12))
    for _ in range(3):
        r.tick()
    series = [make_series(label, d.trace.steps, role) for d, label, role in
              zip(r.decoders, r.labels(), ("main", "compare", "plain"))]
    for s, d in zip(series, r.decoders):
        ms = viz.per_token_ms(s)
        assert ms is not None and ms["target_forward"] > 0
        assert sum(ms.values()) == pytest.approx(1000 * d.wall / len(d.generated))
    assert viz.per_token_ms(series[2])["draft_head"] == 0          # plain decoding drafts nothing
    fig = viz.phase_chart(series, page_s=0.5)
    assert {t.name for t in fig.data} == set(viz.phase_chart.__globals__["PHASE_LABELS"].values())
    assert f"the page's own work: {500 / series[0]['tokens'][-1]:.0f} ms a token" in fig.layout.title.text
    # a trace recorded before the phases were timed: the chart says so instead of drawing zeros
    for s in series:
        s["phases"] = [None] * len(s["phases"])
    assert not viz.phase_chart(series).data
