"""`python -m eagle2 tau`: tau of the shipped head over a prompt file, per tree shape and category;
every shape's output equals plain greedy decoding; bad --trees is a one-line error."""
import json
from pathlib import Path

import pytest

from eagle2.decoding.decoder import Decoder
from eagle2.errors import UserError
from eagle2.tools.cli import main as cli_main
from eagle2.model.weights import PRESETS, sha256_of
from eagle2.tools.tau import head_digest, parse_trees

PROMPTS = [{"question_id": 1, "category": "math", "turns": ["What is 12 plus 30?"]},
           {"question_id": 2, "category": "writing", "turns": ["Write one line about rain.", "Make it shorter."]}]


@pytest.mark.slow
def test_tau_per_tree_and_category_and_identical_to_plain(tmp_path, real_bundle):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps(r) + "\n" for r in PROMPTS))
    out = tmp_path / "out"
    assert cli_main(["tau", "--prompts", str(prompts), "--trees", "12x3x4,static", "--max-new-tokens", "12",
                     "--threads", "1", "--out", str(out)]) == 0
    s = json.loads((out / "tau.json").read_text())
    assert set(s["trees"]) == {"eagle2 (12,3,4)", "static"} and s["identical"] and s["n_prompts"] == 2
    assert s["head_sha256"] == sha256_of(Path(PRESETS["smollm2-135m"].head) / "model.safetensors")  # the shipped head's
    for r in s["trees"].values():
        assert r["tau"] == r["new_tokens"] / r["target_forwards"] and 1.0 <= r["tau"] <= 4.0
        assert set(r["by_category"]) == {"math", "writing"}
    # the tokens counted are plain greedy decoding's, turn after turn
    msgs, n = [], 0
    for turn in PROMPTS[1]["turns"] + PROMPTS[0]["turns"]:
        if turn == PROMPTS[0]["turns"][0]:
            msgs = []
        msgs.append({"role": "user", "content": turn})
        d = Decoder(real_bundle, "plain", max_new_tokens=12, record=False)
        d.start(messages=msgs)
        d.generate()
        n += len(d.generated)
        msgs.append({"role": "assistant", "content": d.summary()["text"]})
    assert all(r["new_tokens"] == n for r in s["trees"].values())


def test_the_head_digest_is_of_a_local_head_only(tmp_path):
    (tmp_path / "model.safetensors").write_bytes(b"w")
    assert head_digest("smollm2-135m", str(tmp_path)) == sha256_of(tmp_path / "model.safetensors")
    assert head_digest("smollm2-135m", "random") is None and head_digest("some/hub-id", "org/head") is None


def test_trees_parse_and_bad_shapes_are_user_errors(tmp_path, capsys):
    assert [t[0] for t in parse_trees("60x5x10, static")] == ["eagle2 (60,5,10)", "static"]
    assert parse_trees("16x5x10")[0][2] == {"total_tokens": 16, "depth": 5, "top_k": 10}
    for bad in ("60x5", "big", ","):
        with pytest.raises(UserError):
            parse_trees(bad)
    assert cli_main(["tau", "--trees", "60x5", "--out", str(tmp_path / "o")]) == 2
    assert "NxDEPTHxTOPK" in capsys.readouterr().err
