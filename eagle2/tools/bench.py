"""`python -m eagle2 bench`: Spec-Bench-style comparison of decoders, measured side by side.

Every prompt runs every policy in one process, interleaved (fair against machine drift), after a
warm-up. Speedup = tokens/s over `plain` (same model code) in the same run; tau = generated tokens
per target forward. Writes DIR/summary.json and DIR/per_prompt.csv; `python -m viz.report DIR`
renders them as an HTML report.
External baselines: `hf` (transformers' generate, greedy, same weights) and `hf-pld` (its
prompt-lookup decoding); llama.cpp as a peer, `llama.cpp-q4_1` (the embedded GGUF as shipped) and
`llama.cpp-f32` (its weights dequantised to F32, as the engine's), where llama-cpp-python is
installed (the `llamacpp` extra; tools/llamacpp.py).
"""
from __future__ import annotations

import argparse
import csv
import itertools
import json
import sys
import time
from collections import Counter, defaultdict
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm import tqdm

from ..decoding.decoder import Decoder
from ..errors import check
from ..model.chat import chat_ids
from ..model.loading import load_bundle
from ..model.calibration import cached_times
from ..model.stopwatch import syncer
from ..model.verify_times import RECORD_KEY
from ..phases import FORWARDS, PHASES, key as phase_key
from ..devices import is_cuda
from ..policies.registry import EAGLE2, PLAIN, cli_kwargs, is_plain
from .flags import (add_cost_args, add_model_args, add_policy_args, add_sampling_args, add_tree_args, apply_threads,
                    costs_first, recalibrate, sampling_from)
from ..machine import cpu_info, describe_cpu
from .llamacpp import PEERS, LlamaCppPeer, missing_reason, skip_line, version as llama_cpp_version
from .prompt_files import HELDOUT, read_prompts

# transformers' generate and its prompt lookup, and llama.cpp: not tree policies, and not held to
# plain's tokens (their identity with plain is reported, not required)
BASELINES = ("hf", "hf-pld", *PEERS)



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
    ap.add_argument("--prompts", default=str(HELDOUT),
                    help="MT-bench format jsonl (question_id, category, turns); default: all 60 held-out prompts")
    ap.add_argument("--policies", default="plain,static,eagle2",
                    help="comma list: plain, any registered tree policy (eagle2, eagle2-auto, eagle2-auto-n, "
                         "static, ddd, dyspec, lantern, ...), hf, hf-pld, llama.cpp-q4_1, llama.cpp-f32 (with the "
                         "llamacpp extra installed); every row runs on the forward --dtype chooses (to compare "
                         "backends, run the bench once per --dtype)")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--limit", type=int, default=0, help="smoke runs only: K prompts spread over the categories (round-robin, file order within each); "
                         "a speed claim is judged on every prompt of the file")
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--out", required=True)
    ap.add_argument("--sweep", action="store_true", help="grid over N x depth x top_k of --sweep-policy")
    ap.add_argument("--sweep-policy", default=EAGLE2, help="the tree policy the sweep varies (default %(default)s)")
    ap.add_argument("--sweep-total-tokens", default="8,16,24,32,48,60")
    ap.add_argument("--sweep-depth", default="3,5,7")
    ap.add_argument("--sweep-top-k", default="4,8,10")
    ap.add_argument("--no-pack", action="store_true", help="plain matmuls, without the prepacked CPU weights")
    add_tree_args(ap)
    add_policy_args(ap)
    add_model_args(ap)
    add_cost_args(ap)
    add_sampling_args(ap)
    return ap


@dataclass(frozen=True)
class Row:
    """One row of the benchmark: a policy (or an hf baseline, a llama.cpp peer), and for a --sweep
    row its tree (N, depth, top_k). `label` names it in the output, as --policies spells it; a
    sweep row is 'eagle2[N=8,d=3,k=4]'."""
    policy: str
    sweep: tuple[int, int, int] | None = None

    @classmethod
    def parse(cls, entry: str) -> "Row":
        """A --policies entry: 'plain', 'eagle2-auto', 'llama.cpp-q4_1'..."""
        return cls(entry)

    @property
    def label(self) -> str:
        tree = "" if self.sweep is None else "[N={},d={},k={}]".format(*self.sweep)
        return self.policy + tree

    @property
    def baseline(self) -> bool:
        return self.policy in BASELINES


PLAIN_ROW = Row(PLAIN)


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
        sync = syncer(dev)
        sync()
        t0 = time.perf_counter()
        with torch.no_grad():
            out = self.model.generate(x, attention_mask=torch.ones_like(x), **kw)
        sync()
        wall = time.perf_counter() - t0
        new = out[0, len(ids):].tolist()
        return {"token_ids": new, "new_tokens": len(new), "target_forwards": self.calls, "wall_s": wall}


