#!/usr/bin/env bash
# GPU call C: Poisson over Wyoming (three voices), bursts of 8 joining while 8 play.
set -uo pipefail
export PYTHONUNBUFFERED=1
R=/tmp/resc; mkdir -p $R
t0=$(date +%s)
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
OUT=$R POISSON_S=500 POISSON_ARGS="--doors wyoming --rates 1,10,20 --seconds 20 --warmup-s 2 --pause-s 1 --bursts 3" \
  bash benchmarks/gpu.sh poisson 2>&1 | tail -20
cp /tmp/poisson/server.log $R/poisson-server-wyoming.log 2>/dev/null
echo "== poisson done at $(( $(date +%s) - t0 )) s"
tar czf $OUT/c.tgz -C $R .
