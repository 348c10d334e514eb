#!/usr/bin/env bash
# Issue 50's CPU figures on the GPU machine's idle CPU cores (taskset), in calls of under 9 minutes
# each on one warm machine (its GPU unused). What a call needs stays in .gl/ (git-ignored), which the
# device keeps between calls of one warm machine: the wheels installed into .gl/site, the random
# checkpoints, their GGUF conversions and the exported codec in .gl/c3/data.
#
#   PART=1 benchmarks/cpu_pipeline_device.sh   checkpoints (0.6B, 1.7B CustomVoice), their Q8_0 GGUF
#                                              and the codec's ONNX export; the pipeline's two halves
#                                              timed apart (benchmarks.pipeline_parts) on 4 and 2 cores
#   PART=2 ...                                 benchmarks.cpu_bench on 4 cores (taskset -c 0-3): the
#                                              pipeline, wheel (ggml) and reference engines, 0.6B,
#                                              1 and 2 clients (the reference: 1)
#   PART=3 ...                                 the same on 2 cores (0-1); then 1.7B on 4 cores: the
#                                              pipeline (1 and 2 clients) and the wheel engine
#
# Each call carries the wheels it still lacks in .whl (the device's 64 MiB carry holds the
# working tree and about 55 MiB of wheels): PART=1 everything but PyAV, with onnx, onnxscript,
# onnx_ir and ml_dtypes for the export; PART=2 PyAV (the server imports it).
# Output: $OUT/cpu-<n>core/{parts.json, results.json, results-detail.json, *.log}, $OUT/cpu.txt.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
SITE=$PWD/.gl/site
WORK=$PWD/.gl/c3
mkdir -p "$SITE" "$WORK"
if [ -d .whl ] && ls .whl/*.whl > /dev/null 2>&1; then
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$SITE" .whl/*.whl 2>&1 \
    | grep -v "already exists\|WARNING: Target directory" || true
fi
export PYTHONPATH=$SITE:$PWD PYTHONUNBUFFERED=1 ONEDNN_MAX_CPU_ISA=AVX2
unset OMP_NUM_THREADS MKL_NUM_THREADS OPENBLAS_NUM_THREADS
start=$(date +%s)
since() { echo "$(( $(date +%s) - start )) s"; }
bench() {  # CORES SIZE FRAMES "ENGINES" "CLIENTS" [TIMEOUT]
  local n; n=$(taskset -c "$1" nproc)
  local dir=$OUT/cpu-${n}core/$2
  mkdir -p "$dir"
  uptime > "$dir/uptime-before.txt"
  # shellcheck disable=SC2086
  timeout "${6:-300}" taskset -c "$1" $PY -m benchmarks.cpu_bench --out "$dir" --work "$WORK" --sizes "$2" \
    --frames "$3" --engines $4 --clients $5 > "$dir/bench.log" 2>&1
  echo "$n cores, $2: bench rc=$? at $(since)"
  uptime > "$dir/uptime-after.txt"
  grep -E "^\{'engine'" "$dir/bench.log" | cut -c1-330
}
case "${PART:-1}" in
  1) lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|L2|L3|Flags" | cut -c1-200 > "$OUT/cpu.txt"
     $PY -c "from wyoming_qwen3tts.engine.cpu.native import api; api.load(); print('native ggml api: ok')" || exit 1
     for size in 0.6b full; do
       $PY -m wyoming_qwen3tts.testing.checkpoint "$WORK/$size/custom_voice" --type custom_voice --size "$size" \
         > "$OUT/checkpoint-$size.log" 2>&1 || { tail "$OUT/checkpoint-$size.log"; exit 1; }
     done
     echo "checkpoints at $(since)"
     for cores in 0-3 0-1; do
       n=$(taskset -c "$cores" nproc); mkdir -p "$OUT/cpu-${n}core"
       threads="1 2"; [ "$n" -gt 2 ] || threads="1"
       # shellcheck disable=SC2086
       timeout 200 taskset -c "$cores" $PY -m benchmarks.pipeline_parts --checkpoint "$WORK/0.6b/custom_voice" \
         --data "$WORK/data" --threads $threads --frames 30 --out "$OUT/cpu-${n}core/parts.json" \
         > "$OUT/cpu-${n}core/parts.log" 2>&1
       echo "$n cores: parts rc=$? at $(since)"; grep "^{'threads'" "$OUT/cpu-${n}core/parts.log"
     done
     timeout 240 taskset -c 0-3 $PY -m benchmarks.pipeline_parts --checkpoint "$WORK/full/custom_voice" \
       --data "$WORK/data" --threads 2 --frames 20 --out "$OUT/cpu-4core/parts-1.7b.json" > "$OUT/cpu-4core/parts-1.7b.log" 2>&1
     echo "4 cores 1.7B: parts rc=$? at $(since)"; grep "^{'threads'" "$OUT/cpu-4core/parts-1.7b.log"
     tail -3 "$OUT/cpu-4core/parts-1.7b.log" ;;
  2) bench 0-3 0.6b 25 "pipeline ggml reference" "1 2" 500 ;;
  3) bench 0-1 0.6b 25 "pipeline ggml reference" "1 2" 330
     bench 0-3 full 25 "pipeline ggml" "1 2" 200 ;;
esac
echo "total $(since)"
