"""Trace files: typed policy records round-trip through JSON, and traces written before records
existed (schema v1, a free `extra` dict) still load."""
from __future__ import annotations

import json

import pytest

from eagle2.cycle.records import AutoRecord, DDDRecord, DySpecRecord, RelaxationRecord, record_from_dict
from eagle2.cycle.trace import SCHEMA, StepTrace, Trace
from eagle2.cycle.tree import DraftTree
from eagle2.errors import UserError


def tree(record=None, **kw) -> DraftTree:
    return DraftTree(tokens=[5, 6, 7], parents=[-1, 0, 1], depths=[0, 1, 2], ranks=[0, 0, 0], logp=[0.0, -0.1, -0.2],
                     values=[0.0, -0.1, -0.3], levels=[-1, 0, 1], kept=[True, True, True], record=record, **kw)


@pytest.mark.parametrize("rec", [
    None,
    DDDRecord(threshold=-0.5, check_levels=[2], max_depth=4, checks=[{"level": 2, "beam_mass": -0.7, "stop": True}],
              stopped_at=2),
    AutoRecord(n=5, levels=2, expected_tokens=2.5),
    DySpecRecord(mode="threshold", greedy=False, temperature=0.7, budget=7, threshold=0.1, slot_value=[None, -0.1, -0.3]),
    RelaxationRecord(rule="lantern++", lam=3.0, positions=[{"parent": 0, "node": 1}], relaxed_tokens=1, tv_max=0.2),
])
def test_records_round_trip_through_a_trace(rec):
    t = tree(rec, draft_calls=2, beam=[[1], [2]], beam_mass=[-0.1, -0.3], sampled_drafts=True)
    t.draft_dists = {0: object()}  # runtime only: never written
    st = StepTrace(cycle=1, policy="p", new_tokens=[6, 7], new_texts=["a", "b"], accepted_len=1, bonus=7,
                   timings={}, cumulative={}, tree=t, tree_texts=["r", "a", "b"], accepted_path=[1], root=5)
    text = Trace(meta={"m": 1}, steps=[st]).to_json()
    assert json.loads(text)["schema"] == SCHEMA and "draft_dists" not in text
    back = Trace.from_json(text).steps[0].tree
    assert back.record == rec and type(back.record) is type(rec)
    assert (back.draft_calls, back.beam, back.beam_mass, back.sampled_drafts) == (2, [[1], [2]], [-0.1, -0.3], True)
    assert back.draft_dists == {}


def test_record_notes_and_departure():
    assert "stops expanding" in DDDRecord(threshold=-0.3, checks=[{"level": 2, "beam_mass": -0.9, "stop": True}]
                                          ).expand_note(1)
    assert DDDRecord().expand_note(1) == ""
    assert "N = 5" in AutoRecord(n=5).rerank_note()
    assert RelaxationRecord(relaxed_tokens=2, tv_max=0.1).departure() == {"rule": "lantern++", "relaxed_tokens": 2,
                                                                           "max_shift": 0.1}
    assert AutoRecord().departure() is None
    with pytest.raises(ValueError):
        record_from_dict({"kind": "no-such-kind"})


def test_schema_v1_traces_still_load():
    d = json.loads(Trace(meta={}, steps=[StepTrace(cycle=1, policy="p", new_tokens=[6], new_texts=["a"],
                                                  accepted_len=0, bonus=6, timings={}, cumulative={},
                                                  tree=tree())]).to_json())
    d["schema"] = "eagle2-viz/trace/v1"
    tr = d["steps"][0]["tree"]
    for k in ("draft_calls", "beam", "beam_mass", "sampled_drafts", "record"):
        tr.pop(k)
    tr["extra"] = {"beam": [[1]], "beam_mass": [-0.1], "draft_calls": 3, "ddd": {"checks": []}}
    t = Trace.from_json(json.dumps(d)).steps[0].tree
    assert (t.beam, t.beam_mass, t.draft_calls, t.record) == ([[1]], [-0.1], 3, None)
    d["schema"] = "eagle2-viz/trace/v0"
    with pytest.raises(UserError, match="schema"):
        Trace.from_json(json.dumps(d))
