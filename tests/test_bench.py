"""The benchmark CLI end to end on the real default model (tiny run): summary, CSV and the report viz renders,
speedups relative to plain from the same run, greedy identity re-checked, clear input errors."""
import csv
import json

import pytest

from eagle2.tools.bench import Row
from eagle2.tools.cli import main as cli_main
from viz.report import main as report_main


def write_prompts(path, rows):
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


@pytest.mark.slow
@pytest.mark.real_model
def test_bench_writes_summary_csv_and_report(tmp_path):
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, [
        {"question_id": 1, "category": "math", "turns": ["What is 12 plus 30?"]},
        {"question_id": 2, "category": "writing", "turns": ["Write one line about rain.", "Make it shorter."]},
    ])
    out = tmp_path / "out"
    rc = cli_main(["bench", "--prompts", str(prompts), "--policies", "static,eagle2", "--max-new-tokens", "12",
                   "--total-tokens", "8", "--depth", "3", "--top-k", "4", "--sweep", "--sweep-total-tokens", "4",
                   "--sweep-depth", "2", "--sweep-top-k", "2", "--out", str(out)])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert set(s["policies"]) == {"plain", "static", "eagle2", "eagle2[N=4,d=2,k=2]"}
    for name, p in s["policies"].items():
        assert {"tau", "tokens_per_s", "speedup", "new_tokens", "target_forwards"} <= set(p)
        assert p["identical_to_plain"] == 1.0, name          # greedy: lossless
        assert p["tau"] == p["new_tokens"] / p["target_forwards"]
    assert s["policies"]["plain"]["speedup"] == 1.0 and s["policies"]["plain"]["tau"] == 1.0
    assert set(s["by_category"]) == {"math", "writing"} and s["device"].startswith("cpu")
    assert set(s["spread"]) == set(s["policies"]) - {"plain"}   # every row but the reference, prompt by prompt
    for sp in s["spread"].values():
        assert sp["prompts"] == 2 and set(sp["by_category"]) == {"math", "writing"}
        assert sp["slowest"]["speedup"] <= sp["median"] <= sp["fastest"]["speedup"]
        assert {sp["slowest"]["question_id"], sp["fastest"]["question_id"]} <= {1, 2}
    rows = list(csv.DictReader(open(out / "per_prompt.csv")))
    assert len(rows) == 2 * 4 and {r["policy"] for r in rows} == set(s["policies"])
    assert not (out / "report.html").exists()  # the engine writes numbers only
    assert report_main([str(out)]) == 0
    html = (out / "report.html").read_text()
    assert "Speedup over plain" in html and "top_k = 2" in html


def test_bench_rows_parse_once_and_keep_their_names():
    """--policies entries become typed rows; each row's label is the name the output has always used."""
    for entry, row in [("plain", Row("plain")), ("eagle2-auto", Row("eagle2-auto")), ("hf-pld", Row("hf-pld"))]:
        assert Row.parse(entry) == row and row.label == entry
    assert Row("hf-pld").baseline and not Row("eagle2").baseline
    assert Row("eagle2", sweep=(8, 3, 4)).label == "eagle2[N=8,d=3,k=4]"


def test_bench_rejects_a_malformed_prompt_file(tmp_path, capsys):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question_id": 1, "turns": "not a list"}\n')
    assert cli_main(["bench", "--prompts", str(bad), "--out", str(tmp_path / "o")]) == 2
    err = capsys.readouterr().err
    assert "line 1" in err and "turns" in err and "Traceback" not in err


