#!/usr/bin/env bash
# Stop 31 (2026-12-02 17:22-17:45 UTC), at bb2de9b: four device calls, one H200, each started
# within 30 s of the last (the machine stayed warm), `.whl` carried. What each ran:
#   1: bash benchmarks/results/nvidia-h200/calls/next.sh 1   -> ../gpu-tests.log (151 passed, 3 skipped, 435.8 s)
#   2: memory at 8, 6 and 4 GiB free                           -> ../memory*.json, ../memory.md, ../memory-logs/
#   3: bash benchmarks/cpu_device.sh (4 and 8 cores, quiet)   -> ../../cpu-4core/, ../../cpu-8core/
#   4: the lone-request breakdown, 200 s at 1 req/s           -> ../breakdown/
set -uo pipefail
export WHEELS_DONE=1 PYTHONUNBUFFERED=1
R=/tmp/res-next
case "${1:-1}" in
  1) bash benchmarks/results/nvidia-h200/calls/next.sh 1 ;;
  2) OUT=$R/m MEMORY_ARGS="--free 8,6,4 --time-limit 270" MEMORY_S=340 bash benchmarks/gpu.sh memory ;;
  3) OUT=/tmp/res-cpu bash benchmarks/cpu_device.sh ;;
  4) BREAKDOWN_S=215 BREAKDOWN_ARGS="--seconds 200" OUT=$R/b bash benchmarks/gpu.sh breakdown ;;
esac
