"""The hardware-aware budget (eagle2/policies/auto.py, docs/algorithms.md §9).

1. best_rate picks the N that maximises (1 + sum of the N-1 best values) / (spent + t(N)).
2. Adaptive depth and width follow the costs: when verification dwarfs a draft call it drafts
   every level at the whole beam's width; when a draft call costs far more than verification it
   makes no calls, from the first cycle on (no cycle explores the whole tree).
3. Lossless: greedy output equals plain greedy on the real model, and under sampling the first
   three tokens follow the target's exact distribution (chi-square, as tests/test_lossless.py).
4. No Step measures t(N): a budget starts from the best table known (an estimate when the cache
   has none that is plausible), the background measurer measures only while nothing decodes, and
   the cache holds quiet measurements only (live corrections stay in the policy).
"""
from __future__ import annotations

import itertools
import json
import threading
import time
from collections import Counter

import numpy as np
import pytest
import torch

from eagle2.policies.auto import AutoBudgetPolicy, best_rate
from eagle2.decoding.decoder import Decoder
from eagle2.cycle.sampling import SamplingParams

from lossless_cases import ALPHA, PROMPTS, SPROMPT, SV, chi_square, exact_joint


def test_best_rate_is_the_argmax_of_expected_tokens_per_second():
    t = np.vectorize({1: 1.0, 2: 1.1, 3: 1.2, 4: 3.0}.get)   # t(N) of an array of N, as LiveVerifyTimes.t
    vals = np.array([0.9, 0.5, 0.1])
    n, rate = best_rate(vals, 0.2, t)
    # n=1: 1/1.2; n=2: 1.9/1.3; n=3: 2.4/1.4 (best); n=4: 2.5/3.2
    assert n == 3 and abs(rate - 2.4 / 1.4) < 1e-12
    assert best_rate(np.array([]), 0.0, t)[0] == 1
    assert best_rate(vals, 0.2, t, max_n=2)[0] == 2


def auto(prior_times: dict, **kw) -> AutoBudgetPolicy:
    """A budget that keeps the table it is given (no live correction, no exploration): these tests
    are about what it does with given costs."""
    p = AutoBudgetPolicy(prior_times=prior_times, depth=kw.pop("depth", 3), top_k=kw.pop("top_k", 3),
                         total_tokens=kw.pop("total_tokens", 8), learn_costs=kw.pop("learn_costs", False), **kw)
    p.validate()
    return p


class HeadCallClock:
    """A decoder's time (its `_now`) in which only the draft head's calls take any, `call_s`
    seconds each: the budget's costs are then exactly the ones a test gives. On wall time the
    tree's work before the first call (a few hundred microseconds) sometimes took a 4 ms slice of
    a shared CPU, and a call that costs more than it returns looked cheap next to it."""

    def __init__(self, bundle, monkeypatch, call_s: float):
        self.t = 0.0
        real = bundle.draft.step

        def timed(*a, **kw):
            self.t += call_s
            return real(*a, **kw)

        monkeypatch.setattr(bundle.draft, "step", timed)

    def __call__(self) -> float:
        return self.t


def test_adaptive_depth_follows_costs(tiny_target, monkeypatch):
    from eagle2.model.loading import load_bundle
    folder, _ = tiny_target("sampling", vocab=SV, hidden=32, heads=4, kv_heads=2, inter=64, lm_std=0.5, seed=3)
    bundle = load_bundle(target=str(folder), head="random", seed_random_head=1)   # this test's own: its head is timed
    clock = HeadCallClock(bundle, monkeypatch, call_s=1e-3)   # a draft call: 1 ms, the tree's work around it: none
    # total_tokens 64 > the whole pool (30 nodes), so every drafted node can be verified
    slow_verify = auto({1: 10.0, 64: 10.0}, total_tokens=64)   # a draft call is nothing next to a verification
    cheap_verify = auto({1: 1e-7, 64: 1e-7}, total_tokens=64)  # a draft call costs far more than it returns
    for pol in (slow_verify, cheap_verify):
        dec = Decoder(bundle, pol, max_new_tokens=24, record=False)
        dec._now = clock
        dec.start(input_ids=SPROMPT)
        dec.generate()
    assert set(slow_verify.stats["levels"]) == {"3"}   # every level of depth 3, every cycle
    assert set(slow_verify.stats["widths"]) == {"3"}   # the whole beam (top_k 3) each time
    assert cheap_verify.stats["levels"] == {"0": cheap_verify.stats["cycles"]}   # no call, the first cycle included


