"""Training data for a draft head, by self-distillation (docs/algorithms.md §1).

Stage `data`: the target answers the seed prompts itself (greedy and sampled; batched through
transformers' generate), so the head learns the target's own distribution. Stage `features`:
the target's post-norm features of every conversation, computed once with our model code and
stored in fp16. Both stages append to their outputs and skip finished work, so they resume.
"""
from __future__ import annotations

import json
import time
import zlib
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import save_file
from tqdm import tqdm

from eagle2.errors import UserError
from eagle2.files import atomic_write
from eagle2.model.chat import chat_ids


@torch.no_grad()
def batched_generate(model, seqs: list[list[int]], max_new: int, sp, gen, eos: set[int]) -> list[list[int]]:
    """Plain decoding of many prompts at once with our model code (left-padded rows, per-row
    positions and key masks): one weight read serves the whole batch, which is what makes
    self-distillation affordable on a CPU."""
    from eagle2.cycle.sampling import probs_from_logits

    dev = model.lm_head.weight.device
    B, P = len(seqs), max(len(s) for s in seqs)
    cache = model.new_cache(P + max_new, batch=B)
    pad = torch.tensor([P - len(s) for s in seqs], device=dev)
    tokens = torch.zeros(B, P, dtype=torch.long, device=dev)
    for i, s in enumerate(seqs):
        tokens[i, P - len(s):] = torch.tensor(s)
    cols = torch.arange(P + max_new, device=dev)
    valid = cols[None, :] >= pad[:, None]                          # [B, S] real (non-pad) slots
    pos = (torch.arange(P, device=dev)[None, :] - pad[:, None]).clamp(min=0)
    mask = valid[:, None, None, :P] & (cols[None, None, :P, None] >= cols[None, None, None, :P])
    x = model.forward_batch(cache, tokens, pos, mask)[:, -1]
    cache.advance(P)
    out = [[] for _ in range(B)]
    rows = torch.arange(B, device=dev)  # batch row -> prompt index (rows are dropped as they finish)
    alive = torch.ones(B, dtype=torch.bool, device=dev)
    for step in range(max_new):
        logits = model.logits(x)
        if sp.greedy:
            nxt = logits.argmax(-1)
        else:
            probs = probs_from_logits(logits, sp)
            if gen is not None and probs.device != gen.device:
                probs = probs.to(gen.device)
            nxt = torch.multinomial(probs, 1, generator=gen).squeeze(1).to(dev)
        for i in alive.nonzero().flatten().tolist():
            t = int(nxt[i])
            out[int(rows[i])].append(t)
            if t in eos:
                alive[i] = False
        if not alive.any() or step == max_new - 1:
            break
        if int(alive.sum()) <= 0.75 * alive.numel():
            # finished rows would still cost a full forward each step (and their growing K/V
            # reads): drop them from the batch once a quarter of it is done
            keep = alive.nonzero().flatten()
            cache.k, cache.v = cache.k[:, keep], cache.v[:, keep]
            valid, pos, rows, nxt = valid[keep], pos[keep], rows[keep], nxt[keep]
            alive = alive[keep]
        L = cache.length
        m = valid[:, None, None, : L + 1]
        x = model.forward_batch(cache, nxt[:, None], (pos[:, -1:] + step + 1), m)[:, -1]
        cache.advance(1)
    return out


def drop_partial_line(path: Path) -> None:
    """Cut a jsonl file back to its last whole line: a run killed while appending a batch leaves a
    partial one, which the resumed run then writes again."""
    with open(path, "rb+") as f:
        data = f.read()
        keep = data.rfind(b"\n") + 1
        if keep < len(data):
            f.truncate(keep)


def generate_data(model, tok, prompts: list[dict], out: Path, variants: list[dict],
                  max_new_tokens: int, batch_size: int) -> dict:
    """Append {'id', 'variant', 'messages'} conversations to out (jsonl); skip those present.
    Jobs run sorted by prompt length within each variant, so a batch's rows need little left
    padding. Returns the rate: {'tokens': generated, 'seconds', 'tokens_per_s'}."""
    from eagle2.cycle.sampling import SamplingParams

    done = set()
    if out.exists():
        drop_partial_line(out)
        for line in out.read_text().splitlines():
            r = json.loads(line)
            done.add((r["id"], r["variant"]))
    eos = set(model.args.eos_ids) | ({tok.eos_token_id} if tok.eos_token_id is not None else set())
    first_len = {q["question_id"]: len(chat_ids(tok, [{"role": "user", "content": q["turns"][0]}])) for q in prompts}
    jobs = [(q, v) for v in variants
            for q in sorted(prompts, key=lambda q: (len(q["turns"]), first_len[q["question_id"]]))
            if (q["question_id"], v["name"]) not in done]
    n_tokens, t0 = 0, time.perf_counter()
    bar = tqdm(total=len(jobs), desc="self-distillation", unit="conv")
    with open(out, "a") as fout:
        for i in range(0, len(jobs), batch_size):
            chunk = jobs[i:i + batch_size]
            convs = [[] for _ in chunk]
            for t in range(max(len(q["turns"]) for q, _ in chunk)):
                live = [j for j, (q, _) in enumerate(chunk) if t < len(q["turns"])]
                for j in live:
                    convs[j].append({"role": "user", "content": chunk[j][0]["turns"][t]})
                seqs = []
                for j in live:
                    seqs.append(chat_ids(tok, convs[j]))
                v = chunk[live[0]][1]  # jobs are grouped by variant; a chunk may straddle two
                by_var: dict[str, list[int]] = {}
                for j in live:
                    by_var.setdefault(chunk[j][1]["name"], []).append(j)
                for name, js in by_var.items():
                    v = next(chunk[j][1] for j in js)
                    sp = SamplingParams(temperature=v.get("temperature", 0.0), top_p=v.get("top_p", 1.0))
                    # a stable seed (Python's hash() of a str is salted per process)
                    gen = torch.Generator().manual_seed(zlib.crc32(f"{name}|{i}|{t}".encode()))
                    outs = batched_generate(model, [seqs[live.index(j)] for j in js], max_new_tokens,
                                            sp, gen, eos)
                    n_tokens += sum(map(len, outs))
                    for j, o in zip(js, outs):
                        convs[j].append({"role": "assistant", "content": tok.decode(o, skip_special_tokens=True)})
            fout.write("".join(json.dumps({"id": q["question_id"], "variant": v["name"], "messages": conv}) + "\n"
                               for (q, v), conv in zip(chunk, convs)))
            fout.flush()
            bar.update(len(chunk))
    bar.close()
    dt = time.perf_counter() - t0
    return {"tokens": n_tokens, "seconds": dt, "tokens_per_s": n_tokens / dt if dt > 0 else 0.0}


