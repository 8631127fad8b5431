"""What drawing a Step's outputs costs the page: each of the dashboard's outputs (the trees, the race's
charts, the cards) built for cycles of a shipped trace, median milliseconds each. Pure Python and
Plotly, no model: the page pays it inside a visitor's Step, on top of the decoders' work.

    python scripts/draw_cost.py [TRACE] [--reps 2]
"""
from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("trace", nargs="?", default=str(REPO / "assets" / "traces" / "writing-greedy.json"))
    ap.add_argument("--reps", type=int, default=2)
    a = ap.parse_args(argv)
    from ui import dashboard as D
    from ui.traces import load_view
    from eagle2.machine import cpu_info
    view = load_view(a.trace)
    names = ("metrics", "tokens", "tree", "cycle") + tuple(n for p in sorted(D.OPEN) for n in D.PANELS[p])
    cycles = [s.cycle for s in view.steps if s.tree is not None]
    times: dict[str, list[float]] = {n: [] for n in names}
    for _ in range(a.reps):
        for c in cycles:
            at = D.At(view, c, "path value", False, None)
            for n in names:
                t = time.perf_counter()
                getattr(at, n)()
                times[n].append(time.perf_counter() - t)
    ms = {n: statistics.median(v) * 1e3 for n, v in times.items()}
    print(f"{cpu_info()['cpu']}; {Path(a.trace).name}, {len(cycles)} cycles x {a.reps}; the panels open on a new page")
    for n, v in ms.items():
        print(f"  {n:8s} {v:6.1f} ms")
    print(f"  a Step's outputs: {sum(ms.values()):.1f} ms")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
