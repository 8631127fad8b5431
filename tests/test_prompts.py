"""The seed prompt sets: enough, varied, held-out split disjoint from training, the templated
file exactly what its generator writes, and bench --limit spreading over categories."""
import json
from pathlib import Path

import pytest

from eagle2.tools.bench import spread_over_categories
from scripts.prompt_templates import CATEGORIES as CATEGORY_LIST
from scripts.prompt_templates import main as templates_main
from eagle2.tools.prompt_files import read_prompts

P = Path(__file__).resolve().parent.parent / "assets" / "prompts"
CATEGORIES = set(CATEGORY_LIST)


def test_seed_sets_are_varied_and_the_heldout_split_is_disjoint():
    hand, templ, templ2, held = (read_prompts(P / f) for f in ("train.jsonl", "train_templated.jsonl",
                                                               "train_templated2.jsonl", "heldout.jsonl"))
    assert len(hand) >= 300 and len(templ) >= 1000 and len(templ2) >= 800
    for rows in (hand, templ, templ2, held):
        assert {q["category"] for q in rows} == CATEGORIES
    assert any(len(q["turns"]) > 1 for q in hand) and any(len(q["turns"]) > 1 for q in templ)
    train = hand + templ + templ2
    assert len({q["turns"][0] for q in train}) == len(train)  # no prompt repeated across the files
    assert len({q["question_id"] for q in train}) == len(train)
    assert not {q["question_id"] for q in train} & {q["question_id"] for q in held}
    assert not {q["turns"][0] for q in train} & {q["turns"][0] for q in held}


def test_templated_file_is_reproducible_from_its_generator(tmp_path):
    out = tmp_path / "t.jsonl"
    assert templates_main(["--n", "1200", "--out", str(out),
                           "--exclude", f"{P / 'heldout.jsonl'},{P / 'train.jsonl'}"]) == 0
    assert out.read_text() == (P / "train_templated.jsonl").read_text()
    out2 = tmp_path / "t2.jsonl"  # the second set: another seed and id range, excluding the first
    assert templates_main(["--n", "800", "--seed", "1", "--first-id", "20001", "--out", str(out2), "--exclude",
                           f"{P / 'heldout.jsonl'},{P / 'train.jsonl'},{P / 'train_templated.jsonl'}"]) == 0
    assert out2.read_text() == (P / "train_templated2.jsonl").read_text()


def test_bench_limit_spreads_over_categories():
    held = read_prompts(P / "heldout.jsonl")
    picked = spread_over_categories(held, 11)
    assert {q["category"] for q in picked} == CATEGORIES
    assert len(spread_over_categories(held, 100)) == len(held)
    assert spread_over_categories(held, 3) == picked[:3]


@pytest.mark.real_model  # the train CLI resolves the default target (fetching it if missing) before it reads the prompts
def test_train_cli_rejects_prompt_files_sharing_ids(tmp_path, capsys):
    from eagle2_train.cli import main as cli_main
    f = P / "train.jsonl"
    rc = cli_main(["train", "--out", str(tmp_path / "run"), "--prompts", f"{f},{f}", "--stages", "data"])
    assert rc != 0
    assert "share a question_id" in capsys.readouterr().err
