#!/usr/bin/env bash
# Written at stop 30 for the next GPU session, NOT yet run: what stop 30 could not measure.
# Run it as two chained device calls (each under 10 min): `bash next.sh 1`, then `bash next.sh 2`
# within 30 s, so that the second finds the checkpoints and wheels of the first.
#   1: every GPU test (the 8 GiB test and the 4 GiB anchor fix of e694d31/1ec1c9f were never run
#      on a GPU; the 50-swap test was cut by a time limit; the int8 parity test is new)
#   2: memory rows at 8, 6 and 4 GiB free with the current code, then issue 27's breakdown
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=/tmp/res-next; mkdir -p "$R"
[ -d /tmp/site/wyoming ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export WHEELS_DONE=1 PYTHONUNBUFFERED=1
case "${1:-1}" in
  1) CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckptbg > /dev/null
     TESTS="-vv -rfE" TESTS_S=540 OUT=$R/t bash benchmarks/gpu.sh tests > /dev/null
     tar czf "$OUT/t.tgz" -C "$R/t" .; grep -E "passed|failed|FAILED|ERROR" "$R/t/gpu-tests.log" | tail -12 ;;
  2) OUT=$R/m MEMORY_ARGS="--free 8,6,4 --time-limit 260" MEMORY_S=300 bash benchmarks/gpu.sh memory > /dev/null
     tar czf "$OUT/m.tgz" -C "$R/m" .; tail -5 "$R/m/results/memory.md"
     BREAKDOWN_S=240 OUT=$R/b bash benchmarks/gpu.sh breakdown > /dev/null
     tar czf "$OUT/b.tgz" -C "$R/b" .; cat "$R/b/breakdown/lone_breakdown.md" 2>/dev/null | head -30 ;;
esac
