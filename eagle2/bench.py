"""`python -m eagle2 bench`: Spec-Bench-style comparison of decoders, measured side by side.

Every prompt runs every policy in one process, interleaved (fair against machine drift), after a
warm-up. Speedup = tokens/s over `plain` (same model code) in the same run; tau = generated tokens
per target forward. Writes DIR/summary.json, DIR/per_prompt.csv and DIR/report.html.
External baselines: `hf` (transformers' generate, greedy, same weights) and `hf-pld` (its
prompt-lookup decoding).
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import platform
import time
from collections import Counter, defaultdict
from pathlib import Path

import torch
from tqdm import tqdm

from .cli import add_sampling_args
from .decoder import Decoder
from .errors import UserError, check
from .loading import load_bundle
from .sampling import SamplingParams
from .selfdistill import read_prompts



def spread_over_categories(prompts: list[dict], k: int) -> list[dict]:
    """The first k prompts of a round-robin over categories: prompt files are often grouped by
    category, and the first k of those would measure one kind of text only."""
    by_cat: dict[str, list[dict]] = {}
    for q in prompts:
        by_cat.setdefault(q["category"], []).append(q)
    out, r = [], 0
    while len(out) < min(k, len(prompts)):
        for qs in by_cat.values():
            if r < len(qs) and len(out) < k:
                out.append(qs[r])
        r += 1
    return out

def build_parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(prog="python -m eagle2 bench", description=__doc__)
    ap.add_argument("--prompts", required=True, help="MT-bench format jsonl (question_id, category, turns)")
    ap.add_argument("--policies", default="plain,static,eagle2",
                    help="comma list: plain, static, eagle2, eagle2-auto (the auto budget; --total-tokens "
                         "and --depth cap it), ddd, dyspec, lantern, hf, hf-pld; with "
                         "--total-tokens auto, eagle2 chooses N and depth per cycle and eagle2-auto-n only N")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--limit", type=int, default=0, help="K prompts spread over the categories (round-robin, file order within each)")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--total-tokens", default=None, help="an integer, or 'auto' (hardware-aware budget)")
    ap.add_argument("--depth", type=int, default=None)
    ap.add_argument("--top-k", type=int, default=None)
    ap.add_argument("--sweep", action="store_true", help="grid over N x depth x top_k for eagle2")
    ap.add_argument("--sweep-total-tokens", default="8,16,24,32,48,60")
    ap.add_argument("--sweep-depth", default="3,5,7")
    ap.add_argument("--sweep-top-k", default="4,8,10")
    ap.add_argument("--target", default="smollm2-135m")
    ap.add_argument("--head", default=None)
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--dtype", default=None)
    ap.add_argument("--threads", type=int, default=0)
    ap.add_argument("--no-pack", action="store_true", help="plain matmuls, without the prepacked CPU weights")
    add_sampling_args(ap)
    return ap


class HFBaseline:
    """transformers' own generate on the same weights (greedy), optionally prompt lookup."""

    def __init__(self, bundle, folder, lookup: bool):
        from transformers import AutoModelForCausalLM
        self.name = "hf-pld" if lookup else "hf"
        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=bundle.dtype).to(bundle.device).eval()
        self.lookup = lookup
        self.bundle = bundle
        self.calls = 0
        self.model.register_forward_pre_hook(lambda *a: self._count())

    def _count(self):
        self.calls += 1

    def run(self, ids, max_new, eos) -> dict:
        dev = self.bundle.device
        x = torch.tensor([ids], device=dev)
        kw = dict(max_new_tokens=max_new, do_sample=False, pad_token_id=self.bundle.tokenizer.eos_token_id)
        if self.lookup:
            kw["prompt_lookup_num_tokens"] = 10
        self.calls = 0
        _sync(dev)
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(x, attention_mask=torch.ones_like(x), **kw)
        _sync(dev)
        wall = time.perf_counter() - t0
        new = out[0, len(ids):].tolist()
        return {"token_ids": new, "new_tokens": len(new), "target_forwards": self.calls, "wall_s": wall}


