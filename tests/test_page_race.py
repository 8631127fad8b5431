"""scripts/page_race.py's judgement, on a shipped race trace and a bench summary made from it: the
page's costs read from the exported trace, the bench's from its summary, and which phases count."""
from __future__ import annotations

import copy
import importlib.util
from pathlib import Path

import pytest

from eagle2.phases import PHASES
from eagle2.policies.registry import TRACES

REPO = Path(__file__).resolve().parent.parent
RACE = REPO / "assets" / "traces" / "writing-greedy.json"


@pytest.fixture(scope="module")
def page_race():
    spec = importlib.util.spec_from_file_location("page_race", REPO / "scripts" / "page_race.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def summary_of(costs: dict, forwards: int = 20, repeats: int = 3) -> dict:
    """A bench summary whose rows cost exactly `costs` (page_costs' shape), keyed by policy."""
    out = {}
    for c in costs.values():
        tokens = int(c["tokens"] * repeats)
        out[c["policy"]] = {"new_tokens": tokens, "target_forwards": forwards,
                            "phase_ms_per_cycle": {p: v * tokens / forwards for p, v in c["ms_per_token"].items()}}
    return {"policies": out, "repeats": repeats}


def test_same_costs_are_within_and_drift_is_judged_by_phase(page_race):
    page = page_race.page_costs(TRACES.load(RACE))
    assert set(page) == {"main", "compare", "plain"}
    assert page["main"]["policy"] == "eagle2-auto" and page["plain"]["policy"] == "plain"
    assert page["main"]["tokens"] == 48 and set(page["plain"]["ms_per_token"]) == set(PHASES)
    roles = {r: c["policy"] for r, c in page.items()}
    bench = page_race.bench_costs(summary_of(page), roles)
    for role in page:
        assert bench[role]["ms_per_token"] == pytest.approx(page[role]["ms_per_token"])
    same = page_race.compare(page, bench)
    assert same["within"] and same["speedup"]["main"]["ratio"] == pytest.approx(1.0)

    slower = copy.deepcopy(page)
    slower["main"]["ms_per_token"]["target_forward"] *= 1.2       # the main decoder's forward 20% dearer on the page
    c = page_race.compare(slower, bench)
    tf = c["decoders"]["main"]["phases"]["target_forward"]
    assert tf["judged"] and not tf["within"] and tf["ratio"] == pytest.approx(1.2)
    assert c["speedup"]["main"]["page"] < c["speedup"]["main"]["bench"] and not c["within"]

    tiny = copy.deepcopy(page)
    tiny["main"]["ms_per_token"]["policy"] *= 3                   # a phase of a few hundredths of a ms: not judged
    c = page_race.compare(tiny, bench)
    pol = c["decoders"]["main"]["phases"]["policy"]
    assert not pol["judged"] and pol["within"] and c["within"]


def test_the_means_of_runs_are_compared(page_race):
    page = page_race.page_costs(TRACES.load(RACE))
    doubled = copy.deepcopy(page)
    for c in doubled.values():
        c["ms_per_token"] = {p: 2 * v for p, v in c["ms_per_token"].items()}
    mean = page_race.mean_costs([page, doubled])
    for role in page:
        assert mean[role]["ms_per_token"] == pytest.approx({p: 1.5 * v for p, v in page[role]["ms_per_token"].items()})
