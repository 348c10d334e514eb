#!/usr/bin/env bash
# Stop 36's device calls (issue 27: a cheaper frame), `.whl` carried; 1-3 each on a fresh
# H200, 4 chained to 3 (within 30 s, the machine still warm):
#   1: the kernel tests (pytest -m gpu tests/test_kernels.py); the frame profile at batch 1
#      and 32 with the fused matrix products; the products' sweep (cuBLAS against
#      fused_linear tiles, GPU time from graphs); the same profile with QWEN3TTS_MATMUL=cublas
#   2: after choosing fused products by the sweep (one row only) and the codec's SnakeBeta
#      kernel: every GPU test but the memory ones; the frame profile, fused and cublas (the codec on its kernels in both)
#      (the tests were cut at 250 s after 155 of 171, all passed; the profiles at batch 1 only: the
#      checkpoints were still being built)
#   3: after the one-kernel rotary + attention (kernels/rope_attention.py): the kernel, codec,
#      engine, prefill, prompt, quant and breakdown GPU tests (the 16 call 2 did not reach among
#      them); the frame profile at batch 1 and 32
#   4: (chained) the Wyoming door's Poisson rows, every voice kind, 1-30 req/s: cut by the
#      budget before the results were copied from /tmp/res-w into $OUT (nothing came back):
#      write into $OUT directly next time
# For the next session (not run), everything written straight into $OUT:
#   5: the checkpoints (in the foreground: the profile waits for them otherwise); the 16 GPU
#      tests call 2 did not reach, and the engine's; the frame profile at batch 1 and 32
#   6: (chained) the Wyoming door's Poisson rows, every voice kind, 1-40 req/s
#   7: (chained) the HTTP door's Poisson rows, every voice kind, 1-30 req/s
# Tenth session (PDL: programmatic dependent launch of every Triton kernel, QWEN3TTS_PDL):
#   8: the checkpoints; the kernel, codec-kernel and engine GPU tests (parity of PDL and of the
#      frame-embedding, gathered-projection and rotary-table changes); the frame profile at
#      batch 1 and 32 with PDL (the default), then with QWEN3TTS_PDL=0; the prefill, prompt,
#      quant and breakdown GPU tests in the time left
#   9: (chained) the Wyoming door's Poisson rows, every voice kind, 1-40 req/s
#  10: (chained) the HTTP door's Poisson rows, every voice kind, 1-30 req/s
#  PDL was the default when 8 and 11 ran; it is opt-in (QWEN3TTS_PDL=1) since, after the hang below.
#  After 11, three short diagnostic calls on the warm machine: profile_step --batches 8 with
#   QWEN3TTS_PDL=0 and with PDL (both finished), --batches 16 with QWEN3TTS_PDL=0 (finished),
#   --batches 32 with PDL under `timeout -s ABRT 75` and faulthandler: hung in _deliver's
#   event synchronize (a step that never completed)
#  (8 ran: batch 1 only in both profiles, the time limits cut batch 32; the tests showed no
#   failure but were cut at their limits; the machine was given back before 9 could follow)
#  11: on a fresh machine, the budget's last call: the checkpoints, the profile at batch 32,
#      then the Wyoming door's Poisson rows (15 s each) in the time left
set -uo pipefail
OUT=${OUT:-/tmp/out}
[ -d /tmp/site/wyoming ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export WHEELS_DONE=1 PYTHONUNBUFFERED=1
case "${1:-1}" in
  1) CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckptbg > /dev/null
     TESTS_S=100 TESTS="tests/test_kernels.py" bash benchmarks/gpu.sh tests | tail -8
     OUT=/tmp/res-p PROFILE_S=150 PROFILE_ARGS="--no-bare --batches 1,32" bash benchmarks/gpu.sh profile | tail -30
     OUT=/tmp/res-l LINEAR_S=140 LINEAR_ARGS="--tiles" bash benchmarks/gpu.sh linear | tail -75
     mkdir -p /tmp/res-pc; QWEN3TTS_MATMUL=cublas OUT=/tmp/res-pc PROFILE_S=110 PROFILE_ARGS="--no-bare --batches 1,32" bash benchmarks/gpu.sh profile | tail -16
     tar czf "$OUT/n1.tgz" -C /tmp res-p res-l res-pc ;;
  2) CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckptbg > /dev/null
     TESTS_S=250 TESTS="--ignore=tests/test_memory_gpu.py -rf" bash benchmarks/gpu.sh tests | tail -25
     OUT=/tmp/res-p PROFILE_S=120 PROFILE_ARGS="--no-bare --batches 1,32" bash benchmarks/gpu.sh profile | tail -5
     mkdir -p /tmp/res-pc; QWEN3TTS_MATMUL=cublas OUT=/tmp/res-pc PROFILE_S=90 PROFILE_ARGS="--no-bare --batches 1,32" bash benchmarks/gpu.sh profile | tail -5
     tar czf "$OUT/n2.tgz" -C /tmp res-p res-pc ;;
  3) CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckptbg > /dev/null
     TESTS_S=180 TESTS="tests/test_kernels.py tests/test_codec_kernels.py tests/test_engine.py tests/test_prefill.py tests/test_prompt.py tests/test_quant.py tests/test_lone_breakdown.py -rf" bash benchmarks/gpu.sh tests | tail -15
     OUT=/tmp/res-p PROFILE_S=170 PROFILE_ARGS="--no-bare --batches 1,32" bash benchmarks/gpu.sh profile | grep -E "^\||whole_ms" | tail -8
     tar czf "$OUT/n3.tgz" -C /tmp res-p ;;
  4) OUT=/tmp/res-w POISSON_S=420 POISSON_ARGS="--rates 1,10,20,30 --seconds 20 --warmup-s 1 --pause-s 0.5 --doors wyoming --voices clone,preset,custom_voice" bash benchmarks/gpu.sh poisson
     tar czf "$OUT/w.tgz" -C /tmp/res-w . ;;
  5) s=$(date +%s); CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckpt > /dev/null; echo "ckpt $(( $(date +%s) - s )) s"
     TESTS_S=200 TESTS="tests/test_lone_breakdown.py tests/test_prefill.py tests/test_prompt.py tests/test_quant.py tests/test_engine.py -rf" bash benchmarks/gpu.sh tests | tail -12
     OUT="$OUT/profile" PROFILE_S=150 PROFILE_ARGS="--no-bare --batches 1,32" bash benchmarks/gpu.sh profile | grep -E "^\\|" ;;
  6) OUT="$OUT/w" POISSON_S=480 POISSON_ARGS="--rates 1,10,20,30,40 --seconds 20 --warmup-s 1 --pause-s 0.5 --doors wyoming --voices clone,preset,custom_voice" bash benchmarks/gpu.sh poisson ;;
  7) OUT="$OUT/h" POISSON_S=330 POISSON_ARGS="--rates 1,10,20,30 --seconds 20 --warmup-s 1 --pause-s 0.5 --doors http --voices clone,preset,custom_voice" bash benchmarks/gpu.sh poisson ;;
  8) s=$(date +%s); CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckpt > /dev/null; echo "ckpt $(( $(date +%s) - s )) s"
     mkdir -p "$OUT/tests1" "$OUT/profile" "$OUT/profile-nopdl" "$OUT/tests2"
     OUT="$OUT/tests1" TESTS_S=170 TESTS="tests/test_kernels.py tests/test_codec_kernels.py tests/test_engine.py -rf" bash benchmarks/gpu.sh tests | tail -8
     echo "tests1 $(( $(date +%s) - s )) s"
     OUT="$OUT/profile" PROFILE_S=130 PROFILE_ARGS="--no-bare --batches 1,32" bash benchmarks/gpu.sh profile | grep -E "^\\|"
     echo "profile $(( $(date +%s) - s )) s"
     QWEN3TTS_PDL=0 OUT="$OUT/profile-nopdl" PROFILE_S=110 PROFILE_ARGS="--no-bare --batches 1,32" bash benchmarks/gpu.sh profile | grep -E "^\\|"
     left=$(( 580 - ($(date +%s) - s) )); echo "tests2 get $left s"
     OUT="$OUT/tests2" TESTS_S=$left TESTS="tests/test_prefill.py tests/test_prompt.py tests/test_quant.py tests/test_lone_breakdown.py -rf" bash benchmarks/gpu.sh tests | tail -8 ;;
  9) export TRITON_CACHE_DIR="$HOME/.triton/cache"; OUT="$OUT/w" POISSON_S=470 POISSON_ARGS="--rates 1,10,20,30,40 --seconds 20 --warmup-s 1 --pause-s 0.5 --doors wyoming --voices clone,preset,custom_voice" bash benchmarks/gpu.sh poisson ;;
  10) export TRITON_CACHE_DIR="$HOME/.triton/cache"; OUT="$OUT/h" POISSON_S=380 POISSON_ARGS="--rates 1,10,20,30 --seconds 20 --warmup-s 1 --pause-s 0.5 --doors http --voices clone,preset,custom_voice" bash benchmarks/gpu.sh poisson ;;
  11) s=$(date +%s); export TRITON_CACHE_DIR="$HOME/.triton/cache"
      CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckpt > /dev/null; echo "ckpt $(( $(date +%s) - s )) s"
      mkdir -p "$OUT/profile32"
      OUT="$OUT/profile32" PROFILE_S=170 PROFILE_ARGS="--no-bare --batches 32" bash benchmarks/gpu.sh profile > /dev/null
      grep -E '^[|]' "$OUT/profile32/profile.log"; echo "profile $(( $(date +%s) - s )) s"
      left=$(( 560 - ($(date +%s) - s) )); echo "poisson gets $left s"
      OUT="$OUT/w" POISSON_S=$left POISSON_ARGS="--rates 1,10,20,30,40 --seconds 15 --warmup-s 1 --pause-s 0.5 --doors wyoming --voices clone,preset,custom_voice" bash benchmarks/gpu.sh poisson | tail -30 ;;
esac
