"""scripts/draft_vocab.py: the share of answers a draft vocabulary of N tokens can draft at all
(the N most counted training tokens), and the cost of a draft call with an LM head of N rows."""
from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent


def script():
    spec = importlib.util.spec_from_file_location("draft_vocab", REPO / "scripts" / "draft_vocab.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def test_coverage_counts_the_answers_tokens_inside_the_most_counted():
    dv = script()
    train = [[5, 5, 5, 7, 7, 9], [7, 3]]  # counts: 5 x3, 7 x3, 9 x1, 3 x1 (ties in order of first appearance)
    answers = [[5, 7, 1], [9, 9, 5]]
    cov = dv.coverage([1, 2, 3, 10], train, answers, shipped={5, 1})
    assert cov["train_tokens"] == 8 and cov["train_distinct"] == 4 and cov["answer_tokens"] == 6
    assert cov["sizes"][1] == {"inside": 2 / 6, "counted": 1}   # {5}
    assert cov["sizes"][2] == {"inside": 3 / 6, "counted": 2}   # {5, 7}
    assert cov["sizes"][3] == {"inside": 5 / 6, "counted": 3}   # {5, 7, 9}
    assert cov["sizes"][10] == {"inside": 5 / 6, "counted": 4}  # every counted token; 1 was never seen
    assert cov["shipped"] == {"size": 2, "inside": 3 / 6}


@pytest.mark.real_model
@pytest.mark.slow  # builds the kernels and the real head at three sizes
def test_a_draft_call_is_timed_with_an_lm_head_of_each_size():
    pytest.importorskip("ctypes")
    dv = script()
    from eagle2.model.loading import load_bundle
    if getattr(load_bundle("smollm2-135m", None, "cpu", "q4_1").forward, "lib", None) is None:
        pytest.skip("the q4_1 kernels do not build here")
    res = dv.call_cost([512, 1024], [1, 3], repeats=2)
    assert set(res) == {1, 3} and all(set(row) == {512, 1024} for row in res.values())
    assert all(s > 0 for row in res.values() for s in row.values())