def make_decoder(bundle, name, sp, max_new, tree_kw, own):
    """A bench row's decoder: the tree flags apply to the policies they fit (the class decides)."""
    return Decoder(bundle, name, sp, max_new_tokens=max_new, record=False,
                   **({} if is_plain(name) else {**tree_kw, **own}))


def run_one(bundle, runner, q, sp, max_new) -> dict:
    """All turns of one question; multi-turn runs each turn after the previous answer."""
    msgs, tot = [], defaultdict(float)
    ids_all = []
    for turn in q["turns"]:
        msgs.append({"role": "user", "content": turn})
        if isinstance(runner, (HFBaseline, LlamaCppPeer)):
            r = runner.run(chat_ids(bundle.tokenizer, msgs), max_new, bundle.eos_ids)
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
        for p, v in r.get("phases_s", {}).items():   # where the decoder's time went (eagle2/phases.py)
            tot[phase_key(p)] += v
        st = r.get("policy_stats") or {}
        for k in ("n", "levels", "widths"):  # the auto budget's choices: cycles per N, per levels, calls per width
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
    phases = {p: sum(r.get(phase_key(p), 0.0) for r in rows) for p in PHASES}
    if wall and any(phases.values()):  # the engine's decoders: each phase per cycle and its share
        out["phase_ms_per_cycle"] = {p: 1000 * v / max(fw, 1) for p, v in phases.items()}
        out["phase_share"] = {p: v / wall for p, v in phases.items()}
        out["around_forwards_share"] = 1 - sum(phases[p] for p in FORWARDS) / wall
    for k in ("n", "levels", "widths"):
        hist = sum((r.get(f"auto_{k}", Counter()) for r in rows), Counter())
        if hist:
            out[f"auto_{k}"] = {str(v): hist[v] for v in sorted(hist)}
            out[f"auto_mean_{k}"] = sum(v * c for v, c in hist.items()) / sum(hist.values())
    return out


def machine() -> str:
    return describe_cpu(torch.get_num_threads())


def main(argv=None) -> int:
    a = build_parser().parse_args(argv)
    apply_threads(a)
    sp = sampling_from(a)
    prompts = read_prompts(Path(a.prompts))
    if a.limit:
        prompts = spread_over_categories(prompts, a.limit)
    check(a.repeats >= 1, "--repeats must be >= 1.")
    rows = [Row.parse(p.strip()) for p in a.policies.split(",") if p.strip()]
    check(len(rows) > 0, "No policies given.")
    if PLAIN_ROW not in rows:
        rows = [PLAIN_ROW] + rows  # speedups are relative to plain, measured in the same run
    rows, skipped = without_missing_peers(rows)
    tree_kw = {"total_tokens": a.total_tokens, "depth": a.depth, "top_k": a.top_k}
    own = {r.policy: cli_kwargs(r.policy, a, strict=False)
           for r in rows if not is_plain(r.policy) and not r.baseline}  # before loading
    bundle = load_bundle(a.target, a.head, a.device, a.dtype, pack=not a.no_pack)
    forward = bundle.description
    print(f"forward: {forward}", file=sys.stderr)
    recalibrate(a, bundle)
    variants = build_variants(a, bundle, rows, sp, tree_kw, own)
    warm = {"question_id": -1, "category": "warmup", "turns": ["Say hello."]}
    for row, r in variants:  # one short run of everything first (allocators, caches, lazy tables)
        run_one(bundle, r, warm, sp, 8)
    results = measure(bundle, variants, prompts, sp, a.max_new_tokens, a.repeats)
    summary = summarise(results, [row.label for row, _ in variants], sp.greedy)
    summary.update({"device": f"{bundle.device.type}" + (f" ({torch.cuda.get_device_name()})" if is_cuda(bundle.device) else f" ({machine()})"),
                    "dtype": bundle.precision or str(bundle.dtype).replace("torch.", ""), "model": bundle.name, "head": bundle.head_name,
                    "threads": torch.get_num_threads(), "forward": forward,
                    "machine": {**cpu_info(), "torch": torch.__version__},
                    "prompts": str(a.prompts), "n_prompts": len(prompts), "max_new_tokens": a.max_new_tokens,
                    "repeats": a.repeats, "sampling": vars(sp), "tree": tree_kw,
                    "date": time.strftime("%Y-%m-%d %H:%M:%S"), "command": "python -m eagle2 bench " + " ".join(argv or [])})
    if skipped:
        summary["skipped_rows"] = skipped
    if any(isinstance(r, LlamaCppPeer) for _, r in variants):
        summary["machine"]["llama_cpp_python"] = llama_cpp_version()
    times = cached_times(bundle)
    if times:  # the t(N) table a cost-aware policy started from (the last quiet measurement, plausible or not)
        summary[RECORD_KEY] = times
    write_results(Path(a.out), summary, results)
    print_table(summary)
    print(f"wrote {a.out}/summary.json and per_prompt.csv; the HTML report: python -m viz.report {a.out}")
    return 0


