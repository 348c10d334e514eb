#!/usr/bin/env bash
# GPU call A: GPU tests, join profile, full-size GPU tests, memory rows 8 and 12 GB.
set -uo pipefail
export PYTHONUNBUFFERED=1
R=/tmp/res; mkdir -p $R
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader | tee $R/nvidia-smi.txt
for kind in voice_design base custom_voice; do
  nohup python3 -m wyoming_qwen3tts.testing.checkpoint ".ckpt/full/$kind" --type "$kind" --size full > "/tmp/ckpt-$kind.log" 2>&1 &
done
nohup python3 -m wyoming_qwen3tts.testing.checkpoint .ckpt/full/base-0.6b --type base --size full-0.6b > /tmp/ckpt-06.log 2>&1 &
timeout 210 python3 -m pytest -m gpu -q -p no:cacheprovider --continue-on-collection-errors --durations=8 tests \
  --deselect tests/test_memory_gpu.py::test_defaults_start_under_an_8gb_cap_and_speak_a_preset_and_a_clone \
  --deselect tests/test_memory_gpu.py::test_float16_full_size_long_generation_stays_finite 2>&1 | tee $R/gpu-tests.log | tail -25
echo "== tests done at $(( $(date +%s) - t0 )) s"
wait
tail -qn 1 /tmp/ckpt-*.log
echo "== ckpt done at $(( $(date +%s) - t0 )) s"
timeout 75 python3 -m benchmarks.join_profile --ckpt .ckpt/full/base --out $R/join 2>&1 | tee $R/join.log | grep -v "^ \|^--\|^Name" | tail -6
echo "== join profile done at $(( $(date +%s) - t0 )) s"
timeout 140 python3 -m pytest -m gpu -q -p no:cacheprovider -x \
  tests/test_memory_gpu.py::test_defaults_start_under_an_8gb_cap_and_speak_a_preset_and_a_clone \
  tests/test_memory_gpu.py::test_float16_full_size_long_generation_stays_finite 2>&1 | tee $R/gpu-tests-full.log | tail -15
echo "== full-size tests done at $(( $(date +%s) - t0 )) s"
left=$(( 575 - ($(date +%s) - t0) ))
timeout $left python3 -m benchmarks.memory --out $R/memory --time-limit $(( left - 90 )) --rows "8:defaults,12:defaults" 2>&1 | tee $R/memory.log | tail -12
cp /tmp/memory-bench/server-*.log $R/ 2>/dev/null
echo "== memory done at $(( $(date +%s) - t0 )) s"
tar czf $OUT/a.tgz -C $R .
cp $R/gpu-tests.log $R/memory.log $R/join.log $OUT/ 2>/dev/null
