#!/usr/bin/env bash
# The GPU acceptance check in one call (about 10 minutes on one GPU): `xling doctor --device
# cuda` (every engine on the GPU, one record each), then the translate, generate and embedding
# benchmarks with their GPU settings, each against its bare engine, and one table of the
# ratios (xling / bare; whole run first, steady state as a diagnostic) at the end, also
# written to $OUT/gpu-acceptance.md with every step's log beside it.
#
#   benchmarks/gpu.sh                 # on a GPU node, from the repository root
#   benchmarks/gpu.sh --cpu           # the same plumbing at toy sizes on the CPU (no GPU)
#
# Models: the tiny ones by default (`xling models tiny`, offline); real ones where the node
# has their weights: NLLB_CT2=/models/nllb-600M-ct2 LLM=Qwen/Qwen2.5-7B-Instruct
# EMBEDDER=BAAI/bge-m3 benchmarks/gpu.sh. Each step has its own time limit (STEP_S) so that
# one hung engine cannot eat the others' time; a step that fails or times out is a row
# saying so, and the exit status is 1.
set -uo pipefail
cd "$(dirname "$0")/.."

MODE=gpu
[ "${1:-}" = "--cpu" ] && MODE=cpu
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python )}
OUT=${OUT:-runs/gpu-acceptance}
NLLB_CT2=${NLLB_CT2:-tiny:nllb_ct2}
LLM=${LLM:-tiny:llama_chat}
EMBEDDER=${EMBEDDER:-tiny:bge_m3}
mkdir -p "$OUT"
TABLE="$OUT/gpu-acceptance.md"
FAILED=0

if [ "$MODE" = gpu ]; then
  DOCTOR=(--device cuda)
  TRANSLATE=(--model "$NLLB_CT2" --device cuda --compute-type int8_float16 --beam-size 4
             --max-batch-tokens 16384 --batch-size 2048 --sentences 20000)
  GENERATE=(--model "$LLM" --num-gpus 1 --dtype auto --prompts 2048 --max-tokens 256)
  DENSE=(--model "$EMBEDDER" --docs 20000 --queries 100000)
  # doctor, translate, generate, dense: 600 s in all. vLLM starts twice in generate (bare
  # and xling) and FlagEmbedding twice in dense, each with its import: they get the most.
  STEP_S=(120 120 180 180)
else
  DOCTOR=(--device cpu --only torch,ctranslate2,faiss)
  TRANSLATE=(--model "$NLLB_CT2" --device cpu --sentences 300 --beam-size 1)
  GENERATE=(--model "$LLM" --prompts 16 --max-tokens 16)
  DENSE=(--model "$EMBEDDER" --docs 300 --queries 1000)
  STEP_S=(300 600 600 600)
fi

# step NAME LIMIT CMD...: run it under its limit, its log in $OUT/NAME.log (and on screen)
step() {
  local name=$1 limit=$2
  shift 2
  echo "== $name: $*"
  timeout --kill-after=20 "$limit" "$@" 2>&1 | tee "$OUT/$name.log"
  local rc=${PIPESTATUS[0]}
  if [ "$rc" -ne 0 ]; then
    FAILED=1
    if [ "$rc" -eq 124 ] || [ "$rc" -eq 137 ]; then
      echo "| $name | did not finish in ${limit} s | | | |" >> "$TABLE.rows"
    else
      echo "| $name | failed (exit $rc, see $name.log) | | | |" >> "$TABLE.rows"
    fi
    return 1
  fi
  # The benchmarks' ratio lines: "[  ]whole run UNIT  bare  xling  ratio" (and "steady"),
  # after an "embedding"/"search" heading in the dense benchmark.
  awk -v name="$name" '
    /^(embedding|search)/ { part = " " $1 }
    /^ *(whole run|steady) [^ ]+ +[0-9.]+ +[0-9.]+ +[0-9.]+ *$/ {
      line = $0; sub(/^ +/, "", line); n = split(line, f, / +/)
      measure = (f[1] == "whole") ? "whole run " f[3] : "steady " f[2]
      printf "| %s%s | %s | %s | %s | %s |\n", name, part, measure, f[n-2], f[n-1], f[n]
    }
    /^ *start-up s +[0-9.]+ +[0-9.]+ *$/ {
      line = $0; sub(/^ +/, "", line); n = split(line, f, / +/)
      printf "| %s%s | start-up s | %s | %s | |\n", name, part, f[n-1], f[n]
    }' "$OUT/$name.log" >> "$TABLE.rows"
}

rm -f "$TABLE.rows"
$PY -m xling.cli models tiny > /dev/null || { echo "xling models tiny failed"; exit 1; }
if step doctor "${STEP_S[0]}" $PY -m xling.cli doctor "${DOCTOR[@]}"; then
  echo "| doctor | every engine works (${DOCTOR[*]}) | | | |" >> "$TABLE.rows"
fi
step translate "${STEP_S[1]}" $PY benchmarks/translate.py "${TRANSLATE[@]}"
step generate "${STEP_S[2]}" $PY benchmarks/generate.py "${GENERATE[@]}"
step dense "${STEP_S[3]}" $PY benchmarks/dense.py "${DENSE[@]}"

{
  echo "# GPU acceptance ($MODE, $(date -u +%Y-%m-%dT%H:%MZ), $(hostname))"
  echo
  if [ "$MODE" = gpu ] && command -v nvidia-smi > /dev/null; then
    echo "GPU: $(nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | head -1)"
    echo
  fi
  echo "Models: $NLLB_CT2, $LLM, $EMBEDDER. Ratio: xling / bare engine (1.00 = no overhead)."
  echo
  echo "| step | measure | bare | xling | ratio |"
  echo "|---|---|---:|---:|---:|"
  cat "$TABLE.rows"
} > "$TABLE"
rm -f "$TABLE.rows"
echo
cat "$TABLE"
exit $FAILED
