#!/usr/bin/env bash
# Stop 34's device calls, chained within 30 s of each other on one H200, `.whl` carried:
#   1: issue 27's Poisson rows on the HTTP door, clones and presets, 1-40 req/s
#   2: issue 27's Poisson rows for CustomVoice on both doors, 1-40 req/s; then capacity: a
#      server with 64 streams (and room for the connections and queue) at 30, 40 and 50 req/s
#   3: issue 26's 8-core CPU run with the machine-based GGML defaults (next.sh 4)
set -uo pipefail
OUT=${OUT:-/tmp/out}
[ -d /tmp/site/wyoming ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export WHEELS_DONE=1 PYTHONUNBUFFERED=1
RATES="--rates 1,10,20,30,40 --seconds 20 --warmup-s 1 --pause-s 0.5"
case "${1:-1}" in
  1) OUT=/tmp/res-p3 POISSON_S=330 POISSON_ARGS="$RATES --doors http --voices clone,preset" bash benchmarks/gpu.sh poisson
     tar czf "$OUT/p3.tgz" -C /tmp/res-p3 . ;;
  2) OUT=/tmp/res-p4 POISSON_S=330 POISSON_ARGS="$RATES --doors wyoming,http --voices custom_voice" bash benchmarks/gpu.sh poisson
     OUT=/tmp/res-p5 POISSON_S=150 POISSON_SERVER_ARGS="--max-streams 64 --max-queue 256 --max-connections 256" \
       POISSON_ARGS="--rates 30,40,50 --seconds 20 --warmup-s 1 --pause-s 0.5 --doors wyoming --voices clone" bash benchmarks/gpu.sh poisson
     tar czf "$OUT/p4.tgz" -C /tmp/res-p4 . ; tar czf "$OUT/p5.tgz" -C /tmp/res-p5 . ;;
  3) bash benchmarks/results/nvidia-h200/calls/next.sh 4 ;;
esac
