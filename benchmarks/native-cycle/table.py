"""The runs of run.sh as Markdown tables: eagle2-auto against plain per run, and where a cycle's
time goes (the bench's phase_ms_per_cycle), base and after. python benchmarks/native-cycle/table.py"""
import json
from pathlib import Path

HERE = Path(__file__).parent
PH = ("draft_head", "draft_tree", "verify_inputs", "target_forward", "accept", "cache_commit", "policy")


def load(tag):
    return json.load(open(HERE / tag / "summary.json"))


print("| run | plain tok/s | eagle2-auto tok/s | vs plain | tau | mean N | levels | around the forwards |")
print("| --- | --- | --- | --- | --- | --- | --- | --- |")
tags = [f"{w}-t{t}-run{r}" for t in (2, 1) for r in (1, 2, 3) for w in ("base", "after")]
tags += [f"{w}-avx2-t{t}" for t in (2, 1) for w in ("base", "after")]
for tag in tags:
    s = load(tag)["policies"]
    p, a = s["plain"], s["eagle2-auto"]
    print(f"| {tag} | {p['tokens_per_s']:.1f} | {a['tokens_per_s']:.1f} | {a['speedup']:.2f}x | {a['tau']:.2f} | "
          f"{a['auto_mean_n']:.2f} | {a['auto_mean_levels']:.2f} | "
          f"{100 * a['around_forwards_share']:.1f}% |")
print()
print("| run | policy | " + " | ".join(PH) + " | total |")
print("| --- | --- | " + " | ".join("---" for _ in PH) + " | --- |")
for tag in tags:
    s = load(tag)["policies"]
    for pol in ("plain", "eagle2-auto"):
        ph = s[pol]["phase_ms_per_cycle"]
        print(f"| {tag} | {pol} | " + " | ".join(f"{ph[k]:.2f}" for k in PH) + f" | {sum(ph.values()):.2f} |")
