"""A cycle's work around the forwards in the kernels (qtree.h, qf_draft_tree, qf_commit, the
forward's argmax), held to the Python it replaces.

1. The kernels' one-call drafting gives the tree the Python loop gives (policies/eagle2.py), node
   for node: pool, beams, kept nodes and layout, for EAGLE-2 at several shapes and for the budget
   choosing N; decoding with it stays identical to plain decoding.
2. The budget's width rule in C (qt::best_width) picks what auto.best_rates picks.
3. The pieces: each row's argmax (the kernel, its reference, torch), the commit of accepted K/V,
   the budget's t(N) table read once a cycle.
"""
from __future__ import annotations

import ctypes
import dataclasses

import numpy as np
import pytest
import torch

from eagle2.cycle.sampling import SamplingParams
from eagle2.cycle.tree_arrays import TreeArrays
from eagle2.decoding.decoder import Decoder
from eagle2.model import quantized as Q
from eagle2.model import qlib
from eagle2.model.llama import KVCache
from eagle2.model.loading import load_bundle
from eagle2.model.verify_times import LiveVerifyTimes
from eagle2.phases import PHASES
from eagle2.policies.auto import (EXPLORE_EVERY, WIDTHS, AutoBudgetNPolicy, AutoBudgetPolicy, CallPrices, best_rates,
                                  calibrated)
from lossless_cases import greedy_tokens
from trees import tree_of

pytestmark = pytest.mark.skipif(qlib.cpu_problem() is not None, reason="the q4_1 kernels need AVX2")

PROMPTS = ([1, 2, 3], [5, 4], [9, 9, 9, 1], [7, 30, 2, 2, 11])


@pytest.fixture(scope="module")
def tiny_e3(tiny_target, tmp_path_factory):
    """A tiny 4-layer Llama in q4_1 with a random EAGLE-3 head: the head's step, and the whole
    tree, run in the kernels."""
    from test_serving import random_eagle3_head
    folder, _ = tiny_target("native-e3", layers=4)
    head = random_eagle3_head(folder, tmp_path_factory.mktemp("native-e3-head"))
    b = load_bundle(str(folder), head, dtype="q4_1")
    assert isinstance(b.draft, Q.KernelDraft) and b.draft.drafts_trees
    return b


@pytest.fixture(scope="module")
def tiny_e3_sure(tiny_target, tmp_path_factory):
    """tiny_e3's target with a random EAGLE-3 head whose logits are 6x sharper: its children's
    probabilities spread from near 1 to near 0, so the budget's choices vary from cycle to cycle."""
    from test_serving import random_eagle3_head
    folder, _ = tiny_target("native-e3", layers=4)
    head = random_eagle3_head(folder, tmp_path_factory.mktemp("native-e3-sure-head"), sharpen=6.0)
    return load_bundle(str(folder), head, dtype="q4_1")


def _trees(bundle, policy, prompt, native: bool, monkeypatch, **kw):
    monkeypatch.setattr(bundle.draft, "drafts_trees", native)
    d = Decoder(bundle, policy, SamplingParams(), max_new_tokens=24, record=True, **kw)
    d.start(input_ids=prompt)
    d.generate()
    return d.generated, [s.tree for s in d.trace.steps[1:]]


# ------------------------------------------------------------------ 1. the tree, node for node
@pytest.mark.parametrize("kw", [dict(), dict(total_tokens=8, depth=3, top_k=4), dict(total_tokens=30, depth=6, top_k=16),
                                dict(total_tokens=5, depth=1, top_k=2), dict(total_tokens=12, depth=8, top_k=1)])
def test_the_kernels_draft_the_tree_the_python_loop_drafts(tiny_e3, monkeypatch, kw):
    for prompt in PROMPTS:
        out_n, native = _trees(tiny_e3, "eagle2", prompt, True, monkeypatch, **kw)
        out_p, python = _trees(tiny_e3, "eagle2", prompt, False, monkeypatch, **kw)
        assert out_n == out_p and len(native) == len(python) > 0
        for a, b in zip(native, python):
            assert dataclasses.asdict(a) == dataclasses.asdict(b)


