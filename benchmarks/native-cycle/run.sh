#!/usr/bin/env bash
# The native cycle's before/after: the default bench (6 held-out prompts x 128 tokens, greedy,
# q4_1) three times at 2 threads and at 1, base and after alternating run by run in the same hour,
# then the AVX2 dot products on this CPU (EAGLE2_Q4_KERNELS=avx2). BASE: a worktree of the commit
# before the change (git worktree add BASE 023f99a); OUT: where the runs go.
set -euo pipefail
BASE=${BASE:-/tmp/base}
OUT=${OUT:-benchmarks/native-cycle}
HERE=$(pwd)
bench() {  # dir tag threads [env]
  local dir=$1 tag=$2 t=$3
  (cd "$dir" && env ${4:-} python -m eagle2 bench --prompts assets/prompts/heldout.jsonl --limit 6 \
     --max-new-tokens 128 --dtype q4_1 --threads "$t" --policies plain,eagle2-auto --out "$HERE/$OUT/$tag") \
     > "$OUT/$tag.log" 2>&1
}
for run in 1 2 3; do
  for t in 2 1; do
    bench "$BASE" "base-t$t-run$run" "$t"
    bench "$HERE" "after-t$t-run$run" "$t"
  done
done
for t in 2 1; do
  bench "$BASE" "base-avx2-t$t" "$t" EAGLE2_Q4_KERNELS=avx2
  bench "$HERE" "after-avx2-t$t" "$t" EAGLE2_Q4_KERNELS=avx2
done