def test_a_budget_that_stopped_drafting_explores_one_call_again(tiny_target, monkeypatch):
    """Stopping at the root's children never updates a draft call's price or the deeper ranks'
    probabilities; a learning budget makes one call of width 1 every EXPLORE_EVERY cycles, so a
    cold call cannot keep it shallow for ever, and explores no deeper."""
    from eagle2.model.loading import load_bundle
    from eagle2.policies.auto import EXPLORE_EVERY
    folder, _ = tiny_target("sampling", vocab=SV, hidden=32, heads=4, kv_heads=2, inter=64, lm_std=0.5, seed=3)
    bundle = load_bundle(target=str(folder), head="random", seed_random_head=1)
    clock = HeadCallClock(bundle, monkeypatch, call_s=1e-3)   # costs as given, not as a shared CPU makes them
    pol = auto({1: 1e-7, 64: 1e-7}, total_tokens=64, depth=3, learn_costs=True)  # drafting never pays
    dec = Decoder(bundle, pol, max_new_tokens=2 * EXPLORE_EVERY + 4, record=False)
    dec._now = clock
    dec.start(input_ids=SPROMPT)
    dec.generate()
    levels = pol.stats["levels"]
    cycles = pol.stats["cycles"]
    assert set(levels) == {"0", "1"} and levels["1"] >= (cycles - 1) // EXPLORE_EVERY >= 1, levels
    assert pol.stats["widths"] == {"1": levels["1"]}


@pytest.mark.slow
def test_greedy_identity_real_model(real_bundle):
    from eagle2.model.calibration import verify_profile
    prof = verify_profile(real_bundle)
    for p in PROMPTS[:2]:
        ref = Decoder(real_bundle, "plain", max_new_tokens=48, record=False)
        ref.start(p["prompt"], raw=p.get("raw", False))
        ref.generate()
        dec = Decoder(real_bundle, auto(prof, depth=5, top_k=10, total_tokens=32, learn_costs=True), max_new_tokens=48, record=False)
        dec.start(p["prompt"], raw=p.get("raw", False))
        dec.generate()
        assert dec.generated == ref.generated


@pytest.mark.slow
def test_sampling_first_tokens_match_target(sampling_setup):
    bundle, logits = sampling_setup
    sp = SamplingParams(temperature=1.0, top_p=1.0, seed=0)
    P = exact_joint(logits, sp)
    # verification is cheap next to nothing here, so the budget keeps several nodes per cycle
    pol = auto({1: 1.0, 2: 1.0, 4: 1.0, 8: 1.0}, depth=2, total_tokens=6)
    dec = Decoder(bundle, pol, sampling=sp, max_new_tokens=3, record=False)
    runs, counts, accepted = 1500, Counter(), 0
    for seed in range(runs):
        dec.sampling.seed = 20_000 + seed
        dec.start(input_ids=SPROMPT)
        accepted += dec.step().accepted_len
        while dec.finished is None:
            dec.step()
        counts[tuple(dec.generated)] += 1
    assert accepted / runs > 0.3
    probs = {c: float(P[c]) for c in itertools.product(range(SV), repeat=3) if P[c] > 0}
    assert all(c in probs for c in counts)
    pval, bins = chi_square(counts, probs, runs)
    assert bins >= 6 and pval > ALPHA, f"chi-square p = {pval:.2e} over {bins} bins"


