"""Trace files: typed policy records round-trip through JSON, traces written before records
existed (schema v1, a free `extra` dict) still load, every field of a file is checked against its
type, a bad one giving one UserError that names where it is, and the shipped traces read and write
back byte for byte."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from eagle2.cycle.trace import SCHEMA, StepTrace, Trace
from eagle2.cycle.tree import DraftTree
from eagle2.errors import UserError
from eagle2.policies.auto import AutoRecord
from eagle2.policies.ddd import DDDRecord
from eagle2.policies.dyspec import DySpecRecord
from eagle2.policies.lantern import RelaxationRecord
from eagle2.policies.registry import RECORD_TYPES, TRACES


TIMES = {"draft_s": 0.1, "verify_s": 0.2, "commit_s": 0.0, "total_s": 0.3}
TOTALS = {"tokens": 2, "target_forwards": 2, "wall_s": 0.5, "draft_calls": 2}


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
    st = StepTrace(cycle=1, policy="p", new_tokens=[6, 7], new_texts=["a", "b"], accepted_len=1, bonus=7,
                   timings=TIMES, cumulative=TOTALS, tree=t, tree_texts=["r", "a", "b"], accepted_path=[1], root=5)
    text = Trace(meta={"m": 1}, steps=[st]).to_json()
    assert json.loads(text)["schema"] == SCHEMA
    back = TRACES.from_json(text).steps[0].tree
    assert back.record == rec and type(back.record) is type(rec)
    assert (back.draft_calls, back.beam, back.beam_mass, back.sampled_drafts) == (2, [[1], [2]], [-0.1, -0.3], True)


def test_the_registry_reads_every_policys_record():
    assert set(RECORD_TYPES) == {AutoRecord, DDDRecord, DySpecRecord, RelaxationRecord}
    assert len({r.kind for r in RECORD_TYPES}) == len(RECORD_TYPES)   # kinds tell them apart


def test_schema_v1_traces_still_load():
    d = json.loads(Trace(meta={}, steps=[StepTrace(cycle=1, policy="p", new_tokens=[6], new_texts=["a"],
                                                  accepted_len=0, bonus=6, timings=TIMES, cumulative=TOTALS,
                                                  tree=tree())]).to_json())
    d["schema"] = "eagle2-viz/trace/v1"
    tr = d["steps"][0]["tree"]
    for k in ("draft_calls", "beam", "beam_mass", "sampled_drafts", "record"):
        tr.pop(k)
    tr["extra"] = {"beam": [[1]], "beam_mass": [-0.1], "draft_calls": 3, "ddd": {"checks": []}}
    t = TRACES.from_json(json.dumps(d)).steps[0].tree
    assert (t.beam, t.beam_mass, t.draft_calls, t.record) == ([[1]], [-0.1], 3, None)
    d["schema"] = "eagle2-viz/trace/v0"
    with pytest.raises(UserError, match="schema"):
        TRACES.from_json(json.dumps(d))


# ---------------------------------------------------------------- typed validation of trace files
ROOT = Path(__file__).resolve().parent.parent
SHIPPED = sorted((ROOT / "assets" / "traces").glob("*.json"))
RACE = ROOT / "tests" / "data" / "fp32-eagle2-math-greedy.json"   # a CPU race the rules below edit


def good() -> dict:
    """A small valid trace file (parsed): a prefill and a drafted step with a record."""
    pre = StepTrace(cycle=0, policy="p", new_tokens=[5], new_texts=["r"], accepted_len=0, bonus=None,
                    timings=TIMES, cumulative=TOTALS)
    st = StepTrace(cycle=1, policy="p", new_tokens=[6, 7], new_texts=["a", "b"], accepted_len=1, bonus=7,
                   timings=TIMES, cumulative=TOTALS, tree=tree(AutoRecord(n=3)), tree_texts=["r", "a", "b"],
                   accepted_path=[1], root=5)
    return json.loads(Trace(meta={"m": 1}, steps=[pre, st]).to_json())


def malformed(d) -> str:
    with pytest.raises(UserError) as e:
        TRACES.from_json(json.dumps(d))
    msg = str(e.value)
    assert msg.startswith("The trace is malformed (") and "Error" not in msg, msg
    return msg


def edited(change) -> dict:
    d = good()
    change(d)
    return d


@pytest.mark.parametrize("change,where", [
    (lambda d: d["steps"][1]["tree"]["parents"].__setitem__(2, "1"), "steps[1].tree.parents[2]: expected int, got str"),
    (lambda d: d["steps"][1].update(accepted_len=True), "steps[1].accepted_len: expected int, got bool"),
    (lambda d: d["steps"][1].update(bonus=7.5), "steps[1].bonus: expected int, got float"),
    (lambda d: d["steps"][1].update(new_texts="ab"), "steps[1].new_texts: expected list, got str"),
    (lambda d: d["steps"][1].update(timings=None), "steps[1].timings: expected dict, got None"),
    (lambda d: d["steps"][1]["timings"].update(verify_s="slow"), "steps[1].timings.verify_s: expected number, got str"),
    (lambda d: d["steps"][1]["timings"].pop("verify_s"), "steps[1].timings: missing key 'verify_s'"),
    (lambda d: d["steps"][0].update(cumulative={}), "steps[0].cumulative: missing key 'tokens'"),
    (lambda d: d["steps"][1]["cumulative"].pop("wall_s"), "steps[1].cumulative: missing key 'wall_s'"),
    (lambda d: d["steps"][1].pop("policy"), "steps[1]: missing field 'policy'"),
    (lambda d: d["steps"][1].update(colour="red"), "steps[1]: unknown field 'colour'"),
    (lambda d: d["steps"].__setitem__(0, 5), "steps[0]: expected dict, got int"),
    (lambda d: d["steps"][1]["tree"]["target_prob"].append("x"),
     "steps[1].tree.target_prob[0]: expected float, got str"),
    (lambda d: d["steps"][1]["tree"]["kept"].__setitem__(1, 1), "steps[1].tree.kept[1]: expected bool, got int"),
    (lambda d: d["steps"][1]["tree"]["beam"].append([1, None]), "steps[1].tree.beam[0][1]: expected int, got None"),
    (lambda d: d["steps"][1]["tree"].update(draft_dists={}), "steps[1].tree: unknown field 'draft_dists'"),
    (lambda d: d["steps"][1]["tree"].pop("tokens"), "steps[1].tree: missing field 'tokens'"),
    (lambda d: d["steps"][1]["tree"]["record"].update(n="3"), "steps[1].tree.record.n: expected int, got str"),
    (lambda d: d["steps"][1]["tree"]["record"].update(kind="nope"), "steps[1].tree.record.kind: unknown tree record"),
    (lambda d: d["steps"][1]["tree"]["record"].pop("kind"), "steps[1].tree.record: missing field 'kind'"),
    (lambda d: d["steps"][1]["tree"].update(record=[]), "steps[1].tree.record: expected dict, got list"),
    (lambda d: d["steps"][1]["cumulative"].update(tokens=True), "steps[1].cumulative.tokens: expected number, got bool"),
    (lambda d: d["steps"][1]["tree"]["record"].update(x=1), "steps[1].tree.record: unknown field 'x'"),
    (lambda d: d.update(meta=5), "meta: expected dict, got int"),
    (lambda d: d.update(steps={}), "steps: expected list, got dict"),
    (lambda d: d.pop("steps"), "missing field 'steps'"),
    (lambda d: d.update(extra=1), "unknown field 'extra'"),
])
def test_a_bad_field_gives_one_user_error_naming_its_path(change, where):
    assert where in malformed(edited(change))


def test_types_are_checked_the_json_way():
    """An int stands for a float; None where the field allows it; a preview's empty totals."""
    d = good()
    d["steps"][1]["tree"]["logp"] = [0, -1, -2]
    d["steps"][1]["tree"]["target_prob"] = [None, 0.5, 1]
    d["steps"][1]["timings"] = {"draft_s": 0, "verify_s": 1, "commit_s": 0, "total_s": 1}
    t = TRACES.from_json(json.dumps(d)).steps[1]
    assert t.tree.logp == [0, -1, -2] and t.tree.record == AutoRecord(n=3)
    assert t.cumulative == TOTALS and type(t.cumulative["tokens"]) is int   # counts stay counts
    preview = dict(d["steps"][1], cumulative={})        # a preview: a step outside the run
    assert TRACES.step(preview).cumulative == {}
    with pytest.raises(UserError, match="steps\\[4\\].tree.depths\\[0\\]: expected int, got float"):
        TRACES.step(dict(preview, tree=dict(preview["tree"], depths=[0.0, 1, 2])), "steps[4]")


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: p.name)
def test_shipped_traces_load_and_write_back_the_same_bytes(path):
    tr = TRACES.load(path)
    assert tr.steps and all(set(s.timings) >= {"draft_s", "verify_s", "total_s"} for s in tr.steps)
    previews = [TRACES.step(d) for d in tr.meta["viz"]["previews"]]
    assert previews and [p.to_dict() for p in previews] == tr.meta["viz"]["previews"]
    text = tr.to_json()
    assert TRACES.from_json(text) == tr
    # the recorder writes them compact: the same data, the same bytes
    assert json.dumps(json.loads(text), separators=(",", ":")) == path.read_text(encoding="utf-8")