def test_the_budget_choosing_n_drafts_the_same_tree_in_the_kernels(tiny_e3, monkeypatch):
    """With t(N) flat the best N is every node up to the cap whatever the clock reads, so the
    kernels' budget and the Python one must keep the same nodes and record the same choices."""
    flat = {1: 0.01, 8: 0.01, 16: 0.01}
    for prompt in PROMPTS[:2]:
        runs = []
        for native in (True, False):
            pol = AutoBudgetNPolicy(prior_times=flat, learn_costs=False, depth=3, top_k=4)
            runs.append(_trees(tiny_e3, pol, prompt, native, monkeypatch))
        (out_n, native), (out_p, python) = runs
        assert out_n == out_p
        for a, b in zip(native, python):
            ra, rb = a.record, b.record
            assert (ra.n, ra.best_n, ra.levels, ra.widths) == (rb.n, rb.best_n, rb.levels, rb.widths) == (16, 16, 3, [4, 4, 4])
            a.record = b.record = None
            assert dataclasses.asdict(a) == dataclasses.asdict(b)


def _frozen_auto(monkeypatch) -> AutoBudgetPolicy:
    """The default policy (eagle2-auto, exploring and learning its ranks' probabilities) starting
    from a rising t(N) and a draft call's price at several widths, with its timings kept out: the
    seconds each call and verification took differ from run to run, and what a cycle chooses
    depends only on what it starts from and the head's outputs, so the two paths must agree."""
    monkeypatch.setattr(CallPrices, "observe", lambda self, width, seconds: None)
    monkeypatch.setattr(LiveVerifyTimes, "observe", lambda self, n, seconds: None)
    tn = {1: 1.0e-3, 2: 1.01e-3, 4: 1.03e-3, 8: 1.08e-3, 16: 1.2e-3, 32: 1.5e-3}
    pol = AutoBudgetPolicy(prior_times=tn, total_tokens=32, depth=5, top_k=6)
    for w, s in ((1, 4e-6), (2, 6e-6), (4, 1e-5), (6, 1.6e-5)):
        pol.prices.seconds[w] = s
    return pol


def test_the_default_policy_drafts_the_same_tree_in_the_kernels(tiny_e3_sure, monkeypatch):
    """eagle2-auto itself, its widths, depths and N chosen each cycle (exploring every
    EXPLORE_EVERY cycles): the kernels' one call and the Python loop keep the same nodes, record
    the same choices and decode the same tokens, cycle after cycle."""
    seen_widths, seen_n = set(), set()
    for prompt in PROMPTS[:3]:
        runs = []
        for native in (True, False):
            monkeypatch.setattr(tiny_e3_sure.draft, "drafts_trees", native)
            d = Decoder(tiny_e3_sure, _frozen_auto(monkeypatch), SamplingParams(), max_new_tokens=48, record=True)
            d.start(input_ids=prompt)
            d.generate()
            runs.append((d.generated, [s.tree for s in d.trace.steps[1:]], d.policy.stats, d.policy.acceptance.odds))
        (out_n, native, stats_n, odds_n), (out_p, python, stats_p, odds_p) = runs
        assert odds_n == odds_p != 1.0   # both calibrated their values alike, from the same acceptances
        assert out_n == out_p and len(native) == len(python) > EXPLORE_EVERY // 2
        for a, b in zip(native, python):
            ra, rb = a.record, b.record
            assert (ra.n, ra.best_n, ra.levels, ra.widths) == (rb.n, rb.best_n, rb.levels, rb.widths)
            assert ra.expected_tokens == pytest.approx(rb.expected_tokens, rel=1e-12)
            seen_widths.add(tuple(ra.widths)), seen_n.add(ra.n)
            a.record = b.record = None
            assert dataclasses.asdict(a) == dataclasses.asdict(b)
        assert stats_n["explored"] == stats_p["explored"] > 0 and stats_n["widths"] == stats_p["widths"]
    # the cycles made different choices (the test weighs a rule, not one fixed tree)
    assert len(seen_widths) >= 10 and len(seen_n) >= 8, (seen_widths, seen_n)


