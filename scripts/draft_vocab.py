"""How large the draft head's vocabulary should be: what share of the target's own answers each
size can draft at all, and what a head call costs with it.

Coverage: the target's greedy answers to the 60 held-out prompts (assets/selfdistill/, the
assistant tokens as the feature stage tokenises them) against the N target tokens counted most
often in the training conversations (prompts and answers, the whole conversation as the feature
stage sees it: hard counts only; the training stage's choose_vocab adds the target's soft counts,
which needs the feature cache), and against the shipped head's own vocabulary.

Cost (--time): one q4_1 draft-head call (`KernelDraft.step`, the LM head in Q4_1 as shipped) on k
tree nodes after a 256-token context, with an LM head of N rows (the shipped head's layer and random
rows: a call's cost does not depend on their values), every size
interleaved repeat by repeat in one process (fair against the machine's drift). A size buys
coverage with a wider LM head, read once per call.

    python scripts/draft_vocab.py --sizes 4096,8192,16384,32768 --time --threads 2 --out F.json
"""
from __future__ import annotations

import argparse
import collections
import json
import lzma
import sys
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from eagle2.model.weights import PRESETS  # noqa: E402
from eagle2_train.data_archive import ARCHIVE  # noqa: E402

HEAD = Path(PRESETS["smollm2-135m"].head)  # the shipped head whose vocabulary and layer are measured


def conversations(split: str) -> list[dict]:
    """The archived self-distilled conversations of one split."""
    text = lzma.decompress((ARCHIVE / f"data_{split}.jsonl.xz").read_bytes()).decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def token_lists(tok, convs: list[dict], answers_only: bool) -> list[list[int]]:
    """Each conversation's tokens as the feature stage tokenises it (only the assistant's, or all)."""
    from eagle2_train.selfdistill import conversation_ids

    out = []
    for c in convs:
        ids, mask = conversation_ids(tok, c["messages"])
        out.append([t for t, m in zip(ids, mask) if m] if answers_only else ids)
    return out


def coverage(sizes: list[int], train: list[list[int]], answers: list[list[int]], shipped: set[int]) -> dict:
    """Each size's share of the answers' tokens inside the N tokens counted most often in `train`
    (ties in order of first appearance; past the distinct tokens counted, a size adds nothing), and
    the shipped vocabulary's share."""
    counts = collections.Counter(t for ids in train for t in ids)
    ranked = [t for t, _ in counts.most_common()]
    flat = [t for ids in answers for t in ids]
    out = {"train_tokens": sum(map(len, train)), "train_distinct": len(counts), "answer_tokens": len(flat),
           "sizes": {}}
    for n in sizes:
        keep = set(ranked[:n])
        out["sizes"][n] = {"inside": sum(t in keep for t in flat) / len(flat), "counted": len(keep)}
    out["shipped"] = {"size": len(shipped), "inside": sum(t in shipped for t in flat) / len(flat)}
    return out


def measured_coverage(sizes: list[int]) -> dict:
    """coverage() on the archived conversations and the shipped head."""
    from transformers import AutoTokenizer

    from eagle2.model.loading import load_draft_head, target_args
    from eagle2.model.weights import resolve_target

    folder = resolve_target("smollm2-135m")
    tok = AutoTokenizer.from_pretrained(str(folder))
    head, _ = load_draft_head(HEAD, target_args(folder))
    return coverage(sizes, token_lists(tok, conversations("train"), False),
                    token_lists(tok, conversations("heldout"), True), set(head.draft_ids.tolist()))


def call_cost(sizes: list[int], nodes: list[int], repeats: int) -> dict:
    """Median seconds of one q4_1 draft call on k nodes with an LM head of each size."""
    from eagle2 import config
    from eagle2.model.head3 import Eagle3Head
    from eagle2.model.loading import load_bundle, load_draft_head
    from eagle2.model.quantized import KernelDraft
    from eagle2.model.stopwatch import interleaved_medians

    b = load_bundle("smollm2-135m", None, "cpu", "q4_1")
    if getattr(b.forward, "lib", None) is None:
        raise SystemExit("the q4_1 kernels do not run here: no draft call to time")
    shipped, _ = load_draft_head(HEAD, b.args)
    a = b.args
    g = torch.Generator().manual_seed(0)
    drafts = {}
    for n in sizes:
        head = Eagle3Head(a, shipped.aux_layers, fc_bias=shipped.fc_bias, draft_vocab=torch.arange(n),
                          norm_before_residual=shipped.midlayer.norm_before_residual)
        head.load_state_dict(shipped.state_dict())
        rows = torch.empty(n, a.dim).normal_(0, 0.02, generator=g)  # a call's cost does not depend on them
        head.attach(rows, rows)
        head.has_embed = getattr(shipped, "has_embed", False)  # the target's embedding unless it has its own
        drafts[n] = KernelDraft(head, b.forward, config.current().head_blocks)
    context, tree = 256, 20
    out = {}
    for k in nodes:
        feats = torch.randn(k, a.dim, generator=g)
        toks = torch.randint(0, a.vocab_size, (k,), generator=g)
        pos = torch.full((k,), context + 2)
        mask = torch.cat([torch.rand(k, tree, generator=g) < 0.2, torch.eye(k, dtype=torch.bool)], 1)
        caches = {}
        for n, d in drafts.items():
            caches[n] = d.new_cache(context + tree + k + 1)
            caches[n].length = context
        current = {}
        variants = {n: (lambda n=n: current.update(n=n)) for n in sizes}  # the size the next repeat calls
        med = interleaved_medians(variants, lambda: drafts[current["n"]].step(
            caches[current["n"]], feats, toks, pos, context + tree, mask, 10), repeats)
        out[k] = dict(med)
    return out


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sizes", default="4096,8192,16384,32768", help="draft vocabulary sizes, comma-separated")
    ap.add_argument("--time", action="store_true", help="also time a draft call at each size")
    ap.add_argument("--nodes", default="1,4,10", help="tree nodes a timed call drafts, comma-separated")
    ap.add_argument("--repeats", type=int, default=41)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--out", type=Path, help="write the figures as JSON here")
    a = ap.parse_args(argv)
    torch.set_num_threads(a.threads)
    sizes = [int(x) for x in a.sizes.split(",")]
    from eagle2.tools.bench import machine
    res = {"command": "python scripts/draft_vocab.py " + " ".join(argv if argv is not None else sys.argv[1:]),
           "machine": machine(), "threads": a.threads, "coverage": measured_coverage(sizes)}
    cov = res["coverage"]
    print(f"held-out answers: {cov['answer_tokens']:,} tokens; training conversations: "
          f"{cov['train_tokens']:,} tokens, {cov['train_distinct']:,} distinct")
    print(f"the shipped head's {cov['shipped']['size']:,} tokens hold {100 * cov['shipped']['inside']:.1f}%")
    for n, r in cov["sizes"].items():
        print(f"top {n:>6,} by training counts ({r['counted']:,} counted) hold {100 * r['inside']:.1f}%")
    if a.time:
        res["call_s"] = call_cost(sizes, [int(x) for x in a.nodes.split(",")], a.repeats)
        for k, row in res["call_s"].items():
            print(f"a draft call on {k} node(s), ms: " + "  ".join(f"{n}: {1e3 * s:.3f}" for n, s in row.items()))
    if a.out:
        a.out.parent.mkdir(parents=True, exist_ok=True)
        a.out.write_text(json.dumps(res, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
