"""The self-distilled answers kept in the repository: a round trip through the xz archive restores
exactly the missing conversations, packing the same answers twice gives the same bytes, and a
corrupt archive is refused with a clear message before anything is written."""
from __future__ import annotations

import json

import pytest

from eagle2.errors import UserError
from eagle2_train.data_archive import main, restore, save


def _write(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def _rows(n, variant="greedy"):
    return [{"id": i, "variant": variant, "messages": [{"role": "user", "content": f"q{i}"},
                                                       {"role": "assistant", "content": f"a{i}"}]}
            for i in range(n)]


def test_round_trip_restores_only_what_is_missing(tmp_path):
    run, archive = tmp_path / "run", tmp_path / "archive"
    run.mkdir()
    _write(run / "data_train.jsonl", _rows(5))
    _write(run / "data_heldout.jsonl", _rows(2))
    (run / "data_rate.jsonl").write_text(json.dumps({"split": "train", "tokens": 10}) + "\n")
    m = save(run, archive)
    assert m["splits"]["train"]["lines"] == 5 and m["splits"]["heldout"]["lines"] == 2
    assert m["produced_by"]["rates"] == [{"split": "train", "tokens": 10}] and m["produced_by"]["machine"]["cpu"]
    first = (archive / "data_train.jsonl.xz").read_bytes()
    assert save(run, archive) and (archive / "data_train.jsonl.xz").read_bytes() == first  # deterministic

    wiped = tmp_path / "wiped"  # a wiped cache: everything comes back, byte for byte
    assert restore(wiped, archive) == {"train": 5, "heldout": 2}
    assert (wiped / "data_train.jsonl").read_text() == (run / "data_train.jsonl").read_text()

    part = tmp_path / "part"  # a partial run with a cut last line: only the missing rows are appended
    part.mkdir()
    text = "".join(json.dumps(r) + "\n" for r in _rows(2)) + '{"id": 2, "vari'
    (part / "data_train.jsonl").write_text(text)
    assert restore(part, archive)["train"] == 3
    got = [json.loads(l) for l in (part / "data_train.jsonl").read_text().splitlines()]
    assert [r["id"] for r in got] == [0, 1, 2, 3, 4]
    assert restore(part, archive)["train"] == 0  # idempotent


def test_a_corrupt_archive_is_refused(tmp_path, capsys):
    run, archive = tmp_path / "run", tmp_path / "archive"
    run.mkdir()
    _write(run / "data_train.jsonl", _rows(3))
    save(run, archive)
    m = json.loads((archive / "manifest.json").read_text())
    m["splits"]["train"]["sha256"] = "0" * 64
    (archive / "manifest.json").write_text(json.dumps(m))
    with pytest.raises(UserError, match="sha256"):
        restore(tmp_path / "new", archive)
    assert not (tmp_path / "new" / "data_train.jsonl").exists()
    (archive / "data_train.jsonl.xz").write_bytes(b"not xz")
    assert main(["restore", "--run", str(tmp_path / "new"), "--archive", str(archive)]) == 1
    assert "cannot be read" in capsys.readouterr().err
    assert restore(tmp_path / "none", tmp_path / "no-archive") == {}  # no archive: nothing to do
