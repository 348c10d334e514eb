#!/usr/bin/env bash
# Stop 33's device calls (next.sh regrouped so the 4 GiB evidence comes first), chained
# within 30 s of each other on one H200, `.whl` carried:
#   1: the memory rows at 6 and 4 GiB free, then tests/test_memory_gpu.py (the new 4 GiB
#      test of 13 clips among them); the CustomVoice checkpoint built in the background
#   2: every other GPU test, then issue 27's Poisson rows on the Wyoming door (clones, presets)
#   3: issue 27's Poisson rows on the HTTP door, every voice kind (j.sh 2), if time is left
set -uo pipefail
OUT=${OUT:-/tmp/out}
[ -d /tmp/site/wyoming ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export WHEELS_DONE=1 PYTHONUNBUFFERED=1
RATES="--rates 1,10,20,30,40 --seconds 20 --warmup-s 1 --pause-s 0.5"
case "${1:-1}" in
  1) CKPT_KINDS="custom_voice" bash benchmarks/gpu.sh ckptbg > /dev/null
     OUT=/tmp/res-m MEMORY_ARGS="--free 6,4 --time-limit 200" MEMORY_S=260 bash benchmarks/gpu.sh memory > /dev/null
     tar czf "$OUT/m.tgz" -C /tmp/res-m .; cat /tmp/res-m/results/memory.md
     grep -c -E "flash-attn|sox: not found|CUBLAS_STATUS_ALLOC_FAILED" /tmp/memory-bench/server-*.log
     TESTS="tests/test_memory_gpu.py" TESTS_S=290 bash benchmarks/gpu.sh tests | tail -14 ;;
  2) TESTS_K="not test_memory_gpu" TESTS_S=260 bash benchmarks/gpu.sh tests | tail -14
     OUT=/tmp/res-p1 POISSON_S=280 POISSON_ARGS="$RATES --doors wyoming --voices clone,preset" bash benchmarks/gpu.sh poisson
     tar czf "$OUT/p1.tgz" -C /tmp/res-p1 . ;;
  3) bash benchmarks/results/nvidia-h200/calls/j.sh 2 ;;
esac