def conversation_ids(tok, messages: list[dict]) -> tuple[list[int], list[int]]:
    """Token ids of a whole conversation and a 0/1 mask marking assistant tokens (the loss)."""
    ids: list[int] = []
    mask: list[int] = []
    for k in range(len(messages)):
        upto = chat_ids(tok, messages[: k + 1], add_generation_prompt=False)
        new = upto[len(ids):]
        mask += [1 if messages[k]["role"] == "assistant" else 0] * len(new)
        ids = upto
    return ids, mask


def extract_features(model, tok, data_path: Path, out_dir: Path, max_len: int, shard_tokens: int = 200_000) -> None:
    """Run the target over every conversation; save fp16 features + ids + loss masks in shards.
    With `model.aux_layers` set (an EAGLE-3 cache) also the hidden states entering those layers,
    side by side [T, k*dim] (`aux`); index.json records the layers, and resuming checks them."""
    out_dir.mkdir(parents=True, exist_ok=True)
    drop_partial_line(data_path)
    rows = [json.loads(l) for l in data_path.read_text().splitlines() if l.strip()]
    index_path = out_dir / "index.json"
    layers = list(model.aux_layers)
    index = json.loads(index_path.read_text()) if index_path.exists() else {"done": [], "shards": [],
                                                                          "aux_layers": layers}
    if index.get("aux_layers", []) != layers:
        raise UserError(f"The feature cache in {out_dir} holds the target layers {index.get('aux_layers', [])}, "
                        f"not {layers}: use another --out or the same --aux-layers.")
    done = set(map(tuple, index["done"]))
    todo = [r for r in rows if (r["id"], r["variant"]) not in done]
    buf = {"ids": [], "mask": [], "feat": [], "aux": [], "keys": []}
    dev = model.lm_head.weight.device

    def flush():
        if not buf["ids"]:
            return
        n = len(index["shards"])
        lens = torch.tensor([len(x) for x in buf["ids"]])
        tensors = {"ids": torch.cat([torch.tensor(x) for x in buf["ids"]]),
                   "mask": torch.cat([torch.tensor(x, dtype=torch.uint8) for x in buf["mask"]]),
                   "feat": torch.cat(buf["feat"]), "lens": lens}
        if layers:
            tensors["aux"] = torch.cat(buf["aux"])
        save_file(tensors, str(out_dir / f"shard{n:03d}.safetensors"))
        index["shards"].append(f"shard{n:03d}.safetensors")
        index["done"] += buf["keys"]
        atomic_write(index_path, json.dumps(index))  # a kill mid-write keeps the previous index
        for v in buf.values():
            v.clear()

    for r in tqdm(todo, desc="features", unit="conv"):
        ids, mask = conversation_ids(tok, r["messages"])
        ids, mask = ids[:max_len], mask[:max_len]
        aux = [] if layers else None
        with torch.no_grad():
            f = model.forward_full(torch.tensor([ids], device=dev), aux)[0]
        buf["ids"].append(ids)
        buf["mask"].append(mask)
        buf["feat"].append(f.half().cpu())
        if layers:
            # residual-stream states carry a few huge "attention sink" channels (~2e4 in SmolLM2):
            # clamp to fp16's range rather than store inf
            buf["aux"].append(torch.cat(aux, dim=-1)[0].clamp(-65504, 65504).half().cpu())
        buf["keys"].append([r["id"], r["variant"]])
        if sum(len(x) for x in buf["ids"]) >= shard_tokens:
            flush()
    flush()


def load_features(feat_dir: Path, aux: bool = True) -> list[dict]:
    """All conversations of a feature cache: [{'ids','mask','feat'}, plus 'aux' in an EAGLE-3
    cache unless aux=False] (tensors stay fp16)."""
    index = json.loads((feat_dir / "index.json").read_text())
    convs = []
    keys = iter(index["done"])
    for name in index["shards"]:
        with safe_open(str(feat_dir / name), "pt") as f:
            s = {k: f.get_tensor(k) for k in f.keys() if aux or k != "aux"}
        off = 0
        for n in s["lens"].tolist():
            c = {"ids": s["ids"][off:off + n], "mask": s["mask"][off:off + n],
                 "feat": s["feat"][off:off + n], "key": next(keys)}
            if "aux" in s:
                c["aux"] = s["aux"][off:off + n]
            convs.append(c)
            off += n
    return convs