@pytest.mark.slow
@pytest.mark.real_model
def test_bench_auto_budget_rows(tmp_path, capsys):
    """The auto budget: eagle2-auto chooses N and depth per cycle, eagle2-auto-n only N; both lossless."""
    prompts = tmp_path / "p.jsonl"
    write_prompts(prompts, [{"question_id": 1, "category": "writing", "turns": ["Write one line about rain."]}])
    out = tmp_path / "out"
    rc = cli_main(["bench", "--prompts", str(prompts), "--policies", "eagle2-auto,eagle2-auto-n", "--max-new-tokens",
                   "16", "--out", str(out)])
    assert rc == 0
    s = json.loads((out / "summary.json").read_text())
    assert set(s["policies"]) == {"plain", "eagle2-auto", "eagle2-auto-n"}
    assert all(p["identical_to_plain"] == 1.0 for p in s["policies"].values())
    assert s["verify_profile_s"] and s["dtype"] == "q4_1" and s["forward"].startswith("q4_1 forward")  # the default
    for name in ("eagle2-auto", "eagle2-auto-n"):  # what the budget chose, and where the time went
        p = s["policies"][name]
        assert sum(p["auto_n"].values()) == p["target_forwards"] - 1  # every cycle after the prefill
        hist = {int(n): c for n, c in p["auto_n"].items()}
        assert p["auto_mean_n"] == pytest.approx(sum(n * c for n, c in hist.items()) / sum(hist.values()))
        assert min(hist) >= 1
        # the shares and per-cycle costs are the per-prompt rows' seconds, summed and divided
        rows = [r for r in csv.DictReader(open(out / "per_prompt.csv")) if r["policy"] == name]
        draft, verify, wall = (sum(float(r[k]) for r in rows) for k in ("draft_s", "verify_s", "wall_s"))
        assert p["draft_share"] == pytest.approx(draft / wall)
        assert p["draft_ms_per_cycle"] == pytest.approx(1000 * draft / p["target_forwards"])
        assert p["verify_ms_per_cycle"] == pytest.approx(1000 * verify / p["target_forwards"])
        assert sum(p["phase_ms_per_cycle"].values()) * p["target_forwards"] / 1000 == pytest.approx(wall)
    assert "draft_share" not in s["policies"]["plain"]
    assert s["policies"]["eagle2-auto-n"]["auto_levels"] == {"5": s["policies"]["eagle2-auto-n"]["target_forwards"] - 1}
    # capped by --total-tokens: N never exceeds the cap
    out2 = tmp_path / "out2"
    assert cli_main(["bench", "--prompts", str(prompts), "--policies", "eagle2-auto", "--max-new-tokens", "16",
                     "--total-tokens", "12", "--out", str(out2)]) == 0
    s2 = json.loads((out2 / "summary.json").read_text())
    assert s2["policies"]["eagle2-auto"]["identical_to_plain"] == 1.0 and s2["verify_profile_s"]
    assert max(map(int, s2["policies"]["eagle2-auto"]["auto_n"])) <= 12
    rc = cli_main(["bench", "--prompts", str(prompts), "--policies", "eagle2,no-such-policy", "--out", str(out)])
    assert rc == 2 and "Unknown policy 'no-such-policy'" in capsys.readouterr().err


def test_bench_spread_names_the_slowest_and_fastest_prompt_and_each_category():
    """A figure over many prompts comes with the prompts behind it: each prompt's speedup over plain on
    that prompt, the slowest and fastest named, the median, and each category's own speedup."""
    from eagle2.tools.bench import summarise

    def row(pol, qid, cat, tokens, wall, fwds):
        return {"policy": pol, "question_id": qid, "category": cat, "new_tokens": tokens, "wall_s": wall,
                "target_forwards": fwds}
    rows = [row("plain", 1, "code", 100, 1.0, 100), row("auto", 1, "code", 100, 0.5, 40),     # 2.0x
            row("plain", 2, "code", 100, 1.0, 100), row("auto", 2, "code", 100, 1.0, 60),     # 1.0x
            row("plain", 3, "chat", 50, 0.5, 50), row("auto", 3, "chat", 50, 0.625, 45)]      # 0.8x
    s = summarise(rows, ["plain", "auto"], greedy=False)["spread"]
    assert set(s) == {"auto"}  # plain is the reference, not a row of the spread
    a = s["auto"]
    assert a["prompts"] == 3
    assert (a["slowest"]["question_id"], a["slowest"]["category"]) == (3, "chat")
    assert a["slowest"]["speedup"] == pytest.approx(0.8) and a["slowest"]["tau"] == pytest.approx(50 / 45)
    assert (a["fastest"]["question_id"], a["fastest"]["speedup"]) == (1, pytest.approx(2.0))
    assert a["median"] == pytest.approx(1.0)
    # a category's speedup is its tokens over its time, not a mean of its prompts' ratios
    assert a["by_category"] == {"chat": pytest.approx(0.8), "code": pytest.approx(200 / 1.5 / 200 * 2.0)}
    assert (a["category_min"], a["category_max"]) == (pytest.approx(0.8), pytest.approx(200 / 1.5 / 100))


def test_bench_judges_every_held_out_prompt_by_default():
    from eagle2.tools.bench import build_parser
    from eagle2.tools.prompt_files import HELDOUT, read_prompts
    a = build_parser().parse_args(["--out", "x"])
    assert a.prompts == str(HELDOUT) and a.limit == 0 and len(read_prompts(HELDOUT)) == 60
