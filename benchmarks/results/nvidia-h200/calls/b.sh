#!/usr/bin/env bash
# GPU call B: memory rows 16, 24 GB and 0.6B Base at 8 GB; Poisson over HTTP (three voices).
set -uo pipefail
export PYTHONUNBUFFERED=1
R=/tmp/resb; mkdir -p $R
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
for kind in voice_design base custom_voice; do
  python3 -m wyoming_qwen3tts.testing.checkpoint ".ckpt/full/$kind" --type "$kind" --size full > "/tmp/ckpt-$kind.log" 2>&1 &
done
python3 -m wyoming_qwen3tts.testing.checkpoint .ckpt/full/base-0.6b --type base --size full-0.6b > /tmp/ckpt-06.log 2>&1 &
wait
echo "== ckpt at $(( $(date +%s) - t0 )) s"
timeout 90 python3 -m benchmarks.turns_probe 2>&1 | grep -v "Loading weights" | tee $R/leak.log | head -60
echo "== leak at $(( $(date +%s) - t0 )) s"
timeout 215 python3 -m benchmarks.memory --out $R/memory --time-limit 140 --rows "16:defaults,24:defaults,8:0.6B Base" 2>&1 | tee $R/memory.log | tail -8
cp /tmp/memory-bench/server-*.log $R/ 2>/dev/null
echo "== memory done at $(( $(date +%s) - t0 )) s"
left=$(( 580 - ($(date +%s) - t0) ))
OUT=$R POISSON_S=$(( left - 70 )) POISSON_ARGS="--doors http --voices clone,custom_voice --rates 10,20 --seconds 20 --warmup-s 2 --pause-s 1" \
  bash benchmarks/gpu.sh poisson 2>&1 | tail -14
cp /tmp/poisson/server.log $R/poisson-server-http.log 2>/dev/null
echo "== poisson done at $(( $(date +%s) - t0 )) s"
tar czf $OUT/b.tgz -C $R .
