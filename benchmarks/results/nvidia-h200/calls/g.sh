#!/usr/bin/env bash
# 2026-12-02 (third session of the day), device call 1: `pytest -m gpu` on the current tree
# (every test named as it ends, so that a cut run still says which passed), then int8 against
# bf16 on the full-size checkpoints (built in the background meanwhile; all three kinds, which
# the later calls use too). Everything comes back as one archive.
set -uo pipefail
OUT=${OUT:-/tmp/out}; R=/tmp/res; mkdir -p "$R"
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export WHEELS_DONE=1 PYTHONUNBUFFERED=1
CKPT_KINDS="voice_design base custom_voice" bash benchmarks/gpu.sh ckptbg
TESTS="-vv -rfE" TESTS_S=${TESTS_S:-300} OUT=$R bash benchmarks/gpu.sh tests > /dev/null
INT8_S=${INT8_S:-200} OUT=$R bash benchmarks/gpu.sh int8 > /dev/null
cp /tmp/ckpt-*.log "$R/" 2>/dev/null
tar czf "$OUT/g.tgz" -C "$R" .
grep -E "passed|failed" "$R/gpu-tests.log" | tail -3; grep -E "FAILED|ERROR" "$R/gpu-tests.log" | head -30
tail -25 "$R/int8/int8.log" 2>/dev/null | grep -v "Loading weights"
