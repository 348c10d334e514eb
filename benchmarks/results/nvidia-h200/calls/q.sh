#!/usr/bin/env bash
# Stop 41's device calls (issue 27), `.whl` carried. The causal convolutions' columns built by
# one kernel (kernels/im2col.py, QWEN3TTS_CONV=im2col, the new default) instead of PyTorch's
# concatenation and strided copy (QWEN3TTS_CONV=copy); pytest-xdist spreads the GPU tests.
#   1: the checkpoints (background) beside the codec and kernel GPU tests (4 workers); the
#      frame profile at batch 1, 8 and 32 (every convolution mode timed); the profile again
#      with programmatic dependent launch on every graph (QWEN3TTS_PDL=1), batch 8 and 32
#   2: the whole of `pytest -m gpu`: every file but test_memory_gpu.py over 4 workers (the
#      full-size checkpoints building beside them), then test_memory_gpu.py alone (its tests
#      hold the rest of the GPU from another process, on those checkpoints)
#   3: the Poisson rows of both doors, every voice kind, 1-40 req/s, 10 s each
#   4: (after the codec transformer's keys became a ring, kernels/rope_attention.py's window)
#      the voice_design checkpoint (background) beside the codec and engine GPU tests (4
#      workers); the frame profile at batch 1 and 32
# Stop 42 (no device was lent; written for the next session): the codec decode's new kernels
# (kernels/codebooks.py, kernels/rope_tables.py, the past moved on inside kernels/im2col.py)
# are tested by call 1's GPU tests and timed by its profile; call 5 sweeps the wider
# fused_linear tiles at 8-32 rows for the predictor's products (benchmarks/linear_sweep.py).
#   5: the linear sweep, predictor shapes, rows 8, 16 and 32, every tile
# Stop 44: call 6 is call 1 with the PDL profile (timed in stop 41) replaced by call 5's sweep
# in the time left.
#   7: (after call 6 found the im2col kernel's past update refused by Triton's compiler and the
#      codebook test's reference in TF32) the codec and kernel GPU tests; the frame profile at
#      batch 1, 8 and 32, then at 8 and 32 with QWEN3TTS_WIDE_TILES=1 (call 6's sweep: the
#      predictor's residual products fused at 5-32 rows) and the fused step's codes with it;
#      then the rest of `pytest -m gpu` but test_memory_gpu.py in the time left (WALL s in all,
#      585 unless set: a session short of device time sets less)
#   8: test_memory_gpu.py alone (its full-size checkpoints built by call 7)
#   9: (for the next session) the frame profile at batch 1, 8 and 32 with the engine's
#      convolutions QWEN3TTS_CONV=folded (call 7: the decode 1.96 ms against im2col's 2.14 at
#      batch 32, 1.01 against 1.06 at 8, 0.75 against 0.68 at 1), beside the default
# Stop 45 (bdce9e2: the attention kernels request each block's keys and values before the
# previous block's arithmetic, and rope_attention attends this step's key from registers and
# writes the cache last; the codec's convolutions QWEN3TTS_CONV=auto: folded from 8 rows):
#  10: the checkpoints (background) beside the codec and kernel GPU tests; the frame profile at
#      batch 1, 8 and 32; the same at 8 and 32 with QWEN3TTS_CONV=im2col (stop 44's decode) for
#      the loop's comparison; the rest of `pytest -m gpu` but the memory tests in the time left
#  11: the Poisson rows of both doors, every voice kind, 1-40 req/s, 10 s each (call 3)
#  12: test_memory_gpu.py alone (call 8)
#  13: (not run: no machine was lent after call 10) would have timed the attention loop's forms;
#      the prefetching loop was reverted to stop 44's kernel (call 10: 2-3x slower on the talker's
#      cache), and its forms (QWEN3TTS_ATTENTION, benchmarks/attention_sweep.py) are in git
#      history (commits bdce9e2 and dcbc66d) for a session with a GPU to time
#  14: (for the next session) the frame profile at batch 1, 8 and 32 of stop 44's attention with
#      QWEN3TTS_CONV=auto (folded from 8 rows: call 10's loop 8.21 against im2col's 8.43 ms at
#      batch 32), and at 32 with QWEN3TTS_CONV=im2col beside it; the attention GPU tests
set -uo pipefail
source "$(dirname "$0")/prelude.sh"
case "${1:-1}" in
  1) CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckptbg > /dev/null
     mkdir -p "$OUT/tests"
     OUT="$OUT/tests" TESTS_S=200 TESTS="tests/test_codec_kernels.py tests/test_kernels.py -n 4 -rf" \
       bash benchmarks/gpu.sh tests | tail -8
     echo "tests at $(since)"
     profile "$OUT/profile" 220 1,8,32
     QWEN3TTS_PDL=1 profile "$OUT/profile-pdl" $(( 585 - ($(date +%s) - s) )) 8,32 ;;
  2) CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckptbg > /dev/null
     mkdir -p "$OUT/tests" "$OUT/memory"
     timeout 320 python3 -m pytest -m gpu -q -p no:cacheprovider --durations=8 -n 4 -rfs \
       --ignore tests/test_memory_gpu.py 2>&1 | tee "$OUT/tests/gpu-tests.log" | tail -16
     echo "tests at $(since)"
     for kind in voice_design base; do  # test_memory_gpu.py skips without them: wait for the builders
       python3 -m wyoming_qwen3tts.testing.checkpoint ".ckpt/full/$kind" --type "$kind" --size full > /dev/null
     done
     echo "checkpoints at $(since)"
     timeout $(( 585 - ($(date +%s) - s) )) python3 -m pytest -m gpu -q -p no:cacheprovider --durations=8 -rf \
       tests/test_memory_gpu.py 2>&1 | tee "$OUT/memory/gpu-tests.log" | tail -12
     echo "memory tests at $(since)" ;;
  3) for door in wyoming http; do
       OUT="$OUT/$door" POISSON_S=270 POISSON_SERVER_ARGS="--max-queue 64 --max-streams 48" \
         POISSON_ARGS="--rates 1,10,20,30,40 --seconds 10 --warmup-s 1 --pause-s 0.5 --voices clone,preset,custom_voice --doors $door" \
         bash benchmarks/gpu.sh poisson | tail -20
     done ;;
  4) python3 -m wyoming_qwen3tts.testing.checkpoint .ckpt/full/voice_design --type voice_design --size full > /tmp/ckpt.log 2>&1 &
     mkdir -p "$OUT/tests"
     OUT="$OUT/tests" TESTS_S=150 TESTS="tests/test_codec_kernels.py tests/test_engine.py -n 4 -rf" \
       bash benchmarks/gpu.sh tests | tail -8
     echo "tests at $(since)"
     wait
     profile "$OUT/profile" $(( 265 - ($(date +%s) - s) )) 1,32 ;;
  5) mkdir -p "$OUT/linear"
     timeout 580 python3 -m benchmarks.linear_sweep --out "$OUT/linear" --rows 8,16,32 --tiles \
       --tile-rows 8,16,32 --shapes predictor > "$OUT/linear/sweep.log" 2>&1; echo "sweep rc $? at $(since)"
     tail -20 "$OUT/linear/sweep.log" ;;
  6) CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckptbg > /dev/null
     mkdir -p "$OUT/tests" "$OUT/linear"
     OUT="$OUT/tests" TESTS_S=200 TESTS="tests/test_codec_kernels.py tests/test_kernels.py -n 4 -rf" \
       bash benchmarks/gpu.sh tests | tail -8
     echo "tests at $(since)"
     profile "$OUT/profile" 220 1,8,32
     timeout $(( 585 - ($(date +%s) - s) )) python3 -m benchmarks.linear_sweep --out "$OUT/linear" --rows 8,16,32 \
       --tiles --tile-rows 8,16,32 --shapes predictor > "$OUT/linear/sweep.log" 2>&1; echo "sweep rc $? at $(since)"
     tail -20 "$OUT/linear/sweep.log" ;;
  7) CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckptbg > /dev/null
     mkdir -p "$OUT/tests" "$OUT/rest"
     OUT="$OUT/tests" TESTS_S=200 TESTS="tests/test_codec_kernels.py tests/test_kernels.py -n 4 -rf" \
       bash benchmarks/gpu.sh tests | tail -8
     echo "tests at $(since)"
     profile "$OUT/profile" 200 1,8,32
     QWEN3TTS_WIDE_TILES=1 profile "$OUT/profile-wide" 120 8,32
     QWEN3TTS_WIDE_TILES=1 timeout 100 python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_kernels.py \
       -k "fused_step or wide" 2>&1 | tail -4; echo "wide step tests at $(since)"
     timeout $(( ${WALL:-585} - ($(date +%s) - s) )) python3 -m pytest -m gpu -q -p no:cacheprovider --durations=8 -n 4 -rfs \
       --ignore tests/test_memory_gpu.py --ignore tests/test_codec_kernels.py --ignore tests/test_kernels.py \
       2>&1 | tee "$OUT/rest/gpu-tests.log" | tail -16
     echo "rest at $(since)" ;;
  8) mkdir -p "$OUT/memory"
     for kind in voice_design base; do
       python3 -m wyoming_qwen3tts.testing.checkpoint ".ckpt/full/$kind" --type "$kind" --size full > /dev/null
     done
     echo "checkpoints at $(since)"
     timeout $(( 585 - ($(date +%s) - s) )) python3 -m pytest -m gpu -q -p no:cacheprovider --durations=8 -rf \
       tests/test_memory_gpu.py 2>&1 | tee "$OUT/memory/gpu-tests.log" | tail -12
     echo "memory tests at $(since)" ;;
  9) profile "$OUT/profile" 200 1,8,32
     QWEN3TTS_CONV=folded profile "$OUT/profile-folded" 200 1,8,32 ;;
  10) CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckptbg > /dev/null
     mkdir -p "$OUT/tests" "$OUT/rest"
     OUT="$OUT/tests" TESTS_S=200 TESTS="tests/test_codec_kernels.py tests/test_kernels.py -n 4 -rf" \
       bash benchmarks/gpu.sh tests | tail -8
     echo "tests at $(since)"
     profile "$OUT/profile" 200 1,8,32
     QWEN3TTS_CONV=im2col profile "$OUT/profile-im2col" 120 8,32
     timeout $(( ${WALL:-585} - ($(date +%s) - s) )) python3 -m pytest -m gpu -q -p no:cacheprovider --durations=8 -n 4 -rfs \
       --ignore tests/test_memory_gpu.py --ignore tests/test_codec_kernels.py --ignore tests/test_kernels.py \
       2>&1 | tee "$OUT/rest/gpu-tests.log" | tail -16
     echo "rest at $(since)" ;;
  11) bash "$0" 3 ;;
  14) CKPT_KINDS="voice_design" bash benchmarks/gpu.sh ckptbg > /dev/null
     mkdir -p "$OUT/tests"
     timeout 90 python3 -m pytest -m gpu -q -p no:cacheprovider -rf tests/test_kernels.py -k "attention" \
       2>&1 | tee "$OUT/tests/gpu-tests.log" | tail -3; echo "tests at $(since)"
     profile "$OUT/profile" 200 1,8,32
     QWEN3TTS_CONV=im2col profile "$OUT/profile-im2col" $(( ${WALL:-585} - ($(date +%s) - s) )) 32 ;;
  12) bash "$0" 8 ;;
esac
