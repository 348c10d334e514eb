#!/usr/bin/env bash
# Issue 26's CPU figures on the GPU machine's CPU, 4 and 8 cores (taskset), in one go (~6-7 min; each
# step has a timeout, LIMITS_S=120 and BENCH_S=180 by default, and the 8-core set runs last):
# a server CPU with more cache and memory bandwidth than a desktop: label its figures so.
#
#   benchmarks/cpu_device.sh            (from the project root; CORES="0-1" to try it on 2 cores)
#
# Builds a random full-size 0.6B CustomVoice checkpoint (costs depend on shapes only) and its
# GGUF files (Q8_0, Q4_0), then for each core set:
#   $OUT/cpu-<n>core/limits.json   python -m benchmarks.cpu_limits: codec FLOPs by stage, each
#                                  codec runtime's ms/frame and GFLOPS on 1, 2 (and n) threads,
#                                  generation bytes per frame per format (PyTorch capped at AVX2)
#   $OUT/cpu-<n>core/results*.json python -m benchmarks.cpu_bench: servers started as users start
#                                  them (GGML at its machine defaults, 1 and 2 clients at once;
#                                  the reference engine beside, 1 client): first audio, speed,
#                                  longest silence, RSS, the load average of each row
#   $OUT/cpu-<n>core/*.log         each step's output
# The GPU machine has no network: the wheels come from .whl (benchmarks/gpu-wheels), which must
# hold realtimetts-qwen-native-cpu 0.4.2 (qwentts.cpp) and gguf 0.19.0 beside the usual ones;
# onnxruntime, torch and transformers are preinstalled there.
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
PY=${PYTHON:-python3}
if [ -d .whl ] && [ -z "${WHEELS_DONE:-}" ]; then  # the GPU machine: no network, wheels carried (WHEELS_DONE: already in /tmp/site)
  $PY -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
fi
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 ONEDNN_MAX_CPU_ISA=AVX2
unset OMP_NUM_THREADS MKL_NUM_THREADS OPENBLAS_NUM_THREADS
$PY -c "import qwentts_cpp_cpu, gguf; print('qwentts.cpp', qwentts_cpp_cpu.QwenLibrary().version())" \
  || { echo "missing wheels in .whl: realtimetts-qwen-native-cpu==0.4.2 gguf==0.19.0 (benchmarks/gpu-wheels)"; exit 1; }
WORK=${WORK:-/tmp/cpu26}
CKPT=$WORK/0.6b/custom_voice
start=$(date +%s)
lscpu | grep -E "Model name|^CPU\(s\)|L3|Flags" | cut -c1-200 > "$OUT/cpu.txt"
$PY -m wyoming_qwen3tts.testing.checkpoint "$CKPT" --type custom_voice --size 0.6b > "$OUT/checkpoint.log" 2>&1 || { tail "$OUT/checkpoint.log"; exit 1; }
for q in Q8_0 Q4_0; do
  $PY -m wyoming_qwen3tts.gguf "$CKPT" "$WORK/gguf/$q" --quant "$q" > "$OUT/gguf-$q.log" 2>&1 &
done
wait
echo "checkpoint and GGUF: $(( $(date +%s) - start )) s"
share=${SHARE_FRAMES:-200}  # Q4_0 vs Q8_0 greedy codes: once (the codes do not depend on the cores)
for cores in ${CORES:-0-3 0-7}; do
  n=$(taskset -c "$cores" nproc)
  dir=$OUT/cpu-${n}core
  mkdir -p "$dir"
  uptime > "$dir/uptime-before.txt"
  threads="1 2"; [ "$n" -gt 2 ] && threads="1 2 $n"
  timeout "${LIMITS_S:-120}" taskset -c "$cores" $PY -m benchmarks.cpu_limits --checkpoint "$CKPT" \
    --gguf-dir "$WORK/gguf" --frames 40 --threads $threads --share-frames "$share" --out "$dir/limits.json" > "$dir/limits.log" 2>&1
  echo "$n cores: limits rc=$? at $(( $(date +%s) - start )) s"
  share=0
  timeout "${BENCH_S:-180}" taskset -c "$cores" $PY -m benchmarks.cpu_bench --out "$dir" --work "$WORK" \
    --frames 25 --sizes 0.6b --clients 1 2 --gguf-dir "$WORK/gguf" > "$dir/bench.log" 2>&1
  echo "$n cores: bench rc=$? at $(( $(date +%s) - start )) s"
  uptime > "$dir/uptime-after.txt"
  tail -3 "$dir/limits.log"; grep -E "^\{'engine'" "$dir/bench.log" | cut -c1-400
done
echo "total $(( $(date +%s) - start )) s"