def _choices(bundle, pol, cycles: int, true_t=None) -> list[int]:
    """The N the budget verified in each of `cycles` greedy cycles on the tiny model. With
    `true_t`, the budget observes those figures for its verifications instead of wall time (this
    model's sub-millisecond timings on a shared machine would make the test about noise)."""
    if true_t is not None:
        pol.observe = lambda n, s: AutoBudgetPolicy.observe(pol, n, true_t(n))
    dec = Decoder(bundle, pol, max_new_tokens=4 * cycles, record=True)
    dec.start(input_ids=SPROMPT)
    out = []
    while dec.finished is None and len(out) < cycles:
        out.append(dec.step().tree.record.n)
    return out


FLAT = {1: 0.01, 2: 0.01, 4: 0.01, 8: 0.01}       # verification costs what one token does (a GPU, say)
INFLATED = {1: 0.01, 2: 1.0, 4: 1.0, 8: 1.0}       # ...but measured while the machine was busy


def test_an_inflated_cost_table_corrects_itself(sampling_setup):
    """A cost table whose t(N >= 2) is 100 times too high first makes the budget verify the root
    alone. The verifications it times, with one exploration of a larger N, correct the table
    within two cycles; from then on it keeps several nodes, as a budget that started from the
    true figures does."""
    bundle, _ = sampling_setup
    kw = dict(depth=2, top_k=3, total_tokens=8, adaptive_depth=False)
    true_t = lambda n: 0.01  # noqa: E731
    control = _choices(bundle, AutoBudgetPolicy(prior_times=FLAT, **kw), 24, true_t)
    pol = AutoBudgetPolicy(prior_times=INFLATED, **kw)
    got = _choices(bundle, pol, 24, true_t)
    assert got[0] == 1                                   # the wrong table: the root alone
    assert got[1] >= 2                                   # the exploration that re-measures
    assert pol.times.t(8) < 1.5 * pol.times.t(1)         # corrected: no longer 100x
    many = lambda ns: sum(n > 1 for n in ns) / len(ns)  # noqa: E731
    assert many(control[2:]) > 0.5                       # several nodes pay when verification is flat
    assert many(got[2:]) >= 0.8 * many(control[2:])      # ...and the corrected budget keeps them again


def test_live_corrections_stay_in_the_process(sampling_setup, tmp_path, monkeypatch):
    """Live figures that disagree with the cached table correct the policy's table, not the cache
    (timings taken while other sessions decode are their load, not this machine's cost); an
    implausible cached table (not monotone) is measured again by a tool that asks for it."""
    from eagle2.model import calibration, priors
    monkeypatch.setenv("EAGLE2_TIMING_CACHE", str(tmp_path / "verify_times.json"))
    bundle, _ = sampling_setup
    key = calibration.cache_key(bundle)
    assert f"torch {torch.__version__}" in key and f"{torch.get_num_threads()}t" in key
    (tmp_path / "verify_times.json").write_text(json.dumps({key: {"1": 1.0, "2": 5.0, "4": 0.1}}))
    assert not calibration.plausible({1: 1.0, 2: 5.0, 4: 0.1})
    # a real table (eager, one thread, this project's CPU): one token costs more than two
    real = {1: 0.0374, 2: 0.0262, 4: 0.0302, 8: 0.0330, 16: 0.0425, 32: 0.0637, 64: 0.1034, 128: 0.1893}
    assert calibration.plausible(real)
    assert not calibration.plausible({**real, 16: 0.020})  # but not one that falls from N = 2 on
    assert calibration.implausibility({**real, 16: 0.020}) == "t(16) = 20 ms < 0.7 t(8) = 33 ms"
    assert calibration.implausibility({1: 1.0, 2: 5.0, 4: 0.1}).startswith("t(2) = 5e+03 ms outside")
    fresh = calibration.verify_profile(bundle)                # implausible: measured again (a tool, in the foreground)
    assert set(fresh) == set(calibration.GRID)
    busy = {1: 0.01, 2: 0.03, 4: 0.03, 8: 0.03}         # 3x too high, yet plausible: kept as the start
    assert calibration.plausible(busy)
    calibration.store_times(bundle, busy)
    pol = AutoBudgetPolicy(depth=2, top_k=3, total_tokens=8, adaptive_depth=False)
    pol.prepare(bundle)
    assert pol.prior_times == busy and pol.prior_source == priors.MEASURED   # starts from the cache
    _choices(bundle, pol, 60, lambda n: 0.01)
    assert pol.times.t(8) < 1.5 * pol.times.t(1)         # corrected in the policy...
    written = {int(k): v for k, v in json.loads((tmp_path / "verify_times.json").read_text())[key].items()}
    assert written == busy                               # ...and the cache still holds the measurement


