#!/usr/bin/env bash
# Stop 39's and 40's device calls (issue 27), `.whl` carried. Stop 39 at 82f6f4e: the codec's
# convolutions as cuBLAS products (engine/batched/conv_products.py). Stop 40: the long ones as
# the implicit-GEMM kernel kernels/causal_conv.py (profile_step times im2col beside it).
#   1: the checkpoints (background) beside the codec, kernel and engine GPU tests; the frame
#      profile at batch 1, 8 and 32; then the other GPU test files with the time left
#   2: the Wyoming door's Poisson rows, every voice kind, 1-40 req/s, 20 s each, --max-streams 48
#   3: the HTTP door's Poisson rows, the same
set -uo pipefail
OUT=${OUT:-/tmp/out}
[ -d /tmp/site/wyoming ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export WHEELS_DONE=1 PYTHONUNBUFFERED=1 PYTHONPATH=/tmp/site:$PWD TRITON_CACHE_DIR="$HOME/.triton/cache"
RATES="--rates 1,10,20,30,40 --seconds 20 --warmup-s 1 --pause-s 0.5 --voices clone,preset,custom_voice"
SERVER="--max-queue 64 --max-streams 48"
case "${1:-1}" in
  1) s=$(date +%s)
     CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckptbg > /dev/null
     mkdir -p "$OUT/tests" "$OUT/profile" "$OUT/tests2"
     OUT="$OUT/tests" TESTS_S=210 TESTS="tests/test_codec_kernels.py tests/test_kernels.py tests/test_engine.py -rf" \
       bash benchmarks/gpu.sh tests | tail -12
     echo "tests $(( $(date +%s) - s )) s"
     timeout -s ABRT 220 python3 -X faulthandler -m benchmarks.profile_step --no-bare --batches 1,8,32 \
       --out "$OUT/profile" > "$OUT/profile/profile.log" 2>&1; echo "profile rc $? at $(( $(date +%s) - s )) s"
     grep -E '^[|]|^Thread|^  File' "$OUT/profile/profile.log" | head -40
     left=$(( 575 - ($(date +%s) - s) )); echo "other tests get $left s"
     [ "$left" -gt 30 ] && OUT="$OUT/tests2" TESTS_S=$left \
       TESTS="tests/test_prefill.py tests/test_prompt.py tests/test_quant.py tests/test_intake.py tests/test_http.py tests/test_checkpoint.py tests/test_lone_breakdown.py -rf" \
       bash benchmarks/gpu.sh tests | tail -14 ;;
  2) OUT="$OUT/w" POISSON_S=430 POISSON_SERVER_ARGS="$SERVER" \
       POISSON_ARGS="$RATES --doors wyoming" bash benchmarks/gpu.sh poisson | tail -22 ;;
  3) OUT="$OUT/h" POISSON_S=430 POISSON_SERVER_ARGS="$SERVER" \
       POISSON_ARGS="$RATES --doors http" bash benchmarks/gpu.sh poisson | tail -22 ;;
esac