def test_a_v1_file_with_previews_and_old_series_loads_and_uploads(tmp_path):
    """A v1 trace as the v1 recorder wrote it: policy facts in the tree's `extra`, no record, series
    without the pricing keys, previews with empty totals; it loads, replays and passes the upload."""
    d = json.loads(RACE.read_text(encoding="utf-8"))
    d["schema"] = "eagle2-viz/trace/v1"
    first = {k: d["steps"][1]["tree"][k] for k in ("beam", "draft_calls")}
    for st in d["steps"] + d["meta"]["viz"]["previews"]:
        t = st["tree"]
        if t is not None:
            t["extra"] = {k: t.pop(k) for k in ("beam", "beam_mass", "draft_calls")}
            for k in ("sampled_drafts", "record"):
                t.pop(k)
    for s in d["meta"]["viz"]["series"]:
        for k in ("verified", "draft_calls", "verify_s", "draft_s"):
            s.pop(k, None)
    d["meta"].pop("verify_profile_s")
    path = tmp_path / "v1.json"
    path.write_text(json.dumps(d), encoding="utf-8")
    tr = TRACES.load(path)
    assert first["beam"] and (tr.steps[1].tree.beam, tr.steps[1].tree.draft_calls) == (first["beam"], first["draft_calls"])
    from ui.traces import read_upload
    view = read_upload(path)
    assert len(view.steps) == len(tr.steps) and view.previews and len(view.series) == 3


