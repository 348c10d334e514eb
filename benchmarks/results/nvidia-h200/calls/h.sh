#!/usr/bin/env bash
# 2026-12-02 (third session of the day), the last device call: the GPU tests that call g.sh's
# time limit cut, or that changed since (tiny checkpoints first, while the full-size ones
# build), then the memory rows at 6 and 4 GiB free (the 4 GiB row starting with the preset
# anchors the 6 GiB row rendered, but aria's), then the full-size GPU tests. Each part's
# results come back as their own archive, so that a cut call still brings back what ended.
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=/tmp/res; mkdir -p "$R/a" "$R/m" "$R/c"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export WHEELS_DONE=1 PYTHONUNBUFFERED=1
CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckptbg > /dev/null
TESTS="-vv -rfE tests/test_prefill.py tests/test_quant.py tests/test_memory_gpu.py" TESTS_K="not (8gb or full_size)" TESTS_S=120 OUT=$R/a bash benchmarks/gpu.sh tests > /dev/null
tar czf "$OUT/a.tgz" -C "$R/a" .; grep -E "passed|failed|FAILED|ERROR" "$R/a/gpu-tests.log" | tail -8
OUT=$R/m MEMORY_ARGS="--free 6,4 --time-limit 150" MEMORY_S=190 bash benchmarks/gpu.sh memory > /dev/null
cp -r /tmp/memory-bench/data-4gb "$R/m/" 2>/dev/null; tar czf "$OUT/m.tgz" -C "$R/m" .; tail -4 "$R/m/results/memory.md"
TESTS="-vv -rfE tests/test_memory_gpu.py" TESTS_K="8gb or full_size" TESTS_S=130 OUT=$R/c bash benchmarks/gpu.sh tests > /dev/null
tar czf "$OUT/c.tgz" -C "$R/c" .; grep -E "passed|failed|FAILED|ERROR" "$R/c/gpu-tests.log" | tail -8
