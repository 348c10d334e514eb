#!/usr/bin/env bash
# Stop 47's device calls (issue 27's H200 figures; QWEN3TTS_CONV=auto, which folds every product
# from 8 rows since stop 48), `.whl` carried
# (now with jsonschema and its dependencies, so test_studio.py and test_browser.py collect).
#   1: the three full-size checkpoints (background) beside the codec's and the attention's GPU
#      tests (the transposed convolutions folded in mode folded; auto does not fold them); the frame
#      profile at batch 1, 8 and 32 (decode overlapped, QWEN3TTS_CONV=auto); then the rest of
#      `pytest -m gpu` but test_memory_gpu.py over 4 workers in the time left (WALL s in all); if
#      two minutes are still left, the profile at batch 32 with the talker's 256-position cache
#      split over two attention programs (--chunk 128: 22.6 us a layer at batch 32 on the H100
#      against 12.4 at batch 1, one program a head)
#   2: the http door's Poisson rows, every voice kind, 1, 10, 20, 30 and 40 req/s, 20 s each
#      (issue 27's protocol; RATE_S sets fewer where device time is short), 6 s replies, --max-streams 48
#   3: the same for the Wyoming door
#   4: test_memory_gpu.py alone (q.sh 8)
#   5: both doors' Poisson rows from one server start (http, then wyoming), RATE_S s a rate (10
#      unless set): for a session whose device time cannot hold calls 2 and 3
#   7: (stop 48, after auto began folding the transposed convolutions from 8 rows) the CUDA
#      decoder test, the frame profile at batch 32 and 8, then both doors' Poisson rows at 10
#      and 30 req/s, every voice kind, RATE_S s a rate (12 unless set)
#   6: (the last 150 s of a session's device time) the CUDA decoder test (fused, folded and eager
#      PCM), then the frame profile at batch 32, 1 and 8 in the time left (WALL s in all)
set -uo pipefail
source "$(dirname "$0")/prelude.sh"
case "${1:-1}" in
  1) CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckptbg > /dev/null
     mkdir -p "$OUT/tests" "$OUT/rest"
     timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rf -n 4 tests/test_codec_kernels.py \
       tests/test_kernels.py::test_decode_attention_reads_each_rows_own_positions \
       tests/test_kernels.py::test_rope_attention_is_the_two_kernels 2>&1 | tee "$OUT/tests/gpu-tests.log" | tail -3
     echo "tests at $(since)"
     profile "$OUT/profile" 200 1,8,32
     timeout $(( ${WALL:-585} - ($(date +%s) - s) )) python3 -m pytest -m gpu -q -p no:cacheprovider --durations=8 -n 4 -rfs \
       --ignore tests/test_memory_gpu.py --ignore tests/test_codec_kernels.py -k "not attention" 2>&1 | tee "$OUT/rest/gpu-tests.log" | tail -16
     echo "rest at $(since)"
     left=$(( ${WALL:-585} - ($(date +%s) - s) ))
     if [ "$left" -gt 120 ]; then
       profile "$OUT/profile-chunk128" $(( left - 5 )) 32 --chunk 128
     fi ;;
  2|3) door=http; [ "$1" = 3 ] && door=wyoming
     OUT="$OUT/$door" POISSON_S=$(( ${WALL:-585} - 60 )) POISSON_SERVER_ARGS="--max-queue 64 --max-streams 48" \
       POISSON_ARGS="--rates 1,10,20,30,40 --seconds ${RATE_S:-20} --warmup-s 1 --pause-s 0.5 --voices clone,preset,custom_voice --doors $door" \
       bash benchmarks/gpu.sh poisson | tail -22
     echo "poisson at $(since)" ;;
  4) bash "$(dirname "$0")/q.sh" 8 ;;
  6) mkdir -p "$OUT/tests"
     timeout 60 python3 -m pytest -m gpu -q -p no:cacheprovider -rf \
       tests/test_codec_kernels.py::test_decoder_kernels_on_cuda_decode_the_eager_pcm 2>&1 | tee "$OUT/tests/gpu-tests.log" | tail -3
     echo "tests at $(since)"
     profile "$OUT/profile" $(( ${WALL:-150} - ($(date +%s) - s) )) 32,1,8
     grep '^{"batch"' "$OUT/profile/profile.log" | cut -c1-330 ;;
  7) mkdir -p "$OUT/tests"
     timeout 150 python3 -m pytest -m gpu -q -p no:cacheprovider -rf \
       tests/test_codec_kernels.py::test_decoder_kernels_on_cuda_decode_the_eager_pcm 2>&1 | tee "$OUT/tests/gpu-tests.log" | tail -3
     echo "tests at $(since)"
     profile "$OUT/profile" 200 32,8  # a fresh machine compiles the Triton kernels first: 100 s was cut
     OUT="$OUT/both" POISSON_S=$(( ${WALL:-585} - ($(date +%s) - s) - 20 )) POISSON_SERVER_ARGS="--max-queue 64 --max-streams 48" \
       POISSON_ARGS="--rates 10,30 --seconds ${RATE_S:-12} --warmup-s 1 --pause-s 0.5 --voices clone,preset,custom_voice --doors http,wyoming" \
       bash benchmarks/gpu.sh poisson | grep -E '^[|] (http|wyoming)|^=='
     echo "poisson at $(since)" ;;
  5) OUT="$OUT/both" POISSON_S=$(( ${WALL:-585} - 60 )) POISSON_SERVER_ARGS="--max-queue 64 --max-streams 48" \
       POISSON_ARGS="--rates 1,10,20,30,40 --seconds ${RATE_S:-10} --warmup-s 1 --pause-s 0.5 --voices clone,preset,custom_voice --doors http,wyoming" \
       bash benchmarks/gpu.sh poisson | tail -36
     echo "poisson at $(since)" ;;
esac