def test_the_budget_learns_each_kernel_calls_seconds(tiny_e3_sure, monkeypatch):
    """The kernels' call reads the prices and returns what each of its draft calls took
    (`level_s`): the policy learns one price a call, at that call's width, in the order made."""
    learnt, real = [], CallPrices.observe

    def observe(self, width, seconds):
        learnt.append((width, seconds))
        real(self, width, seconds)

    monkeypatch.setattr(CallPrices, "observe", observe)
    # a nearly flat t(N): deeper trees pay whatever a call of the tiny head takes, so calls are made
    pol = AutoBudgetPolicy(prior_times={1: 1.0e-3, 4: 1.001e-3, 16: 1.002e-3, 32: 1.003e-3}, total_tokens=32, depth=5,
                           top_k=6, learn_costs=False)
    d = Decoder(tiny_e3_sure, pol, SamplingParams(), max_new_tokens=32, record=True)
    d.start(input_ids=PROMPTS[1])
    d.generate()
    widths = [w for s in d.trace.steps[1:] for w in s.tree.record.widths]
    assert len(widths) > 4 and [w for w, _ in learnt] == widths
    assert all(0 < sec < 1 for _, sec in learnt)
    assert all(np.isfinite(pol.prices.seconds[w]) for w in set(widths))


@pytest.mark.parametrize("policy", ["eagle2", "eagle2-auto", "eagle2-auto-n"])
def test_decoding_with_the_kernels_tree_is_plain_decoding(tiny_e3, policy):
    for prompt in PROMPTS:
        assert greedy_tokens(tiny_e3, policy, 30, input_ids=prompt) == greedy_tokens(tiny_e3, "plain", 30, input_ids=prompt), \
            f"{policy} departs from plain q4_1 on {prompt}"


def test_the_kernels_lay_out_what_lay_out_lays_out(tiny_e3):
    d = Decoder(tiny_e3, "eagle2", SamplingParams(), max_new_tokens=8, record=False, total_tokens=9, depth=3, top_k=3)
    d.kcycle = None   # the tree's call alone (not the whole cycle's), whose arrays are captured here
    d.start(input_ids=[3, 1, 4])
    captured = []
    real = type(d.policy).draft_native

    def keep(self, runner, root, cyc):
        captured.append(real(self, runner, root, cyc))
        return captured[-1]

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(type(d.policy), "draft_native", keep)
        d.step()
    arrays = captured[0]
    assert isinstance(arrays, TreeArrays) and arrays.n_kept == 9
    t = arrays.to_tree()   # the same pool laid out by cycle/layout.lay_out, as a Python policy's is
    a, b = arrays.layout(17, "cpu"), tree_of(t.tokens, t.parents, t.depths, t.ranks, kept=t.kept).layout(17, "cpu")
    for col in ("tokens", "depths", "mask", "order"):   # the runner's next call rewrites its arrays:
        arrays.cols[col][:] = 0                        # the batch read them when it was made
    for f in ("pool_idx", "parent_pos", "ranks", "children", "token_list"):
        assert getattr(a, f) == getattr(b, f), f
    for f in ("tokens", "positions", "mask"):
        assert torch.equal(getattr(a, f), getattr(b, f)), f


def test_a_tree_too_big_for_the_kernels_is_drafted_in_python(tiny_e3):
    d = Decoder(tiny_e3, "eagle2", SamplingParams(), max_new_tokens=6, record=True, total_tokens=20, depth=2, top_k=20)
    d.start(input_ids=[1, 2])
    d.generate()
    assert any(len(s.tree.tokens) > 1 + 16 for s in d.trace.steps[1:])   # top_k 20 > the kernels' 16: Python's


# ------------------------------------------------------------------ 2. the budget's width rule
def _python_width(pool, beam, ranks, odds, spent, prices: CallPrices, guess, tn, max_n) -> int:
    """AutoBudgetPolicy.expand_width's weighing, on given probabilities."""
    children = calibrated(beam[:, None] * ranks[None, :], odds)
    widths = [0] + sorted({min(w, len(beam)) for w in WIDTHS})
    spent_s = np.array([spent] + [spent + prices.price(w, guess) for w in widths[1:]])
    return widths[int(np.argmax(best_rates(pool, children, widths, spent_s, tn, max_n)))]


