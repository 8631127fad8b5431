#!/usr/bin/env bash
# The GPU check: in one run on a machine with a CUDA GPU, everything this project can say about the
# GPU. Run from the repository root:
#
#   EAGLE2_CACHE=/path/cache OUT=/path/out bash scripts/gpu_check.sh
#
# Needs: python3 with torch (CUDA), transformers, safetensors, tokenizers, huggingface_hub, numpy
# and the wheels of scripts/gpu_wheels.txt on its path (no network is used), and the embedded
# model's GGUF at $EAGLE2_CACHE/gguf/SmolLM2-135M-Instruct.Q4_1.gguf (step 2 converts it once).
# Writes under $OUT (default ./gpu-out): steps.tsv (each step's exit code and seconds),
# README.md (the machine, the commands, the outcomes), logs/*.log, cuda_lossless.jsonl,
# bench-float32/ and bench-bfloat16/ (summary.json, per_prompt.csv), profile-*.json and traces/*.json.
#
# Steps, in order: nvidia-smi; the model's fetch and conversion; the tests that run on CUDA
# (tests/test_cuda.py); the bench on held-out prompts; the profile; the "Record on the GPU" race as
# trace files. Each step is bounded by `timeout`, a failed one is recorded and the next runs; the
# whole run keeps within GPU_CHECK_BUDGET seconds (default 330), a later step's floor kept for it.
#
# GPU_CHECK_DEVICE=cpu runs the same steps on the CPU, small (the tests run it so, on the tiny
# model: GPU_CHECK_TARGET=FOLDER GPU_CHECK_HEAD=random); GPU_CHECK_DRY_RUN=1 prints the steps only.
set -uo pipefail
cd "$(dirname "$0")/.."

OUT=${OUT:-./gpu-out}
PY=${PYTHON:-python3}
DEVICE=${GPU_CHECK_DEVICE:-cuda}
BUDGET=${GPU_CHECK_BUDGET:-330}
DRY=${GPU_CHECK_DRY_RUN:-0}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"   # the checkout itself, before the carried wheels
export PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
MODEL=()
[ -n "${GPU_CHECK_TARGET:-}" ] && MODEL+=(--target "$GPU_CHECK_TARGET")
[ -n "${GPU_CHECK_HEAD:-}" ] && MODEL+=(--head "$GPU_CHECK_HEAD")
if [ "$DEVICE" = cpu ]; then   # the plumbing, small: a few tokens, one prompt
  TESTS=(tests/test_cuda.py -k cpu); DTYPES=(float32); LIMIT=1; TOKENS=16; PHASES=(--phase-limit 1 --phase-tokens 8)
  RECORD_TOKENS=12
else
  TESTS=(tests/test_cuda.py -m cuda); DTYPES=(bfloat16 float32); LIMIT=4; TOKENS=128; PHASES=(--phase-limit 4 --phase-tokens 64)
  RECORD_TOKENS=64
fi
# The page's shipped traces' prompts (ui/traces.py RECORDINGS), recorded on this device as Replay opens them
RECORDS=("writing-greedy|Write a short poem about a city at night seen from a rooftop."
         "math-greedy|Solve for y: 5y - 3 = 2y + 12.")

mkdir -p "$OUT/logs" "$OUT/traces"
STEPS="$OUT/steps.tsv"
[ "$DRY" = 1 ] || printf 'step\texit\tseconds\ttimeout\n' > "$STEPS"
START=$(date +%s)

# step NAME CAP RESERVE CMD...: CMD for at most CAP seconds, and never into the RESERVE seconds that
# the later steps keep; its output in logs/NAME.log, its exit code (124: timed out) in steps.tsv.
step() {
  local name=$1 cap=$2 reserve=$3; shift 3
  if [ "$DRY" = 1 ]; then printf '%s (%ss):' "$name" "$cap"; printf ' %q' "$@"; echo; return 0; fi
  local left=$(( BUDGET - ($(date +%s) - START) - reserve ))
  local limit=$(( cap < left ? cap : left ))
  if [ "$limit" -lt 5 ]; then
    printf '%s\tskipped\t0\t0\n' "$name" >> "$STEPS"; echo "== $name: skipped (the budget is spent)"; return 0
  fi
  echo "== $name (at most ${limit}s)"
  local t0=$(date +%s) rc=0
  timeout -k 10 "$limit" "$@" > "$OUT/logs/$name.log" 2>&1 || rc=$?
  printf '%s\t%s\t%s\t%s\n' "$name" "$rc" "$(( $(date +%s) - t0 ))" "$limit" >> "$STEPS"
  tail -n 3 "$OUT/logs/$name.log"
  return 0
}