def _sync(dev):
    if dev.type == "cuda":
        torch.cuda.synchronize(dev)


def make_decoder(bundle, name, sp, max_new, tree_kw, profile):
    if name == "eagle2-auto-n" and tree_kw.get("total_tokens") != "auto":
        raise UserError("Policy eagle2-auto-n (the auto budget choosing N only, at fixed depth) needs "
                        "--total-tokens auto.")
    # tree flags apply to the tree-building policies; 'auto' only to eagle2, the static shape is fixed
    kw = {k: v for k, v in tree_kw.items() if v is not None and v != "auto"}
    if name in ("plain", "static"):
        kw = {}
    if name in ("eagle2", "eagle2-auto-n") and tree_kw.get("total_tokens") == "auto":
        name, kw["adaptive_depth"] = "eagle2-auto", name == "eagle2"  # the same budget, depth fixed for -n
    if name == "eagle2-auto":
        kw["profile"] = profile
    return Decoder(bundle, name, sp, max_new_tokens=max_new, record=False, **kw)


def run_one(bundle, runner, q, sp, max_new) -> dict:
    """All turns of one question; multi-turn runs each turn after the previous answer."""
    msgs, tot = [], defaultdict(float)
    ids_all = []
    for turn in q["turns"]:
        msgs.append({"role": "user", "content": turn})
        if isinstance(runner, HFBaseline):
            dec_ids = bundle.tokenizer.apply_chat_template(msgs, add_generation_prompt=True, tokenize=True)
            dec_ids = list(dec_ids["input_ids"] if hasattr(dec_ids, "keys") else dec_ids)
            r = runner.run(dec_ids, max_new, bundle.eos_ids)
            text = bundle.tokenizer.decode(r["token_ids"], skip_special_tokens=True)
        else:
            d = runner()
            d.start(messages=msgs)
            d.generate()
            r = d.summary()
            text = r["text"]
        ids_all += r["token_ids"]
        for k in ("new_tokens", "target_forwards", "wall_s", "draft_s", "verify_s"):
            tot[k] += r.get(k, 0.0)
        st = r.get("policy_stats") or {}
        for k in ("n", "levels"):  # the auto budget's choices: cycles per N, per levels drafted
            for v, c in st.get(k, {}).items():
                tot.setdefault(f"auto_{k}", Counter())[int(v)] += c
        if "positions" in st:  # a lossy policy's record of how far it moved from exact decoding
            for k in ("positions", "relaxed_tokens"):
                tot[k] += st[k]
            tot["tv_sum"] += st["mean_tv"] * st["positions"]
            tot["max_tv"] = max(tot["max_tv"], st["max_tv"])
        msgs.append({"role": "assistant", "content": text})
    tot["token_ids"] = ids_all
    return tot


def aggregate(rows: list[dict]) -> dict:
    toks = sum(r["new_tokens"] for r in rows)
    fw = sum(r["target_forwards"] for r in rows)
    wall = sum(r["wall_s"] for r in rows)
    out = {"tau": toks / max(fw, 1), "tokens_per_s": toks / wall if wall else 0.0,
           "new_tokens": int(toks), "target_forwards": int(fw), "wall_s": wall}
    draft = sum(r.get("draft_s", 0.0) for r in rows)
    if draft:  # tree policies: the drafting share of the wall time, and per-cycle costs
        verify = sum(r.get("verify_s", 0.0) for r in rows)
        out.update(draft_share=draft / wall, draft_ms_per_cycle=1000 * draft / max(fw, 1),
                   verify_ms_per_cycle=1000 * verify / max(fw, 1))
    for k in ("n", "levels"):
        hist = sum((r.get(f"auto_{k}", Counter()) for r in rows), Counter())
        if hist:
            out[f"auto_{k}"] = {str(v): hist[v] for v in sorted(hist)}
            out[f"auto_mean_{k}"] = sum(v * c for v, c in hist.items()) / sum(hist.values())
    return out


