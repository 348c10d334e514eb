#!/usr/bin/env bash
# Written at stop 32 for the next GPU session, NOT yet run. Stop 32 had 217 s of device time
# (what stop 31 left): j.sh call 1 ran its memory rows only (4 GiB failed every request in
# cublasCreate; fixed after, in 35c9b0e). Chained device calls (each under 10 min), `.whl`
# carried; 1-3 are about 1,700 s with the cold start, 4 only if time is left:
#   1: every GPU test (the warm-up now builds a prompt on a second thread, and prime checks
#      the free memory: both on the load path of every test), the new 4 GiB test among them
#      (stop 31: 435.8 s for the suite)
#   2: the memory rows at 6 and 4 GiB free (the 4 GiB row seeded with the 6 GiB row's
#      anchors: lena and every clone must be spoken; no CUBLAS_STATUS_ALLOC_FAILED), then
#      j.sh 1's Poisson rows (Wyoming door, clones and presets, 1-40 req/s)
#   3: j.sh 2 (HTTP door, every voice kind; Wyoming door, CustomVoice)
#   4: 8 cores with the new GGML thread defaults (4 threads a stream; predicted ~0.4x)
set -uo pipefail
OUT=${OUT:-/tmp/out}
[ -d /tmp/site/wyoming ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export WHEELS_DONE=1 PYTHONUNBUFFERED=1
case "${1:-1}" in
  1) CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckpt > /dev/null
     TESTS_S=530 bash benchmarks/gpu.sh tests | tail -15 ;;
  2) OUT=/tmp/res-m MEMORY_ARGS="--free 6,4 --time-limit 200" MEMORY_S=260 bash benchmarks/gpu.sh memory > /dev/null
     tar czf "$OUT/m.tgz" -C /tmp/res-m .; cat /tmp/res-m/results/memory.md
     grep -c -E "flash-attn|sox: not found|CUBLAS_STATUS_ALLOC_FAILED" /tmp/memory-bench/server-*.log
     RATES="--rates 1,10,20,30,40 --seconds 20 --warmup-s 1 --pause-s 0.5"
     OUT=/tmp/res-p1 POISSON_S=300 POISSON_ARGS="$RATES --doors wyoming --voices clone,preset" bash benchmarks/gpu.sh poisson
     tar czf "$OUT/p1.tgz" -C /tmp/res-p1 . ;;
  3) bash benchmarks/results/nvidia-h200/calls/j.sh 2 ;;
  4) CORES="0-7" LIMITS_S=1 OUT=/tmp/res-cpu bash benchmarks/cpu_device.sh
     tar czf "$OUT/cpu.tgz" -C /tmp/res-cpu . ;;
esac
