#!/usr/bin/env bash
# An earlier commit (BASE: a worktree of it) and this checkout, alternating base, new, base, new...,
# all 60 held-out prompts x 128 tokens, q4_1, eagle2-auto against plain in each run.
# OUT: where the runs go; THREADS (default 2); PAIRS (default 2). The README beside this names the
# BASE commit of each comparison.
set -euo pipefail
BASE=${BASE:?a worktree of the commit before}
OUT=${OUT:-/tmp/ab}
THREADS=${THREADS:-2}
PAIRS=${PAIRS:-2}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
mkdir -p "$OUT"
for i in $(seq 1 "$PAIRS"); do
  for which in base new; do
    if [ $which = base ]; then dir=$BASE; else dir=$HERE; fi
    (cd "$dir" && PYTHONPATH="$dir" python -m eagle2 bench --max-new-tokens 128 --dtype q4_1 --threads "$THREADS" \
        --policies plain,eagle2-auto --out "$OUT/$which-$i" > "$OUT/$which-$i.log" 2>&1)
  done
done