def machine() -> str:
    return f"{platform.machine()} {platform.processor() or ''} {torch.get_num_threads()} threads".strip()


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    if a.threads:
        torch.set_num_threads(a.threads)
    sp = SamplingParams(temperature=a.temperature, top_p=a.top_p, top_k=a.top_k_sampling, seed=a.seed)
    sp.validate()
    prompts = read_prompts(Path(a.prompts))
    if a.limit:
        prompts = spread_over_categories(prompts, a.limit)
    check(a.repeats >= 1, "--repeats must be >= 1.")
    names = [p.strip() for p in a.policies.split(",") if p.strip()]
    check(len(names) > 0, "No policies given.")
    if "plain" not in names:
        names = ["plain"] + names  # speedups are relative to plain, measured in the same run
    tt = a.total_tokens
    if tt not in (None, "auto"):
        try:
            tt = int(tt)
        except ValueError:
            raise UserError(f"--total-tokens must be an integer or 'auto' (got {tt!r}).") from None
    tree_kw = {"total_tokens": tt, "depth": a.depth, "top_k": a.top_k}
    bundle = load_bundle(a.target, a.head, a.device, a.dtype, pack=not a.no_pack)
    profile = None
    if tt == "auto" or "eagle2-auto" in names:
        from .budget import verify_profile
        profile = verify_profile(bundle)
    out = Path(a.out)
    out.mkdir(parents=True, exist_ok=True)

    variants: list[tuple[str, object]] = []
    for n in names:
        if n in ("hf", "hf-pld"):
            from .weights import resolve_target
            check(sp.greedy, "The hf baselines are greedy only: use --temperature 0.")
            variants.append((n, HFBaseline(bundle, resolve_target(a.target), n == "hf-pld")))
        else:
            make_decoder(bundle, n, sp, 4, tree_kw, profile)  # validates parameters early
            variants.append((n, lambda n=n: make_decoder(bundle, n, sp, a.max_new_tokens, tree_kw, profile)))
    if a.sweep:
        for N, d, k in itertools.product(*(map(int, s.split(",")) for s in
                                           (a.sweep_total_tokens, a.sweep_depth, a.sweep_top_k))):
            kw = {"total_tokens": N, "depth": d, "top_k": k}
            variants.append((f"eagle2[N={N},d={d},k={k}]",
                             lambda kw=kw: Decoder(bundle, "eagle2", sp, max_new_tokens=a.max_new_tokens,
                                                   record=False, **kw)))

    # warm-up: one short run of everything (allocators, caches, lazy tables)
    warm = {"question_id": -1, "category": "warmup", "turns": ["Say hello."]}
    for n, r in variants:
        run_one(bundle, r, warm, sp, 8)

    rows = []
    total = len(prompts) * a.repeats * len(variants)
    bar = tqdm(total=total, desc="bench", unit="run")
    for rep in range(a.repeats):
        for qi, q in enumerate(prompts):
            order = variants[qi % len(variants):] + variants[: qi % len(variants)]  # rotate start
            for n, r in order:
                res = run_one(bundle, r, q, sp, a.max_new_tokens)
                rows.append({"question_id": q["question_id"], "category": q["category"], "policy": n,
                             "repeat": rep, **{k: res[k] for k in ("new_tokens", "target_forwards", "wall_s")},
                             "tau": res["new_tokens"] / max(res["target_forwards"], 1),
                             "tokens_per_s": res["new_tokens"] / res["wall_s"] if res["wall_s"] else 0.0,
                             **({k: res[k] for k in ("positions", "relaxed_tokens", "tv_sum", "max_tv")}
                                if "positions" in res else {}),
                             **{k: res[k] for k in ("draft_s", "verify_s", "auto_n", "auto_levels") if k in res},
                             "token_ids": res["token_ids"]})
                bar.update(1)
    bar.close()
    summary = summarise(rows, [n for n, _ in variants], sp.greedy)
    summary.update({"device": f"{bundle.device.type}" + (f" ({torch.cuda.get_device_name()})" if bundle.device.type == "cuda" else f" ({machine()})"),
                    "dtype": str(bundle.dtype).replace("torch.", ""), "model": bundle.name, "head": bundle.head_name,
                    "packed_weights": bundle.packed, "threads": torch.get_num_threads(),
                    "prompts": str(a.prompts), "n_prompts": len(prompts), "max_new_tokens": a.max_new_tokens,
                    "repeats": a.repeats, "sampling": vars(sp), "tree": tree_kw,
                    "date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": "python -m eagle2 bench " + " ".join(argv or [])})
    if profile:
        summary["verify_profile_s"] = profile
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    with open(out / "per_prompt.csv", "w", newline="") as f:
        skip = ("token_ids", "auto_n", "auto_levels")  # lists and histograms live in summary.json
        fields = list(dict.fromkeys(k for r in rows for k in r if k not in skip))
        w = csv.DictWriter(f, fieldnames=fields, restval="")
        w.writeheader()
        for r in rows:
            w.writerow({k: v for k, v in r.items() if k not in skip})
    try:
        from viz.bench_charts import report_html
        (out / "report.html").write_text(report_html(summary, rows))
    except ImportError as e:  # the report needs plotly (in requirements); the numbers do not
        print(f"note: no HTML report ({e})")
    print_table(summary)
    return 0


