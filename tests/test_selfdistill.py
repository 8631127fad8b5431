"""Batched self-distillation decoding equals one-sequence greedy decoding row by row, including
rows that finish early and are dropped from the batch (the compaction path)."""
import torch

from eagle2.model.loading import load_target
from eagle2.cycle.sampling import SamplingParams
from eagle2_train.selfdistill import batched_generate


def greedy_one(model, ids, n, eos):
    out, seq = [], list(ids)
    for _ in range(n):
        with torch.no_grad():
            f = model.forward_full(torch.tensor([seq]))[0, -1]
        t = int(model.logits(f).argmax())
        out.append(t)
        seq.append(t)
        if t in eos:
            break
    return out


def test_batched_generate_matches_single_sequence_greedy(tiny_target):
    folder, _ = tiny_target()
    model = load_target(folder, torch.device("cpu"), torch.float32)
    g = torch.Generator().manual_seed(3)
    seqs = [torch.randint(0, 97, (n,), generator=g).tolist() for n in (3, 9, 5, 12, 7, 4, 10, 6)]
    ref_free = [greedy_one(model, s, 20, set()) for s in seqs]
    # make the tokens some rows emit early count as EOS, so rows finish at different steps
    eos = {ref_free[0][2], ref_free[3][5]}
    ref = [greedy_one(model, s, 20, eos) for s in seqs]
    assert len({len(r) for r in ref}) > 1, "the test needs rows that finish at different steps"
    got = batched_generate(model, seqs, 20, SamplingParams(temperature=0.0), None, eos)
    assert got == ref
    assert sum(len(r) < 20 for r in ref) >= 2  # >= a quarter of the batch finished early: rows were dropped
    # the data stage runs on prepacked weights (pack_linears): the same tokens
    from eagle2.model.llama import pack_linears
    pack_linears(model)
    assert model.lm_head.packed is not None
    assert batched_generate(model, seqs, 20, SamplingParams(temperature=0.0), None, eos) == ref


def test_a_data_file_cut_mid_line_resumes(tiny_target, tmp_path):
    """A run killed while appending a batch leaves a partial last line: the resumed data stage
    drops it and answers that prompt again, so the file ends with whole lines, one per prompt."""
    import json
    from transformers import AutoTokenizer
    from eagle2_train.selfdistill import generate_data
    folder, _ = tiny_target()
    model = load_target(folder, torch.device("cpu"), torch.float32)
    tok = AutoTokenizer.from_pretrained(str(folder))
    tok.chat_template = "{% for m in messages %}{{ m['content'] }} {% endfor %}"
    prompts = [{"question_id": i, "turns": [f"w{i} w{i + 1} w{i + 2}"]} for i in range(1, 5)]
    greedy = [{"name": "greedy", "temperature": 0.0}]
    whole, cut = tmp_path / "whole.jsonl", tmp_path / "cut.jsonl"
    generate_data(model, tok, prompts, whole, greedy, 6, 4)
    lines = whole.read_text().splitlines(keepends=True)
    cut.write_text("".join(lines[:2]) + lines[2][: len(lines[2]) // 2])  # killed inside the third line
    rate = generate_data(model, tok, prompts, cut, greedy, 6, 4)
    assert rate["tokens"] > 0  # the two prompts not whole were answered again
    got = [json.loads(ln) for ln in cut.read_text().splitlines()]
    assert sorted(r["id"] for r in got) == [1, 2, 3, 4]
    assert sorted(got, key=lambda r: r["id"]) == sorted(map(json.loads, lines), key=lambda r: r["id"])
