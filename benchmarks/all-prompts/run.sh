#!/usr/bin/env bash
# eagle2-auto against plain q4_1 on all 60 held-out prompts x 128 tokens, greedy: three runs at 2
# threads and three at 1, then the AVX2 dot products on this CPU (EAGLE2_Q4_KERNELS=avx2) at 2 and 1.
# Each run is its own process (its own t(N) table, as a user's run starts from). OUT: where they go.
set -euo pipefail
OUT=${OUT:-benchmarks/all-prompts}
bench() {  # tag threads [env]
  env ${3:-} python -m eagle2 bench --max-new-tokens 128 --dtype q4_1 --threads "$2" \
      --policies plain,eagle2-auto --out "$OUT/$1" > "$OUT/$1.log" 2>&1
}
for run in 1 2 3; do
  bench "t2-run$run" 2
  bench "t1-run$run" 1
done
bench avx2-t2 2 EAGLE2_Q4_KERNELS=avx2
bench avx2-t1 1 EAGLE2_Q4_KERNELS=avx2
