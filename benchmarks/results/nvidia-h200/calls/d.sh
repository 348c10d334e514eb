#!/usr/bin/env bash
# GPU call D: the whole pytest -m gpu suite (but the two full-size tests), then the turns-mode leak diagnosis under a 7.5 GB cap.
set -uo pipefail
export PYTHONUNBUFFERED=1
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
timeout 250 python3 -m pytest -m gpu -q -p no:cacheprovider --continue-on-collection-errors --durations=10 tests \
  --deselect tests/test_memory_gpu.py::test_defaults_start_under_an_8gb_cap_and_speak_a_preset_and_a_clone \
  --deselect tests/test_memory_gpu.py::test_float16_full_size_long_generation_stays_finite > $OUT/gpu-tests.log 2>&1
tail -25 $OUT/gpu-tests.log
echo "== tests done at $(( $(date +%s) - t0 )) s"
for kind in voice_design base; do
  python3 -m wyoming_qwen3tts.testing.checkpoint ".ckpt/full/$kind" --type "$kind" --size full > "/tmp/ckpt-$kind.log" 2>&1 &
done
wait
echo "== ckpt done at $(( $(date +%s) - t0 )) s"
CAP_GB=7.5 timeout 110 python3 -m benchmarks.turns_probe 2>&1 | grep -v "Loading weights\|request ok" > $OUT/leak.log
grep -v "^|\|^  \|^ *<-" $OUT/leak.log | cut -c1-300 | tail -40
echo "== leak done at $(( $(date +%s) - t0 )) s"
if [ $(( $(date +%s) - t0 )) -lt 400 ]; then
  PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True CAP_GB=7.5 timeout 100 python3 -m benchmarks.turns_probe 2>&1 | grep -v "Loading weights\|request ok" > $OUT/leak-expandable.log
  grep -v "^|\|^  \|^ *<-" $OUT/leak-expandable.log | cut -c1-300 | tail -25
  echo "== leak (expandable segments) done at $(( $(date +%s) - t0 )) s"
fi
