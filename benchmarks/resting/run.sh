#!/usr/bin/env bash
# Resting against the code before it: eagle2-auto vs plain q4_1 on all 60 held-out prompts x 128
# tokens, greedy, each run its own process; at 2 threads base and after alternating run by run,
# then the code after it alone at 1 thread and with the AVX2 dot products (EAGLE2_Q4_KERNELS=avx2).
# BASE: a worktree of the commit before (git worktree add BASE <commit>); OUT: where the runs go.
set -euo pipefail
BASE=${BASE:-/tmp/base}
HERE=$(pwd)
OUT=${OUT:-$HERE/benchmarks/resting}
bench() {  # dir tag threads [env]
  (cd "$1" && env ${4:-} python -m eagle2 bench --max-new-tokens 128 --dtype q4_1 --threads "$3" \
      --policies plain,eagle2-auto --out "$OUT/$2") > "$OUT/$2.log" 2>&1
}
for run in 1 2 3; do
  bench "$BASE" "base-t2-run$run" 2
  bench "$HERE" "after-t2-run$run" 2
done
for run in 1 2 3; do bench "$HERE" "after-t1-run$run" 1; done
bench "$HERE" after-avx2-t2 2 EAGLE2_Q4_KERNELS=avx2
bench "$HERE" after-avx2-t1 1 EAGLE2_Q4_KERNELS=avx2
