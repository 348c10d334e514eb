#!/usr/bin/env bash
# Issue 50's CPU figures on the GPU machine's idle CPU cores (taskset), in calls of under 9 minutes
# each on one warm machine (its GPU unused). What a call needs stays in .gl/ (git-ignored), which the
# device keeps between calls of one warm machine: the wheels installed into .gl/site, the random
# checkpoints, their GGUF conversions and the exported codec in .gl/c3/data.
#
#   PART=1 benchmarks/cpu_pipeline_device.sh   a random full-size 0.6B CustomVoice checkpoint, its Q8_0
#            GGUF and the codec's ONNX export (.gl/c3/data); the pipeline's two halves timed apart
#            on 4 cores (benchmarks.pipeline_parts, 1 and 2 threads a side); then the engines in
#            process (benchmarks.cpu_engine_bench: no door, so no PyAV to carry): the pipeline
#            (1 and 2 clients, short and long text) on 4 and 2 cores, the wheel (ggml) and the
#            reference engine (1 client, short text) beside it
#
# The call carries the wheels in .whl: the GPU machine's list (benchmarks/gpu-wheels) less
# PyAV and the test clients', with onnx, onnxscript, onnx_ir and ml_dtypes for the export.
# Output: $OUT/cpu-<n>core/{parts.json, engines-<engine>.json, *.log, uptime-*.txt}, $OUT/cpu.txt.
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
engines() {  # CORES "ENGINES" "CLIENTS" "TEXTS" TIMEOUT NAME
  local n; n=$(taskset -c "$1" nproc)
  mkdir -p "$OUT/cpu-${n}core"
  uptime > "$OUT/cpu-${n}core/uptime-before-$6.txt"
  # shellcheck disable=SC2086
  timeout "$5" taskset -c "$1" $PY -m benchmarks.cpu_engine_bench --checkpoint "$WORK/0.6b/custom_voice" --data "$WORK/data" \
    --engines $2 --clients $3 --texts $4 --frames 25 --out "$OUT/cpu-${n}core/engines-$6.json" > "$OUT/cpu-${n}core/engines-$6.log" 2>&1
  echo "$n cores, $6: rc=$? at $(since)"
  uptime > "$OUT/cpu-${n}core/uptime-after-$6.txt"
  grep -h "^{'engine'" "$OUT/cpu-${n}core/engines-$6.log" | cut -c1-260
}
case "${PART:-1}" in
  1) lscpu | grep -E "Model name|^CPU\(s\)|Thread|Core|L2|L3|Flags" | cut -c1-200 > "$OUT/cpu.txt"
     $PY -c "from wyoming_qwen3tts.engine.cpu.native import api; api.load(); print('native ggml api: ok')" || exit 1
     $PY -m wyoming_qwen3tts.testing.checkpoint "$WORK/0.6b/custom_voice" --type custom_voice --size 0.6b \
       > "$OUT/checkpoint-0.6b.log" 2>&1 || { tail "$OUT/checkpoint-0.6b.log"; exit 1; }
     echo "checkpoint at $(since)"
     mkdir -p "$OUT/cpu-4core"
     timeout 150 taskset -c 0-3 $PY -m benchmarks.pipeline_parts --checkpoint "$WORK/0.6b/custom_voice" \
       --data "$WORK/data" --threads 1 2 --frames 25 --out "$OUT/cpu-4core/parts.json" > "$OUT/cpu-4core/parts.log" 2>&1
     echo "4 cores: parts rc=$? at $(since)"; grep "^{'threads'" "$OUT/cpu-4core/parts.log"
     engines 0-3 "pipeline" "1 2" "short long" 120 pipeline
     engines 0-3 "ggml" "1" "short" 90 ggml
     engines 0-1 "pipeline" "1 2" "short long" 120 pipeline
     engines 0-3 "reference" "1" "short" 100 reference
     engines 0-1 "ggml" "1" "short" 100 ggml ;;
esac
echo "total $(since)"