def summarise(rows, names, greedy) -> dict:
    by_pol = {n: aggregate([r for r in rows if r["policy"] == n]) for n in names}
    base = by_pol["plain"]["tokens_per_s"]
    for n, s in by_pol.items():
        s["speedup"] = s["tokens_per_s"] / base if base else 0.0
    if greedy:  # losslessness, checked on every benchmark run
        plain_ids = {(r["question_id"], r["repeat"]): r["token_ids"] for r in rows if r["policy"] == "plain"}
        for n, s in by_pol.items():
            rs = [r for r in rows if r["policy"] == n]
            s["identical_to_plain"] = sum(r["token_ids"] == plain_ids[(r["question_id"], r["repeat"])] for r in rs) / max(len(rs), 1)
    for n, s in by_pol.items():
        rs = [r for r in rows if r["policy"] == n and "positions" in r]
        if rs:  # lossy policies: how often tokens were relaxed and the total-variation shift
            pos = sum(r["positions"] for r in rs)
            s["relaxed_tokens"] = int(sum(r["relaxed_tokens"] for r in rs))
            s["relaxed_per_token"] = s["relaxed_tokens"] / max(s["new_tokens"], 1)
            s["mean_tv"] = sum(r["tv_sum"] for r in rs) / max(pos, 1)
            s["max_tv"] = max(r["max_tv"] for r in rs)
    cats = sorted({r["category"] for r in rows})
    by_cat = {}
    for c in cats:
        d = {n: aggregate([r for r in rows if r["policy"] == n and r["category"] == c]) for n in names}
        b = d["plain"]["tokens_per_s"]
        for s in d.values():
            s["speedup"] = s["tokens_per_s"] / b if b else 0.0
        by_cat[c] = d
    return {"policies": by_pol, "by_category": by_cat}


def print_table(summary) -> None:
    print(f"\n{'policy':34s} {'tau':>6s} {'tok/s':>8s} {'speedup':>8s} {'tokens':>7s} {'fwds':>6s}")
    for n, s in summary["policies"].items():
        ident = f"  identical {s['identical_to_plain']:.0%}" if "identical_to_plain" in s else ""
        if "mean_tv" in s:
            ident += (f"  LOSSY: {s['relaxed_tokens']} relaxed tokens, mean TV {s['mean_tv']:.3f}, "
                      f"max TV {s['max_tv']:.3f}")
        if "draft_share" in s:
            ident += f"  draft {s['draft_share']:.0%} of the time"
        if "auto_mean_n" in s:
            ident += f"  auto: mean N {s['auto_mean_n']:.1f}, mean levels {s['auto_mean_levels']:.1f}"
        print(f"{n:34s} {s['tau']:6.2f} {s['tokens_per_s']:8.2f} {s['speedup']:7.2f}x {s['new_tokens']:7d} "
              f"{s['target_forwards']:6d}{ident}")
