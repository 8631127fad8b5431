"""t(N) and its one reading (eagle2/model/verify_times.py): linear between the measured N, the
last slope extended beyond them, flat below; one rule for the budget and the what-ifs alike."""
from __future__ import annotations

import json

import numpy as np
import pytest

from eagle2.model.verify_times import LiveVerifyTimes
from eagle2.model.verify_times import RECORD_KEY, VerifyTimes


def test_between_beyond_and_below_the_measured_points():
    t = VerifyTimes({"1": 0.01, "4": 0.02, "8": 0.04})          # keys as JSON leaves them
    assert t.points == {1: 0.01, 4: 0.02, 8: 0.04}
    assert t.t(1) == pytest.approx(0.01) and t.t(2) == pytest.approx(0.01 + 0.01 / 3)
    assert t.t(6) == pytest.approx(0.03) and t.t(16) == pytest.approx(0.08)   # last slope 0.005/token
    assert VerifyTimes({2: 0.02, 4: 0.03}).t(1) == pytest.approx(0.02)      # below the smallest N: flat
    assert VerifyTimes({1: 0.05}).t(64) == pytest.approx(0.05)              # one point: flat everywhere
    falling = VerifyTimes({1: 0.03, 2: 0.02})                               # one token slower than two
    assert falling.t(8) == pytest.approx(0.02)                              # extended, never falling
    with pytest.raises(ValueError):
        VerifyTimes({})


def test_an_array_of_n_reads_as_each_n_alone():
    """The budget reads every N of a cycle in one call: the same figures as one N at a time."""
    t = VerifyTimes({1: 0.054, 8: 0.047, 16: 0.062, 64: 0.141})
    ns = np.arange(1, 129)
    got = t.t(ns)
    assert isinstance(got, np.ndarray) and got == pytest.approx([t.t(int(n)) for n in ns])
    assert isinstance(t.t(3), float)


def test_a_recorded_table_is_read_leniently():
    raw = json.loads(json.dumps({RECORD_KEY: {1: 0.05, 64: 0.15, "bad": 1, 0: 1.0, 2: -1, 8: "nan"}}))[RECORD_KEY]
    assert VerifyTimes.read(raw) == VerifyTimes({1: 0.05, 64: 0.15})
    assert VerifyTimes.read(None) is None and VerifyTimes.read({"x": 1}) is None and VerifyTimes.read([1]) is None


def test_the_live_table_reads_by_the_same_rule():
    prior = {1: 0.01, 2: 0.012, 4: 0.016, 8: 0.024}
    live = LiveVerifyTimes(prior)
    ns = np.arange(1, 17)
    assert live.t(ns) == pytest.approx(VerifyTimes(prior).t(ns))
    live.observe(2, 0.006)                                       # N = 2 took half the prior's figure
    assert live.t(2) == pytest.approx(0.006) and live.t(8) == pytest.approx(0.012)   # the table above it halves
    assert live.t(1) == pytest.approx(0.01)                      # below every observation: the prior


def test_the_live_table_settles_small_moves_and_takes_large_ones_at_once():
    """A median that moves by less than SETTLE keeps the table the budget reads (it is rebuilt
    only when a new N is observed or a median moves further); t() and table() stay one reading."""
    from eagle2.model.verify_times import SETTLE
    live = LiveVerifyTimes({1: 0.01, 2: 0.012, 4: 0.016, 8: 0.024}, window=1)
    live.observe(2, 0.006)
    first = live.table(8).copy()
    assert first[1] == pytest.approx(0.006)
    live.observe(2, 0.006 * (1 + SETTLE / 2))                    # a small move: the same table
    assert (live.table(8) == first).all() and live.t(2) == first[1]
    live.observe(2, 0.006 * (1 + 3 * SETTLE))                    # a larger one: read at once
    assert live.table(8)[1] == pytest.approx(0.006 * (1 + 3 * SETTLE)) and live.t(2) == live.table(8)[1]
    live.observe(4, 0.01)                                        # a new N: read at once
    assert live.t(4) == pytest.approx(0.01) and live.table(8)[3] == live.t(4)