def test_the_kernels_width_rule_is_the_budgets(tiny_e3):
    lib = tiny_e3.forward.lib
    rng = np.random.default_rng(5)
    ptr = lambda a: a.ctypes.data_as(ctypes.c_void_p)  # noqa: E731
    chosen = set()
    for case in range(300):
        k, nb, max_n = int(rng.integers(1, 17)), int(rng.integers(1, 17)), int(rng.integers(2, 65))
        pool = np.sort(rng.uniform(0, 1, int(rng.integers(1, 120))) ** 3)[::-1].copy()
        beam = np.sort(rng.uniform(0, 1, nb) ** 2)[::-1].copy()
        ranks = np.sort(rng.uniform(0, 0.6, k))[::-1].copy()
        prices = CallPrices()
        for w in rng.choice(np.arange(1, 17), int(rng.integers(0, 4)), replace=False):
            prices.observe(int(w), float(rng.uniform(1e-4, 2e-3)))
        tn = np.cumsum(rng.uniform(1e-4, 1e-3, max_n)) + 3e-3
        spent, guess = float(rng.uniform(0, 2e-3)), float(rng.uniform(1e-4, 1e-3))
        odds = float(np.exp(rng.uniform(-1, 1))) if case % 3 else 1.0
        want = _python_width(pool, beam, ranks, odds, spent, prices, guess, tn, max_n)
        got = lib.qf_best_width(ptr(pool), len(pool), ptr(beam), nb, ptr(ranks), k, odds, spent, ptr(prices.seconds),
                                len(prices.seconds), guess, ptr(tn), max_n)
        assert got == want, f"case {case}"
        chosen.add(got)
    assert len(chosen) >= 4   # the cases reach several widths, none among them


# ------------------------------------------------------------------ 3. the pieces
def test_each_rows_argmax_is_torchs(tiny_e3):
    lib = tiny_e3.forward.lib
    g = torch.Generator().manual_seed(1)
    for n in (1, 7, 8, 9, 97, 49152):
        for row in (torch.randn(n, generator=g), torch.randint(-3, 3, (n,), generator=g).float(),
                    torch.full((n,), -float("inf"))):
            want = int(row.argmax())
            for ref in (0, 1):
                assert lib.qf_argmax(row.data_ptr(), n, ref) == want, (n, ref)
    f = tiny_e3.forward
    cache = f.new_cache(16)
    best = torch.empty(5, dtype=torch.long)
    mask = torch.tensor([[1, 0, 0, 0, 0], [1, 1, 0, 0, 0], [1, 0, 1, 0, 0], [1, 1, 0, 1, 0], [1, 0, 0, 0, 1]]).bool()
    _, logits = f.verify(cache, torch.tensor([5, 8, 13, 21, 34]), torch.tensor([0, 1, 1, 2, 1]), mask, best=best)
    assert torch.equal(best, logits.argmax(-1))
    with pytest.raises(ValueError, match="int64"):
        f.verify(cache, torch.tensor([5, 8]), torch.tensor([0, 1]), best=torch.empty(2, dtype=torch.int32))


def test_the_kernels_commit_keeps_the_rows_torch_keeps(tiny_e3):
    g = torch.Generator().manual_seed(3)
    for slots in ([10], [10, 11, 12], [10, 13, 15], [11, 14, 17, 19]):
        ours = tiny_e3.forward.new_cache(24)
        assert isinstance(ours, Q.KernelCache)
        ref = KVCache(ours.k.shape[0], ours.k.shape[2], 24, ours.k.shape[-1], torch.float16, "cpu")
        ours.k.copy_(torch.randn(ours.k.shape, generator=g))
        ours.v.copy_(torch.randn(ours.v.shape, generator=g))
        ref.k.copy_(ours.k)
        ref.v.copy_(ours.v)
        ours.length = ref.length = 10
        ours.commit(torch.tensor(slots))
        ref.commit(torch.tensor(slots))
        assert ours.length == ref.length and torch.equal(ours.k, ref.k) and torch.equal(ours.v, ref.v)
    with pytest.raises(RuntimeError, match="ascending"):
        ours.commit(torch.tensor([ours.length + 2, ours.length + 1]))


