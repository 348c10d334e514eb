#!/usr/bin/env bash
# Written at stop 31 for the next GPU session, NOT yet run: what stop 31 measured without the
# fixes that followed its run. Two chained device calls (each under 10 min), `.whl` carried:
#   1: memory at 6 and 4 GiB free (the 4 GiB row seeded with the 6 GiB row's anchors): lena
#      must be spoken at 4 GiB now (Anchors.begin, a054168); the start-up log must hold no
#      flash-attn / sox banner (the TURNS_GRAPH_ROWS import fix)
#   2: the 8-core CPU figures with the new thread defaults (4 threads a stream on 8 cores;
#      predicted about 0.4x for one 0.6B stream, against 0.165x with 2): cpu_device.sh on
#      cores 0-7 only, the limits step skipped
set -uo pipefail
OUT=${OUT:-/tmp/out}
[ -d /tmp/site/wyoming ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export WHEELS_DONE=1 PYTHONUNBUFFERED=1
case "${1:-1}" in
  1) CKPT_KINDS="voice_design base" bash benchmarks/gpu.sh ckpt > /dev/null
     OUT=/tmp/res-m MEMORY_ARGS="--free 6,4 --time-limit 200" MEMORY_S=300 bash benchmarks/gpu.sh memory > /dev/null
     tar czf "$OUT/m.tgz" -C /tmp/res-m .; cat /tmp/res-m/results/memory.md
     grep -c -E "flash-attn|sox: not found" /tmp/memory-bench/server-*.log ;;
  2) CORES="0-7" LIMITS_S=1 OUT=/tmp/res-cpu bash benchmarks/cpu_device.sh
     tar czf "$OUT/cpu.tgz" -C /tmp/res-cpu . ;;
esac
