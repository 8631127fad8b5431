"""Per-cycle table of a trace (pandas), for the app's table and the CSV download."""
from __future__ import annotations

import pandas as pd

from .common import show_ws

COLUMNS = ["cycle", "policy", "accepted", "emitted", "text", "bonus", "drafted", "verified", "draft_calls",
           "draft_ms", "verify_ms", "total_ms", "tokens", "target_forwards", "wall_s", "tau", "finished"]


def cycle_table(steps) -> pd.DataFrame:
    """One row per cycle (cycle 0 = prefill) of a run's steps: what it emitted, its tree sizes,
    timings and the running totals (StepTrace.timings / cumulative, every key there)."""
    rows = []
    for s in steps:
        t = s.tree
        texts = list(s.new_texts)
        bonus = None
        if s.bonus is not None and len(texts) > s.accepted_len:
            bonus = show_ws(texts[s.accepted_len])
        cum = s.cumulative
        fw = cum["target_forwards"]
        rows.append({
            "cycle": s.cycle, "policy": s.policy, "accepted": s.accepted_len, "emitted": len(s.new_tokens),
            "text": "".join(show_ws(x) for x in texts), "bonus": bonus,
            "drafted": len(t.tokens) - 1 if t is not None else 0,
            "verified": sum(bool(k) for k in t.kept) - 1 if t is not None else 0,
            "draft_calls": t.draft_calls if t is not None else 0,
            "draft_ms": round(1000 * s.timings["draft_s"], 1),
            "verify_ms": round(1000 * s.timings["verify_s"], 1),
            "total_ms": round(1000 * s.timings["total_s"], 1),
            "tokens": cum["tokens"], "target_forwards": fw,
            "wall_s": round(cum["wall_s"], 3),
            "tau": round(cum["tokens"] / fw, 3) if fw else 0.0,
            "finished": s.finished or "",
        })
    return pd.DataFrame(rows, columns=COLUMNS)
