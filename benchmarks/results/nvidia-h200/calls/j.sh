#!/usr/bin/env bash
# Stop 32's device calls, chained within 30 s of each other on one H200, `.whl` carried:
#   1: next.sh 1's memory rows at 6 and 4 GiB free (lena at 4 GiB after the Anchors.begin fix;
#      no flash-attn / sox banner in the server logs), the CustomVoice checkpoint built beside
#      it, then issue 27's Poisson rows on the Wyoming door for clones and presets
#   2: issue 27's Poisson rows on the HTTP door for every voice kind, and the Wyoming door's
#      CustomVoice rows (1, 10, 20, 30, 40 req/s, 20 s each, 6 s replies, 32 streams)
#   3: next.sh 2: 8 cores with the new GGML thread defaults (4 threads a stream)
set -uo pipefail
OUT=${OUT:-/tmp/out}
[ -d /tmp/site/wyoming ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export WHEELS_DONE=1 PYTHONUNBUFFERED=1
RATES="--rates 1,10,20,30,40 --seconds 20 --warmup-s 1 --pause-s 0.5"
case "${1:-1}" in
  1) CKPT_KINDS="custom_voice" bash benchmarks/gpu.sh ckptbg > /dev/null
     bash benchmarks/results/nvidia-h200/calls/next.sh 1
     OUT=/tmp/res-p1 POISSON_S=330 POISSON_ARGS="$RATES --doors wyoming --voices clone,preset" bash benchmarks/gpu.sh poisson
     tar czf "$OUT/p1.tgz" -C /tmp/res-p1 . ;;
  2) OUT=/tmp/res-p2 POISSON_S=520 POISSON_ARGS="$RATES --doors http,wyoming --voices custom_voice --http-voices clone,preset,custom_voice" bash benchmarks/gpu.sh poisson
     tar czf "$OUT/p2.tgz" -C /tmp/res-p2 . ;;
  3) bash benchmarks/results/nvidia-h200/calls/next.sh 2 ;;
esac