@pytest.mark.parametrize("prior", [{1: 0.004, 2: 0.0042, 4: 0.0045, 8: 0.006, 16: 0.009, 32: 0.015, 64: 0.03},
                                   {3: 0.01, 5: 0.02}, {1: 0.01, 8: 0.01, 16: 0.01}])
def test_the_budgets_table_is_t_at_every_n(prior):
    """LiveVerifyTimes.table, read off the points in plain Python, is its t() read with numpy."""
    rng = np.random.default_rng(0)
    live = LiveVerifyTimes(prior)
    np.testing.assert_allclose(live.table(64), live.t(np.arange(1, 65)), rtol=1e-12, atol=0)
    for _ in range(200):
        live.observe(int(rng.integers(1, 70)), float(rng.uniform(0.003, 0.02)))
        np.testing.assert_allclose(live.table(64), live.t(np.arange(1, 65)), rtol=1e-12, atol=0)


def test_the_draft_kernels_refuse_a_cache_they_would_misread(tiny_e3):
    d = tiny_e3.draft
    cache = d.new_cache(16)
    cache.k = cache.k.float()
    F = tiny_e3.forward.args.dim * 3
    with pytest.raises(ValueError, match="draft head's step: its cache must be fp16"):
        d.step(cache, torch.zeros(2, F), torch.tensor([1, 2]), torch.arange(2), 0)
    with pytest.raises(ValueError, match="features"):
        d.step(d.new_cache(16), torch.zeros(3, F), torch.tensor([1, 2]), torch.arange(2), 0)


def test_a_tap_outside_the_layers_is_refused_not_left_unwritten(tiny_e3, monkeypatch):
    """The forward copies the state entering each tapped layer into the head's features: a tap
    outside 0..L, or one named twice, would leave a column of uninitialised memory. The kernels
    refuse it with one line."""
    f = tiny_e3.forward
    good = list(f.c_taps)
    for bad in ([good[0], good[0]] + good[2:], [f.args.n_layers + 1] + good[1:], [-1] + good[1:]):
        monkeypatch.setattr(f, "c_taps", (ctypes.c_int32 * len(bad))(*bad))
        with pytest.raises(ValueError, match="must be distinct layers") as e:
            f.verify(f.new_cache(8), torch.tensor([3, 4]), torch.tensor([0, 1]))
        assert "\n" not in str(e.value)


# ------------------------------------------------------------------ 4. the whole greedy cycle in one call
def _cycles(bundle, policy, prompt, one_call: bool, **kw):
    """A greedy run whose cycles are the kernels' one call (qf_cycle) or their calls one at a time
    (the tree, the forward, the commit, the head's step): its tokens, its trace (every step but the
    seconds, each tree with the target's probabilities the trace reads from the logits) and its counts."""
    d = Decoder(bundle, policy, SamplingParams(), max_new_tokens=40, record=True, **kw)
    assert d.kcycle is not None
    if not one_call:
        d.kcycle = None
    d.start(input_ids=prompt)
    d.generate()
    steps = []
    for s in d.trace.steps:
        step = dataclasses.asdict(s)
        step.pop("timings"), step.pop("cumulative")
        steps.append(step)
    return d.generated, steps, d.target_forwards, d.draft_calls


@pytest.mark.parametrize("kw", [dict(), dict(total_tokens=8, depth=3, top_k=4), dict(total_tokens=5, depth=1, top_k=2),
                                dict(total_tokens=12, depth=8, top_k=1)])
def test_the_cycle_in_one_call_is_the_cycle_call_by_call(tiny_e3, kw):
    for prompt in PROMPTS:
        one, each = (_cycles(tiny_e3, "eagle2", prompt, one_call, **kw) for one_call in (True, False))
        assert one == each and len(one[1]) > 2
        assert one[0] == greedy_tokens(tiny_e3, "plain", 40, input_ids=prompt)


def test_the_default_policy_in_one_call_chooses_as_call_by_call(tiny_e3_sure, monkeypatch):
    """eagle2-auto, its timings kept out (_frozen_auto): the one call reads the inputs the policy
    set and the policy learns what the call left, so each cycle chooses the same tree."""
    for prompt in PROMPTS[:3]:
        runs = []
        for one_call in (True, False):
            pol = _frozen_auto(monkeypatch)
            runs.append((_cycles(tiny_e3_sure, pol, prompt, one_call), pol.stats, pol.acceptance.odds,
                         pol.rank_prob.tolist()))
        assert runs[0] == runs[1]
        assert runs[0][1]["explored"] > 0 and len(runs[0][1]["widths"]) > 1


