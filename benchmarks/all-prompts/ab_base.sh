#!/usr/bin/env bash
# The code before the prefill blocks and the head's last-row absorb (BASE: a worktree of 3fb2d1b)
# and this checkout, alternating, all 60 held-out prompts x 128 tokens, q4_1, 2 threads, two pairs.
# OUT: where the runs go.
set -euo pipefail
BASE=${BASE:?a worktree of the commit before}
OUT=${OUT:-/tmp/ab}
HERE=$(cd "$(dirname "$0")/../.." && pwd)
for i in 1 2; do
  for which in base new; do
    if [ $which = base ]; then dir=$BASE; else dir=$HERE; fi
    (cd "$dir" && PYTHONPATH="$dir" python -m eagle2 bench --max-new-tokens 128 --dtype q4_1 --threads 2 \
        --policies plain,eagle2-auto --out "$OUT/$which-$i" > "$OUT/$which-$i.log" 2>&1)
  done
done