IMPLAUSIBLE = {"1": 1.0, "2": 5.0, "4": 0.1}


@pytest.fixture()
def measurer(monkeypatch):
    """A background measurer quick to settle (each test's own, from conftest.py, waits the app's
    second), and an empty memory of plausible tables."""
    from eagle2.model import calibration, measurer as m
    own = m.Measurer(settle_s=0.2, wait_s=60.0)
    monkeypatch.setattr(m, "MEASURER", own)
    monkeypatch.setattr(calibration, "_known", {})
    yield own
    own.close()   # while this test's cache is the configuration's: nothing lands in another's


def counting_measurements(monkeypatch) -> list[str]:
    """The names of the threads that call measure_verify_times from now on."""
    from eagle2.model import calibration
    calls, real = [], calibration.measure_verify_times

    def counted(*a, **kw):
        calls.append(threading.current_thread().name)
        return real(*a, **kw)

    monkeypatch.setattr(calibration, "measure_verify_times", counted)
    return calls


def test_sessions_starting_at_once_do_not_measure_in_their_first_step(tiny_target, tmp_path, monkeypatch, measurer):
    """Four sessions start eagle2-auto at the same moment against a cache whose table for the model
    is not plausible (the reporter's class: a table rewritten from timings taken under load). None
    of their first Steps measures t(N) (each used to, seconds on a CPU the other sessions share):
    they start from an estimate, and the background measurer measures once they are quiet, in its
    own thread, and caches what it measured."""
    from eagle2.decoding.race import Race, RaceSettings
    from eagle2.model import calibration, priors
    from eagle2.model.loading import load_bundle
    folder, _ = tiny_target("quiet-sessions")      # a model of its own: no table of it in this process
    bundle = load_bundle(target=str(folder), head="random", seed_random_head=1)
    cache = tmp_path / "verify_times.json"
    monkeypatch.setenv("EAGLE2_TIMING_CACHE", str(cache))
    cache.write_text(json.dumps({calibration.cache_key(bundle): IMPLAUSIBLE}))
    calls = counting_measurements(monkeypatch)
    K, settings = 4, RaceSettings(policy="eagle2-auto", total_tokens=8, depth=3, top_k=4, max_new_tokens=12)
    barrier, races, errors = threading.Barrier(K, timeout=60), {}, []

    def first_step(i):
        try:
            barrier.wait()
            r = Race()
            r.start(bundle, f"w{i + 3} w{i + 5} w{i + 9}", settings)   # what a session's first Step does
            r.tick()
            races[i] = r
        except Exception as e:  # reported below
            errors.append(f"session {i}: {type(e).__name__}: {e}")

    threads = [threading.Thread(target=first_step, args=(i,), name=f"session-{i}", daemon=True) for i in range(K)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 120
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert not [t.name for t in threads if t.is_alive()], "a first Step did not answer within 120 s"
    assert not errors, errors
    in_steps = [name for name in calls if name.startswith("session-")]
    print(f"measure_verify_times called from: {calls}")
    assert not in_steps, f"the sessions' first Steps measured t(N) {len(in_steps)} time(s): {in_steps}"
    assert all(r.main.policy.prior_source == priors.ESTIMATE for r in races.values())
    assert all(calibration.plausible(r.main.policy.prior_times) for r in races.values())
    # the sessions asked once between them; the measurer measured when they had stopped
    measurer.request(bundle).result(timeout=120)
    assert calls and all(name.startswith("eagle2-t(N)-measurer") for name in calls), calls
    cached = calibration.cached_times(bundle)
    assert cached is not None and set(cached) == set(calibration.GRID)


def test_a_closed_measurer_measures_nothing(sampling_setup, monkeypatch, measurer):
    """Closed (each test's at its end: conftest.py), a measurer waiting for a quiet moment gives up
    at once, and a later request is answered None without measuring: nothing of a test's is
    measured after it, into whatever cache is configured then."""
    from eagle2.model.activity import DECODING
    bundle, _ = sampling_setup
    calls = counting_measurements(monkeypatch)
    with DECODING:                                   # a session's Step in flight: the measurer waits
        waiting = measurer.request(bundle)
        # close() must not wait for the quiet moment this thread's DECODING prevents (that would
        # never come): run it beside, the join only a guard against that hang
        closing = threading.Thread(target=measurer.close, daemon=True)
        closing.start()
        closing.join(timeout=60)
        assert not closing.is_alive(), "close() waited for a measurement that waits for a quiet moment"
    assert waiting.cancelled() or waiting.result(timeout=0) is None   # cancelled if it had not begun
    assert measurer.request(bundle, refresh=True).result(timeout=0) is None
    assert calls == []


EXITS_WHILE_MEASURING = """
import sys, time
from types import SimpleNamespace
from eagle2.model import calibration, measurer

def endless(bundle, give_way=False):   # a measurement that never ends unless abandoned
    while True:
        time.sleep(0.05)

calibration.measure_quietly = endless
calibration.verify_profile = lambda bundle, refresh=False, measure=True: None
calibration.cache_key = lambda bundle: "k"
m = measurer.Measurer(settle_s=0.0)
m.request(SimpleNamespace())
time.sleep(0.5)   # measuring now
print("leaving", flush=True)
"""


def test_the_process_exits_without_waiting_for_a_measurement(tmp_path):
    """A tool that asked for t(N) in the background and ends meanwhile exits at once: the
    measurement is abandoned (never cached half-done), not waited for."""
    import os
    import subprocess
    import sys
    # the measurement never ends: a process that waited for it would run into the timeout (a hang
    # guard, not a speed bound)
    r = subprocess.run([sys.executable, "-c", EXITS_WHILE_MEASURING], capture_output=True, text=True, timeout=170,
                       env={**os.environ, "EAGLE2_CACHE": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.strip() == "leaving", r.stderr[-2000:]


EXITS_WHILE_THE_KERNELS_MEASURE = """
import time
from eagle2.model import measurer
from eagle2.model.loading import load_bundle
b = load_bundle()   # the default: the q4_1 kernels, their threads inside each forward
measurer.Measurer(settle_s=0.0).request(b, refresh=True)
time.sleep(1.5)     # its forwards running now (a table takes several seconds)
print("leaving", flush=True)
"""


@pytest.mark.slow   # the full suite's: the real model's load and part of a measurement
def test_the_process_exits_cleanly_while_the_kernels_measure(real_model_cache, tmp_path):
    """The abandoned measurement is inside the kernels' OpenMP forwards when the interpreter
    exits: the process still ends at once with 0, no abort."""
    import os
    import subprocess
    import sys
    env = {**os.environ, "EAGLE2_CACHE": str(real_model_cache), "EAGLE2_TIMING_CACHE": str(tmp_path / "t.json")}
    r = subprocess.run([sys.executable, "-c", EXITS_WHILE_THE_KERNELS_MEASURE], capture_output=True, text=True,
                       timeout=300, env=env)   # a hang guard: the load and a full table take far less
    assert r.returncode == 0 and r.stdout.strip() == "leaving", r.stderr[-2000:]
    assert "terminate" not in r.stderr and "Abort" not in r.stderr, r.stderr[-2000:]
    assert not (tmp_path / "t.json").exists()   # nothing half-measured was cached


def test_a_timing_taken_while_decoding_is_not_cached(sampling_setup, tmp_path, monkeypatch, measurer):
    """A measurement with a decode in flight when it began, or one starting before it ended, is not
    written to the cache: the background measurer gives way at once and measures again when quiet."""
    from eagle2.model import calibration
    from eagle2.model.activity import DECODING
    bundle, _ = sampling_setup
    monkeypatch.setenv("EAGLE2_TIMING_CACHE", str(tmp_path / "verify_times.json"))
    with DECODING:                                   # a session's Step in flight
        t, quiet = calibration.measure_quietly(bundle)
    assert not quiet and set(t) == set(calibration.GRID) and calibration.cached_times(bundle) is None
    calls, measured = counting_measurements(monkeypatch), []
    counted = calibration.measure_verify_times

    def a_step_starts_meanwhile(*a, **kw):
        if not measured:                             # the first measurement: a session decodes
            plain = Decoder(bundle, "plain", max_new_tokens=4, record=False)
            plain.start(input_ids=SPROMPT)
            plain.step()
        measured.append(counted(*a, **kw))
        return measured[-1]

    monkeypatch.setattr(calibration, "measure_verify_times", a_step_starts_meanwhile)
    measurer.request(bundle).result(timeout=120)
    assert len(calls) >= 2 and len(measured[0]) < len(calibration.GRID)   # gave way at once, then again
    assert calibration.cached_times(bundle) == measured[-1]              # what the quiet one measured
    assert all(set(m) == set(calibration.GRID) for m in measured[1:])


def test_a_budget_without_a_table_starts_from_an_estimate(sampling_setup, tmp_path, monkeypatch, measurer):
    """With no plausible table cached (none, or one that is not plausible) a budget starts from an
    estimate built on t(1), plausible by construction, and decodes losslessly from it: greedy output
    equals plain decoding."""
    from eagle2.model import calibration, priors
    bundle, _ = sampling_setup
    cache = tmp_path / "verify_times.json"
    monkeypatch.setenv("EAGLE2_TIMING_CACHE", str(cache))
    guessed = priors.prior_times(bundle)                           # nothing cached: t(1) from the weights
    assert guessed.source == priors.ESTIMATE and calibration.plausible(guessed.times)
    cache.write_text(json.dumps({calibration.cache_key(bundle): IMPLAUSIBLE}))
    prior = priors.prior_times(bundle)                             # the stale table's t(1)
    assert prior.source == priors.ESTIMATE and prior.times[1] == 1.0 and calibration.plausible(prior.times)
    assert set(prior.times) == set(calibration.GRID) and prior.times[128] > prior.times[2]
    ref = Decoder(bundle, "plain", max_new_tokens=24, record=False)
    ref.start(input_ids=SPROMPT)
    ref.generate()
    pol = AutoBudgetPolicy(depth=3, top_k=4, total_tokens=8)
    dec = Decoder(bundle, pol, max_new_tokens=24, record=False)
    assert pol.prior_source == priors.ESTIMATE
    dec.start(input_ids=SPROMPT)
    dec.generate()
    assert dec.generated == ref.generated
    measurer.request(bundle).result(timeout=120)   # the budget asked for a table: measured once quiet
    assert calibration.cached_times(bundle) != {int(k): v for k, v in IMPLAUSIBLE.items()}


def test_acceptance_odds_find_the_shift_the_target_accepts_with():
    """AcceptanceOdds fits the one number mapping draft values to acceptance: from nodes accepted
    with odds twice their values' it finds about 2; from values that are right, about 1; and one
    cycle of evidence moves it only part way (the prior holds it near the values)."""
    from eagle2.policies.auto import AcceptanceOdds, calibrated
    rng = np.random.default_rng(0)
    for true_odds in (2.0, 1.0, 0.5):
        fit = AcceptanceOdds(memory=1024)
        for _ in range(256):   # cycles of 4 verified nodes
            p = rng.uniform(0.01, 0.99, 4)
            fit.observe(p.tolist(), (rng.uniform(size=4) < calibrated(p, true_odds)).tolist())
        assert fit.odds == pytest.approx(true_odds, rel=0.25), true_odds
    one = AcceptanceOdds(every=1)
    one.observe([0.5], [True])
    assert 1.0 < one.odds < 2.0
    assert len(fit.p) == fit.memory   # the fit reads the last `memory` nodes
    assert calibrated(np.array([0.0, 0.5, 1.0]), 3.0).tolist() == [0.0, 0.75, 1.0]