def test_a_cycle_in_one_call_charges_its_parts_to_their_phases(tiny_e3):
    """Each step's phases add up to its time; the head's steps (the tree's and the reading of what
    was kept) are draft_head, the forward target_forward; a run's phases add up to its wall."""
    d = Decoder(tiny_e3, "eagle2", SamplingParams(), max_new_tokens=30, record=True, total_tokens=8, depth=3, top_k=4)
    d.start(input_ids=PROMPTS[3])
    d.generate()
    for s in d.trace.steps[1:]:
        t = s.timings
        assert all(t[f"{p}_s"] >= 0 for p in PHASES)
        assert t["draft_head_s"] > 0 and t["target_forward_s"] > 0
        assert t["total_s"] == pytest.approx(sum(t[f"{p}_s"] for p in PHASES), rel=1e-12)
    assert d.wall == pytest.approx(sum(s.timings["total_s"] for s in d.trace.steps), rel=1e-12)


def test_a_cycle_the_caches_cannot_hold_is_refused_and_the_state_kept(tiny_e3):
    """A target cache without room for the tree's rows: one line, nothing committed, and the
    decoder goes on from the state it had."""
    d = Decoder(tiny_e3, "eagle2", SamplingParams(), max_new_tokens=12, record=False, total_tokens=8, depth=3, top_k=4)
    d.start(input_ids=PROMPTS[0])
    s = d.state
    small = tiny_e3.forward.new_cache(s.cache.length + 2)
    small.length = s.cache.length
    with pytest.raises(RuntimeError, match="KV cache full"):
        d.kcycle.run(small, s.hcache, s.root, s.reading.g if s.reading else torch.zeros(1), (torch.zeros(1),) * 2,
                     4, 3, 8, None)
    d.generate()
    assert d.generated == greedy_tokens(tiny_e3, "plain", 12, input_ids=PROMPTS[0])


def test_a_failing_part_of_the_cycle_names_itself():
    """qf_cycle's codes are its parts' own: each maps through that part's table to its line."""
    from eagle2.model.tree_modes import CycleStage
    assert set(qlib.CYCLE_CODES) == set(CycleStage) - {CycleStage.NONE}
    with pytest.raises(qlib.UserError, match="outside the model's vocabulary"):
        qlib.check_code("qf_cycle", -2, qlib.CYCLE_CODES[CycleStage.FORWARD])
    with pytest.raises(RuntimeError, match="cannot hold the tree's 9 rows"):
        qlib.check_code("qf_cycle", -1, qlib.CYCLE_CODES[CycleStage.CYCLE], rows=9)


def test_a_preview_after_a_cycle_in_one_call_pays_the_reading_it_starts_from(tiny_e3):
    """The head's reading of the kept pairs counts in the cycle that took it; another policy's
    preview on that context is a whole cycle of its own, so it counts the reading too."""
    d = Decoder(tiny_e3, "eagle2", SamplingParams(), max_new_tokens=20, record=True, total_tokens=8, depth=3, top_k=4)
    d.start(input_ids=PROMPTS[1])
    d.step()
    d.step()
    r = d.state.reading
    assert r is not None and r.charged and r.seconds > 0
    assert d.preview("static").timings["draft_head_s"] >= r.seconds


def test_a_released_decoder_lets_its_cycle_arrays_go(tiny_e3):
    """The one call's arrays (every verified row's logits among them) live with the decoder while
    it steps; released (the page dropping a session), they go with its caches."""
    d = Decoder(tiny_e3, "eagle2", SamplingParams(), max_new_tokens=8, record=False, total_tokens=8, depth=3, top_k=4)
    d.start(input_ids=PROMPTS[0])
    d.step()
    assert d.kcycle.held_bytes >= 8 * tiny_e3.forward.args.vocab_size * 4
    d.release()
    assert d.kcycle.held_bytes == 0
