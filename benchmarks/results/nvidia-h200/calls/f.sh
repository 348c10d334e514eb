#!/usr/bin/env bash
# 2026-12-02, the last device call (230 s, the machine still warm from e.sh): the 4 GiB row
# alone, which e.sh's time limit had skipped (weight precision auto: int8).
mkdir -p /tmp/r4 && OUT=/tmp/r4 MEMORY_ARGS="--free 4 --time-limit 150" MEMORY_S=190 bash benchmarks/gpu.sh memory 2>&1 | tail -5
tar czf "$OUT/r4.tgz" -C /tmp/r4 .
