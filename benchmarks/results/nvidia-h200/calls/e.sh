#!/usr/bin/env bash
# 2026-12-02, one device call (590 s): issue 25's 8-bit weights on a shared card and issue 26's
# CPU figures at once. The GPU work runs on cores 0-7 (memory rows 8, 6, 4 GiB free with the
# defaults, another process holding the rest; then int8 against bf16); the CPU benchmark
# (benchmarks/cpu_device.sh: 4 then 8 cores) on cores 8-15, beside it. Everything comes back as
# one archive (a call returns at most 8 files).
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=/tmp/res; mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export WHEELS_DONE=1 PYTHONUNBUFFERED=1
OUT=$R/cpu CORES="8-11 8-15" taskset -c 8-15 bash benchmarks/cpu_device.sh > "$R/cpu.log" 2>&1 &
cpu=$!
OUT=$R MEMORY_ARGS="--free 8,6,4 --time-limit 230" MEMORY_S=250 INT8_S=175 CKPT_KINDS=custom_voice \
  taskset -c 0-7 bash benchmarks/gpu.sh ckptbg memory int8
for _ in $(seq 50); do kill -0 $cpu 2>/dev/null || break; sleep 1; done
kill $cpu 2>/dev/null
cp /tmp/ckpt-*.log "$R/" 2>/dev/null
tar czf "$OUT/e.tgz" -C "$R" .
cat "$R/results/memory.md" 2>/dev/null | tail -8; tail -12 "$R/int8/int8.log" 2>/dev/null; tail -15 "$R/cpu.log"