def test_an_upload_with_a_bad_field_says_where(tmp_path):
    from ui.traces import read_upload
    d = json.loads(RACE.read_text(encoding="utf-8"))
    d["steps"][3]["tree"]["parents"][5] = "x"
    path = tmp_path / "bad.json"
    path.write_text(json.dumps(d), encoding="utf-8")
    with pytest.raises(UserError) as e:
        read_upload(path)
    assert str(e.value) == ("Could not read this trace: the trace is malformed "
                            "(steps[3].tree.parents[5]: expected int, got str).")


# ---------------------------------------------------------------- the rules beyond the field types
def race_edited(change) -> dict:
    """A shipped trace (it records the race: series and previews), changed."""
    d = json.loads(RACE.read_text(encoding="utf-8"))
    change(d)
    return d


def tree_of(d, i=1) -> dict:
    return d["steps"][i]["tree"]


def series_of(d, i=0) -> dict:
    return d["meta"]["viz"]["series"][i]


def preview_of(d, i) -> dict:
    return d["meta"]["viz"]["previews"][i]


@pytest.mark.parametrize("base,change,where", [
    # a step: its texts, how much it accepted and where (the figures index the tree by these)
    (edited, lambda d: d["steps"][1]["new_texts"].pop(), "steps[1].new_texts: 1 texts for 2 new_tokens"),
    (edited, lambda d: d["steps"][1].update(accepted_len=4), "steps[1].accepted_len: 4 accepted of the tree's 3"),
    (edited, lambda d: d["steps"][1].update(accepted_len=-1),
     "steps[1].accepted_len: an accepted count is out of range"),
    (edited, lambda d: d["steps"][0].update(accepted_len=5000),
     "steps[0].accepted_len: an accepted count is out of range"),
    (edited, lambda d: d["steps"][1]["tree_texts"].pop(), "steps[1].tree_texts: 2 entries for the tree's 3 nodes"),
    (edited, lambda d: d["steps"][1].update(accepted_path=[3]),
     "steps[1].accepted_path[0]: 3 is not a node of the tree"),
    (edited, lambda d: d["steps"][1].update(accepted_path=[1, 0]), "steps[1].accepted_path[1]: 0 is not a node"),
    # a tree: a root, every column one entry per node, each parent an earlier node
    (edited, lambda d: tree_of(d).update({k: [] for k in ("tokens", "parents", "depths", "ranks", "logp", "values",
                                                         "levels", "kept")}),
     "steps[1].tree.tokens: a tree holds at least its root"),
    (edited, lambda d: tree_of(d)["levels"].pop(), "steps[1].tree.levels: 2 entries for the tree's 3 nodes"),
    (edited, lambda d: tree_of(d).update(target_prob=[0.5]), "steps[1].tree.target_prob: 1 entries for the tree's 3"),
    (edited, lambda d: tree_of(d)["parents"].__setitem__(0, 0), "steps[1].tree.parents[0]: the root's parent is -1"),
    (edited, lambda d: tree_of(d)["parents"].__setitem__(2, 2),
     "steps[1].tree.parents[2]: node 2's parent is not an earlier node"),
    # the steps: one run, cycles in order
    (edited, lambda d: d["steps"][1].update(cycle=0), "steps[1].cycle: cycle 0 after cycle 0"),
    # the meta the page reads: the run's description, the race's series and previews
    (edited, lambda d: d["meta"].update(sampling=[0.7]), "meta.sampling: expected dict, got list"),
    (edited, lambda d: d["meta"].update(policy="eagle2"), "meta.policy: expected dict, got str"),
    (edited, lambda d: d["meta"].update(viz=1), "meta.viz: expected dict, got int"),
    (edited, lambda d: d["meta"].update(model=1), "meta.model: expected str, got int"),
    (edited, lambda d: d["meta"].update(prompt_text=["hi"]), "meta.prompt_text: expected str, got list"),
    (edited, lambda d: d["meta"].update(sampling={"temperature": "hot"}),
     "meta.sampling.temperature: expected number, got str"),
    (edited, lambda d: d["meta"].update(sampling={"temperature": True}),
     "meta.sampling.temperature: expected number, got bool"),
    (race_edited, lambda d: d["meta"]["viz"].update(series={}), "meta.viz.series: expected list, got dict"),
    (race_edited, lambda d: d["meta"]["viz"].update(previews="x"), "meta.viz.previews: expected list, got str"),
    (race_edited, lambda d: series_of(d, 1).update(label=None), "meta.viz.series[1].label: expected str"),
    (race_edited, lambda d: series_of(d, 1).pop("label"), "meta.viz.series[1]: missing field 'label'"),
    (race_edited, lambda d: series_of(d)["wall_s"].__setitem__(2, float("nan")),
     "meta.viz.series[0].wall_s[2]: expected a finite number, got nan"),
    (race_edited, lambda d: series_of(d)["verify_s"].__setitem__(2, "x"),
     "meta.viz.series[0].verify_s[2]: expected float, got str"),
    (race_edited, lambda d: series_of(d)["forwards"].pop(),
     "meta.viz.series[0].forwards: 11 entries for the 12 cycles of tokens"),
    (race_edited, lambda d: series_of(d)["accepted"].extend([1] * 11),
     "meta.viz.series[0].accepted: 22 entries for the 12 cycles of tokens"),
    (race_edited, lambda d: series_of(d)["accepted"].__setitem__(0, -1),
     "meta.viz.series[0].accepted[0]: an accepted count is out of range"),
    (race_edited, lambda d: preview_of(d, 2)["tree"]["parents"].__setitem__(3, 9),
     "meta.viz.previews[2].tree.parents[3]: node 3's parent is not an earlier node"),
    (race_edited, lambda d: preview_of(d, 0).update(accepted_len=True),
     "meta.viz.previews[0].accepted_len: expected int, got bool"),
])
def test_a_broken_rule_gives_one_user_error_naming_its_path(base, change, where):
    """Beyond each field's type: what the figures draw from (every rule the page's upload checked)."""
    assert where in malformed(base(change))