def without_missing_peers(rows: list[Row]) -> tuple[list[Row], dict[str, str]]:
    """The rows less the llama.cpp ones where llama_cpp cannot be imported, said in one line on
    stderr (before anything loads), and {label: why} for the summary."""
    peers = [r.label for r in rows if r.policy in PEERS]
    reason = missing_reason() if peers else None
    if reason is None:
        return rows, {}
    print(skip_line(peers, reason), file=sys.stderr, flush=True)
    return [r for r in rows if r.policy not in PEERS], {p: reason for p in peers}


def build_variants(a, bundle, rows: list[Row], sp, tree_kw, own) -> list[tuple[Row, object]]:
    """(row, runner) pairs: an HF baseline, a llama.cpp peer, or a factory of fresh decoders
    (validated now)."""
    variants: list[tuple[Row, object]] = []
    for row in rows:
        n = row.policy
        if row.baseline:
            check(sp.greedy, f"The baseline {row.label} is greedy only: use --temperature 0.")
            if n in PEERS:
                variants.append((row, LlamaCppPeer(n, a.target, torch.get_num_threads(),
                                                   bundle.args.max_positions, seed=a.seed)))
                continue
            from ..model.weights import resolve_target
            variants.append((row, HFBaseline(bundle, resolve_target(a.target), n == "hf-pld")))
        else:
            kw = own.get(n, {})
            costs_first(bundle, n)  # t(N) of the forward, before any timed run
            make_decoder(bundle, n, sp, 4, tree_kw, kw)  # validates parameters early
            variants.append((row, lambda n=n, kw=kw: make_decoder(bundle, n, sp, a.max_new_tokens, tree_kw, kw)))
    if a.sweep:
        costs_first(bundle, a.sweep_policy)
        for N, d, k in itertools.product(*(map(int, s.split(",")) for s in
                                           (a.sweep_total_tokens, a.sweep_depth, a.sweep_top_k))):
            kw = {"total_tokens": N, "depth": d, "top_k": k}
            variants.append((Row(a.sweep_policy, sweep=(N, d, k)),
                             lambda kw=kw: Decoder(bundle, a.sweep_policy, sp, max_new_tokens=a.max_new_tokens,
                                                   record=False, **kw)))
    return variants


def measure(bundle, variants, prompts, sp, max_new: int, repeats: int) -> list[dict]:
    """Every prompt through every variant, interleaved, the starting variant rotated per prompt."""
    rows = []
    bar = tqdm(total=len(prompts) * repeats * len(variants), desc="bench", unit="run")
    for rep in range(repeats):
        for qi, q in enumerate(prompts):
            order = variants[qi % len(variants):] + variants[: qi % len(variants)]  # rotate start
            for row, r in order:
                res = run_one(bundle, r, q, sp, max_new)
                rows.append({"question_id": q["question_id"], "category": q["category"], "policy": row.label,
                             "repeat": rep, **{k: res[k] for k in ("new_tokens", "target_forwards", "wall_s")},
                             "tau": res["new_tokens"] / max(res["target_forwards"], 1),
                             "tokens_per_s": res["new_tokens"] / res["wall_s"] if res["wall_s"] else 0.0,
                             **({k: res[k] for k in ("positions", "relaxed_tokens", "tv_sum", "max_tv")}
                                if "positions" in res else {}),
                             **{k: res[k] for k in ("draft_s", "verify_s", "auto_n", "auto_levels", "auto_widths") if k in res},
                             **{phase_key(p): res[phase_key(p)] for p in PHASES if phase_key(p) in res},
                             "token_ids": res["token_ids"]})
                bar.update(1)
    bar.close()
    return rows


def write_results(out: Path, summary: dict, rows: list[dict]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / "summary.json").write_text(json.dumps(summary, indent=2))
    with open(out / "per_prompt.csv", "w", newline="") as f:
        skip = ("token_ids", "auto_n", "auto_levels", "auto_widths")  # lists and histograms live in summary.json
        fields = list(dict.fromkeys(k for r in rows for k in r if k not in skip))
        w = csv.DictWriter(f, fieldnames=fields, restval="")
        w.writeheader()
        for r in rows:
            w.writerow({k: v for k, v in r.items() if k not in skip})


