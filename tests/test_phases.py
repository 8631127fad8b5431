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


def _decoder(bundle, policy, **kw):
    from eagle2.cycle.sampling import SamplingParams
    from eagle2.decoding.decoder import Decoder
    d = Decoder(bundle, policy, SamplingParams(), max_new_tokens=20, **kw)
    d._now = Clock()
    d.start(input_ids=[5, 9, 14, 3, 27])
    return d


def test_a_plain_step_is_its_forward_its_inputs_its_token_and_its_commit(tiny_bundle):
    d = _decoder(tiny_bundle, "plain")
    st = d.step()
    ph = split_of(st.timings)
    assert ph == {"draft_head": 0, "draft_tree": 0, "verify_inputs": 1, "target_forward": 1, "accept": 1,
                  "cache_commit": 1, "policy": 0}


def test_every_head_call_is_the_draft_head_and_the_rest_is_counted_once(tiny_bundle):
    d = _decoder(tiny_bundle, "eagle2", total_tokens=8, depth=3, top_k=4)
    while d.finished is None:
        st = d.step()
        ph = split_of(st.timings)
        # the absorbing (the root's call) and one call per level: each one lap on the head
        assert ph["draft_head"] == st.tree.draft_calls == 1 + 3
        # the tree's work before each level's call, and after the last one (top-k, rerank)
        assert ph["draft_tree"] == 3 + 1
        assert ph["verify_inputs"] == 1 and ph["target_forward"] == 1 and ph["accept"] == 1
        assert ph["policy"] == 1 and ph["cache_commit"] == 1, (st.cycle, ph)
        assert st.timings["total_s"] == sum(ph.values())
        for g, parts in GROUPS.items():
            assert st.timings[g] == sum(ph[p] for p in parts)
    # the run's totals are the steps' sums, phase by phase; its wall time is all of them
    steps = d.trace.steps
    assert d.phases == {p: sum(s.timings[key(p)] for s in steps) for p in PHASES}
    assert d.wall == sum(s.timings["total_s"] for s in steps)
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


def test_the_forwards_are_the_phases_a_faster_kernel_shortens():
    assert set(FORWARDS) <= set(PHASES) and set(GROUPS) == {"draft_s", "verify_s", "commit_s"}
    assert sorted(p for ps in GROUPS.values() for p in ps) == sorted(PHASES)
    assert not {key(p) for p in PHASES} & (set(GROUPS) | {"total_s"})   # one key, one meaning


def test_the_page_draws_each_decoders_phases_per_token_and_its_own_work(tiny_bundle):
    """The race's series carry each cycle's phases; the chart's bars are ms per generated token
    (lengths compare as the wall-clock speedup does) and add up to each decoder's wall time."""
    import viz
    from eagle2.decoding.race import Race, RaceSettings
    r = Race()
    r.start(tiny_bundle, "hello there", RaceSettings(policy="eagle2", compare="static", total_tokens=8, depth=2,
                                                     top_k=4, max_new_tokens=12))
    for _ in range(3):
        r.tick()
    series = [viz.series(label, d.trace.steps, role) for d, label, role in
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