def test_texts_may_be_missing_altogether_and_meta_names_anything_else():
    """A run recorded without texts still reads (the figures show token ids); the meta's other
    names and the race record's are the recorder's own, kept as written."""
    d = good()
    for st in d["steps"]:
        st["new_texts"], st["tree_texts"] = [], []
    d["meta"] = {"sampling": {"temperature": 0, "seed": "any"}, "viz": {"title": 5, "previews": None}, "x": [[{}]]}
    tr = TRACES.from_json(json.dumps(d))
    assert tr.meta == d["meta"] and tr.steps[1].tree_texts == []


def test_the_reader_parses_the_text_in_one_place(tmp_path):
    """Bytes or text, JSON, how deep it nests: one reader, whose errors speak of the file as "it"
    and load names the file (the page says "Could not read this trace" instead)."""
    text = json.dumps(good())
    assert TRACES.from_json(("\ufeff" + text).encode("utf-8")) == TRACES.from_json(text)   # a byte-order mark
    for raw, said in ((b"\xff\xfe{", "It is not a text file"), ("{oops", "It is not valid JSON ("),
                      ("[" * 100_000, "Its JSON is nested far too deeply."),
                      (json.dumps({"a": json.loads("[" * 40 + "]" * 40)}), "Its JSON nests more than 32 levels")):
        with pytest.raises(UserError, match=f"^{said[:12]}") as e:
            TRACES.from_json(raw)
        assert said in str(e.value)
    path = tmp_path / "t.json"
    path.write_text("{oops", encoding="utf-8")
    with pytest.raises(UserError, match=f"^Cannot read trace {path}: it is not valid JSON"):
        TRACES.load(path)
    with pytest.raises(UserError, match="^Cannot read trace .*missing.json: No such file"):
        TRACES.load(tmp_path / "missing.json")
