#!/usr/bin/env bash
# Stop 35's device calls (issue 27: prompts built from cached pieces), chained within 30 s
# of each other on one H200, `.whl` carried:
#   1: the full-size checkpoints; every GPU test but the memory ones (the prompt builder's
#      CUDA variant among them); the lone-request breakdown, 200 requests at 1 req/s
#   2: the Wyoming door's Poisson rows, every voice kind, 1-40 req/s
#   3: the HTTP door's Poisson rows, every voice kind, 1-30 req/s (the machine was taken back
#      during the first try, which had 40 too; a fresh one had less time left). Not run:
#      no machine for 10 min, and 4 measured the next change instead
#   5: (4 had no machine either: 336 s left) the same change, CustomVoice alone on a server
#      of its own (the breakdown stage's), Wyoming, 1, 10 and 20 req/s
#   4: after the engine began to wait for a prompt being built (stages.intake.BUILD_HOLD_S):
#      the Wyoming door's Poisson rows, clone and CustomVoice, 1-30 req/s
set -uo pipefail
OUT=${OUT:-/tmp/out}
[ -d /tmp/site/wyoming ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export WHEELS_DONE=1 PYTHONUNBUFFERED=1
RATES="--rates 1,10,20,30,40 --seconds 20 --warmup-s 1 --pause-s 0.5"
case "${1:-1}" in
  1) s=$(date +%s); CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckpt > /dev/null; echo "ckpt $(( $(date +%s) - s )) s"
     TESTS_S=210 TESTS="--ignore=tests/test_memory_gpu.py" bash benchmarks/gpu.sh tests | tail -12
     OUT=/tmp/res-b BREAKDOWN_S=240 bash benchmarks/gpu.sh breakdown
     tar czf "$OUT/b.tgz" -C /tmp/res-b . ;;
  2) OUT=/tmp/res-w POISSON_S=480 POISSON_ARGS="$RATES --doors wyoming --voices clone,preset,custom_voice" bash benchmarks/gpu.sh poisson
     tar czf "$OUT/w.tgz" -C /tmp/res-w . ;;
  4) OUT=/tmp/res-w2 POISSON_S=330 POISSON_ARGS="--rates 1,10,20,30 --seconds 20 --warmup-s 1 --pause-s 0.5 --doors wyoming --voices clone,custom_voice" bash benchmarks/gpu.sh poisson
     tar czf "$OUT/w2.tgz" -C /tmp/res-w2 . ;;
  5) OUT=/tmp/res-b2 BREAKDOWN_S=150 BREAKDOWN_ARGS="--rates 1,10,20 --seconds 20 --warmup-s 1 --pause-s 0.5" bash benchmarks/gpu.sh breakdown
     tar czf "$OUT/b2.tgz" -C /tmp/res-b2 . ;;
  3) OUT=/tmp/res-h POISSON_S=300 POISSON_ARGS="${RATES/,40/} --doors http --voices clone,preset,custom_voice" bash benchmarks/gpu.sh poisson
     tar czf "$OUT/h.tgz" -C /tmp/res-h . ;;
esac