# 1. the GPU, the driver and the torch that runs on it
step nvidia-smi 20 300 nvidia-smi
step environment 40 290 "$PY" -c "
import sys, importlib.metadata as m, torch
print(sys.version.split()[0], 'torch', torch.__version__, 'cuda', torch.version.cuda, 'available', torch.cuda.is_available())
print(torch.cuda.get_device_name() if torch.cuda.is_available() else 'no CUDA device')
for p in ('transformers', 'tokenizers', 'safetensors', 'huggingface_hub', 'numpy', 'pydantic', 'gguf', 'pytest'):
    try:
        print(f'{p}=={m.version(p)}', end=' ')
    except m.PackageNotFoundError:
        print(f'{p} missing', end=' ')
print()"
# 2. the embedded model: its GGUF converted once into the cache folder (a folder target needs none)
if [ -z "${GPU_CHECK_TARGET:-}" ]; then step fetch 120 250 "$PY" -m eagle2 fetch; fi
# 3. the tests that run on CUDA: greedy trees against plain decoding, tiny and real model, fp32 and bf16
step tests 150 160 env EAGLE2_CUDA_REPORT="$OUT/cuda_lossless.jsonl" "$PY" -m pytest -q -p no:cacheprovider -rA \
  --junitxml="$OUT/cuda-tests.xml" "${TESTS[@]}"
# 4. the bench: plain, EAGLE-2 (60, 5, 10), the static tree and the hardware-aware budget, held-out prompts
for dt in "${DTYPES[@]}"; do
  step "bench-$dt" 75 110 "$PY" -m eagle2 bench --device "$DEVICE" --dtype "$dt" "${MODEL[@]}" \
    --prompts assets/prompts/heldout.jsonl --limit "$LIMIT" --max-new-tokens "$TOKENS" \
    --policies plain,eagle2,static,eagle2-auto --out "$OUT/bench-$dt"
done
# 5. the profile: bandwidth, t(N) against one token, a draft call, where a cycle's time goes
for dt in "${DTYPES[@]}"; do
  step "profile-$dt" 60 50 "$PY" -m eagle2 profile --device "$DEVICE" --dtype "$dt" "${MODEL[@]}" "${PHASES[@]}" \
    --out "$OUT/profile-$dt.json"
done
# 6. "Record on the GPU": the page's race on the page's example prompts, as trace files Replay opens
for r in "${RECORDS[@]}"; do
  step "record-${r%%|*}" 45 0 "$PY" -m eagle2 record --device "$DEVICE" "${MODEL[@]}" --prompt "${r#*|}" \
    --max-new-tokens "$RECORD_TOKENS" --out "$OUT/traces/gpu-${r%%|*}.json"
done
[ "$DRY" = 1 ] && exit 0

# The run's record: the machine, the commands and each step's outcome (for benchmarks/<run>/README.md)
{
  echo "# GPU check ($(date -u +%Y-%m-%d), commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown))"
  echo
  echo '```'
  cat "$OUT/logs/environment.log" 2>/dev/null
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>/dev/null
  echo '```'
  echo
  echo "Command: \`OUT=$OUT GPU_CHECK_DEVICE=$DEVICE bash scripts/gpu_check.sh\` ($(( $(date +%s) - START )) s)."
  echo
  echo "| step | exit | seconds | timeout |"
  echo "| --- | --- | --- | --- |"
  tail -n +2 "$STEPS" | while IFS=$'\t' read -r n rc s lim; do echo "| $n | $rc | $s | $lim |"; done
  echo
  for f in "$OUT"/traces/*.json; do [ -f "$f" ] && echo "- trace: $(basename "$f"): $(tail -n 1 "$OUT/logs/record-$(basename "$f" .json | sed 's/^gpu-//').log" 2>/dev/null)"; done
} > "$OUT/README.md"
echo "== done in $(( $(date +%s) - START )) s; $OUT/README.md"