def summarise(rows, names, greedy) -> dict:
    """The summary's numbers; `names` and the rows' "policy" are row labels (Row.label)."""
    by_pol = {n: aggregate([r for r in rows if r["policy"] == n]) for n in names}
    base = by_pol[PLAIN_ROW.label]["tokens_per_s"]
    for n, s in by_pol.items():
        s["speedup"] = s["tokens_per_s"] / base if base else 0.0
    if greedy:  # losslessness, checked on every benchmark run
        plain_ids = {(r["question_id"], r["repeat"]): r["token_ids"] for r in rows if r["policy"] == PLAIN_ROW.label}
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
        b = d[PLAIN_ROW.label]["tokens_per_s"]
        for s in d.values():
            s["speedup"] = s["tokens_per_s"] / b if b else 0.0
        by_cat[c] = d
    return {"policies": by_pol, "by_category": by_cat, "spread": spread(rows, names, by_cat)}


def spread(rows, names, by_cat: dict) -> dict:
    """How far one figure hides the prompts behind it: per row, each prompt's speedup over plain
    (its tokens/s over plain's on the same prompt, repeats summed), the slowest, the median and the
    fastest prompt, and the categories' speedups (`by_cat`, summarise's) with their range."""
    by_q: dict[tuple[str, object], list[dict]] = defaultdict(list)
    for r in rows:
        by_q[(r["policy"], r["question_id"])].append(r)
    plain = {qid: aggregate(rs)["tokens_per_s"] for (pol, qid), rs in by_q.items() if pol == PLAIN_ROW.label}
    out = {}
    for n in names:
        if n == PLAIN_ROW.label:
            continue
        per = []
        for (pol, qid), rs in by_q.items():
            if pol == n and plain.get(qid):
                a = aggregate(rs)
                per.append({"question_id": qid, "category": rs[0]["category"],
                            "speedup": a["tokens_per_s"] / plain[qid], "tau": a["tau"]})
        if not per:
            continue
        per.sort(key=lambda e: e["speedup"])
        cats = {c: d[n]["speedup"] for c, d in by_cat.items()}
        out[n] = {"prompts": len(per), "slowest": per[0], "median": per[len(per) // 2]["speedup"], "fastest": per[-1],
                  "category_min": min(cats.values()), "category_max": max(cats.values()), "by_category": cats}
    return out


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
            if "auto_mean_widths" in s:
                ident += f", mean width {s['auto_mean_widths']:.1f}"
        print(f"{n:34s} {s['tau']:6.2f} {s['tokens_per_s']:8.2f} {s['speedup']:7.2f}x {s['new_tokens']:7d} "
              f"{s['target_forwards']:6d}{ident}")
    print_spread(summary)
    print_phases(summary)


def print_spread(summary) -> None:
    """Per row: the categories' speedups and the slowest, median and fastest prompt."""
    sp = summary.get("spread") or {}
    if not sp:
        return
    print("\nspread over prompts (speedup over plain, each prompt and each category on its own):")
    for n, s in sp.items():
        lo, hi = s["slowest"], s["fastest"]
        cats = ", ".join(f"{c} {v:.2f}x" for c, v in s["by_category"].items())
        print(f"{n:34s} {s['prompts']} prompts: slowest {lo['speedup']:.2f}x (#{lo['question_id']} {lo['category']}, "
              f"tau {lo['tau']:.2f}), median {s['median']:.2f}x, fastest {hi['speedup']:.2f}x "
              f"(#{hi['question_id']} {hi['category']}, tau {hi['tau']:.2f})")
        print(f"{'':34s} categories {s['category_min']:.2f}-{s['category_max']:.2f}x: {cats}")


def print_phases(summary) -> None:
    """Where each decoder's cycle went: ms per cycle in each phase, and the share of the time spent
    around the forwards (everything but the draft head's and the target's own computation)."""
    rows = {n: s for n, s in summary["policies"].items() if "phase_ms_per_cycle" in s}
    if not rows:
        return
    print(f"\nms per cycle (target forward), by phase:\n{'policy':34s} " + " ".join(f"{p:>14s}" for p in PHASES)
          + f" {'total':>8s} {'around':>7s}")
    for n, s in rows.items():
        ms = s["phase_ms_per_cycle"]
        print(f"{n:34s} " + " ".join(f"{ms[p]:14.2f}" for p in PHASES) + f" {sum(ms.values()):8.2f}"
              f" {s['around_forwards_share']:6.1%}")
