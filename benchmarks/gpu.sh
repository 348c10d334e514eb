#!/usr/bin/env bash
# Run a stage on the lent GPU machine (no network there: wheels travel in .whl, made by
# benchmarks/gpu-wheels). Usage: benchmarks/gpu.sh STAGE...  (output under $OUT)
#   tests    pytest -m gpu (tiny checkpoints, CUDA; TESTS: more pytest arguments, TESTS_K: its -k)
#   ckpt     build the full-size random VoiceDesign and Base checkpoints (in parallel;
#            CKPT_KINDS="voice_design base custom_voice" adds CustomVoice, as poisson needs)
#   ckptbg   the same in the background (later stages wait on the builder's lock)
#   profile  python -m benchmarks.profile_step
#   linear   python -m benchmarks.linear_sweep: the step's products, cuBLAS against fused_linear
#            tiles (LINEAR_ARGS: its flags, e.g. --tiles)
#   bench    python -m benchmarks.bench
#   int8     python -m benchmarks.int8_parity: int8 against bf16 weights (codes, speed, memory) on
#            the full-size Base, VoiceDesign and CustomVoice checkpoints (builds missing ones)
#   memory   python -m benchmarks.memory: a server with 8/6/4/12/24 GiB free, another process holding the rest
#   soak     a real server on the full-size checkpoints, python -m benchmarks.soak against it
#   poisson  a real server (all three full-size models, --max-streams 32, --fixed-frames 75),
#            python -m benchmarks.poisson against it (POISSON_ARGS: its flags, e.g. --rates 10)
#   wsfirst  a real server (full-size CustomVoice, --max-streams 32, --fixed-frames 75),
#            python -m benchmarks.ws_first_audio against it: first audio from the first delta,
#            WebSocket door and Wyoming streamed text at once (WSFIRST_ARGS: its flags)
#   breakdown  a real server (full-size CustomVoice, --max-streams 32, --fixed-frames 75), 200
#            requests at 1 req/s Poisson (benchmarks.poisson: Wyoming synthesize, speaker ryan;
#            BREAKDOWN_ARGS: its flags), then python -m benchmarks.lone_breakdown on the server's
#            log: p50/p99 of each point of a request's timeline and of first audio at the client
#            (under $OUT/breakdown: lone_breakdown.md/.json, poisson.json, breakdown-logs.tgz).
#            On the CPU (smoke test): WHEELS_DONE=1 BREAKDOWN_DEVICE=cpu BREAKDOWN_CKPT=.ckpt/tiny/custom_voice
#            BREAKDOWN_SERVER_ARGS="--engine batched" BREAKDOWN_ARGS="--seconds 5"
set -uo pipefail
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
[ -n "${WHEELS_DONE:-}" ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1  # WHEELS_DONE: already in /tmp/site
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,memory.used,memory.total --format=csv,noheader
for stage in "$@"; do
  start=$(date +%s)
  case "$stage" in
    tests) timeout "${TESTS_S:-330}" python3 -m pytest -m gpu -q -p no:cacheprovider --durations=8 ${TESTS:-} ${TESTS_K:+-k "$TESTS_K"} 2>&1 | tee "$OUT/gpu-tests.log" | tail -40 ;;
    ckpt)
      for kind in ${CKPT_KINDS:-voice_design base}; do
        python3 -m wyoming_qwen3tts.testing.checkpoint ".ckpt/full/$kind" --type "$kind" --size full > "/tmp/ckpt-$kind.log" 2>&1 &
      done
      wait; tail -2 /tmp/ckpt-*.log ;;
    ckptbg)
      for kind in ${CKPT_KINDS:-voice_design base}; do
        nohup python3 -m wyoming_qwen3tts.testing.checkpoint ".ckpt/full/$kind" --type "$kind" --size full > "/tmp/ckpt-$kind.log" 2>&1 &
      done ;;
    linear) timeout "${LINEAR_S:-200}" python3 -m benchmarks.linear_sweep --out "$OUT/linear" ${LINEAR_ARGS:-} 2>&1 | tee "$OUT/linear.log" | tail -80 ;;
    profile) timeout "${PROFILE_S:-240}" python3 -m benchmarks.profile_step --out "$OUT" ${PROFILE_ARGS:-} 2>&1 | tee "$OUT/profile.log" | tail -45 ;;
    bench) timeout "${BENCH_S:-560}" python3 -m benchmarks.bench --out "$OUT/results" ${BENCH_ARGS:-} 2>&1 | tee "$OUT/bench.log" | tail -60 ;;
    int8)
      for kind in voice_design base custom_voice; do  # wait for (or build) the checkpoints
        python3 -m wyoming_qwen3tts.testing.checkpoint ".ckpt/full/$kind" --type "$kind" --size full > /dev/null &
      done
      wait
      mkdir -p "$OUT/int8"
      timeout "${INT8_S:-300}" python3 -m benchmarks.int8_parity --out "$OUT/int8" ${INT8_ARGS:-} 2>&1 | tee "$OUT/int8/int8.log" | grep -v "Loading weights" | tail -30 ;;
    memory)
      for kind in voice_design base; do  # wait for (or build) the checkpoints, in parallel
        python3 -m wyoming_qwen3tts.testing.checkpoint ".ckpt/full/$kind" --type "$kind" --size full > /dev/null &
      done
      wait
      timeout "${MEMORY_S:-540}" python3 -m benchmarks.memory --out "$OUT/results" ${MEMORY_ARGS:-} 2>&1 | tee "$OUT/memory.log" | tail -30
      # one archive: a run brings back at most 8 files (the 8 GiB server's log was left out once)
      tar czf "$OUT/memory-logs.tgz" -C /tmp/memory-bench $(cd /tmp/memory-bench && ls server-*.log) 2>/dev/null ;;
    soak)
      for kind in voice_design base; do  # wait for (or build) the checkpoints
        python3 -m wyoming_qwen3tts.testing.checkpoint ".ckpt/full/$kind" --type "$kind" --size full > /dev/null
      done
      mkdir -p /tmp/soak/voices
      python3 -m wyoming_qwen3tts --uri tcp://127.0.0.1:10300 --http-host 127.0.0.1 --http-port 8890 \
        --data-dir /tmp/soak/data --voices-dir /tmp/soak/voices --clone-model .ckpt/full/base \
        --design-model .ckpt/full/voice_design --device cuda --no-zeroconf --local-files-only \
        --max-queue 64 > /tmp/soak/server.log 2>&1 &
      server=$!
      for _ in $(seq 240); do grep -q "Ready: Wyoming" /tmp/soak/server.log && break; sleep 0.5; done
      timeout "${SOAK_S:-300}" python3 -m benchmarks.soak --wyoming-port 10300 --http-port 8890 --pid $server \
        --requests "${SOAK_REQUESTS:-1000}" --concurrency "${SOAK_CONCURRENCY:-8}" --out "$OUT/soak" 2>&1 | tail -25
      t0=$(date +%s); kill -TERM $server; wait $server; echo "server exit $? after SIGTERM in $(( $(date +%s) - t0 )) s"
      cp /tmp/soak/server.log "$OUT/soak/server.log"; grep -E "ERROR|Traceback" /tmp/soak/server.log | head -5 ;;
    poisson)
      for kind in voice_design base custom_voice; do  # wait for (or build) the checkpoints
        python3 -m wyoming_qwen3tts.testing.checkpoint ".ckpt/full/$kind" --type "$kind" --size full > /dev/null &
      done
      wait
      mkdir -p /tmp/poisson/voices "$OUT/poisson"
      python3 -c "import numpy as np, soundfile as sf; t = np.arange(72000) / 24000; sf.write('/tmp/poisson/voices/clone.wav', (0.2 * np.sin(2 * np.pi * 190 * t) * (1 + 0.5 * np.sin(2 * np.pi * 3 * t))).astype('float32'), 24000)"
      echo "This is a short reference recording for the benchmark." > /tmp/poisson/voices/clone.txt
      python3 -m wyoming_qwen3tts --uri tcp://127.0.0.1:10300 --http-host 127.0.0.1 --http-port 8890 \
        --data-dir /tmp/poisson/data --voices-dir /tmp/poisson/voices --clone-model .ckpt/full/base \
        --design-model .ckpt/full/voice_design --custom-voice-model .ckpt/full/custom_voice --device cuda \
        --no-zeroconf --local-files-only --max-streams 32 --fixed-frames 75 --seed 17 --anchors used \
        ${POISSON_SERVER_ARGS:---max-queue 64} > /tmp/poisson/server.log 2>&1 &
      server=$!
      for _ in $(seq 360); do grep -q "Ready: Wyoming" /tmp/poisson/server.log && break; sleep 0.5; done
      grep -E "captured|slots of" /tmp/poisson/server.log | head -6
      gpu=$(nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | tr ' ' '-')
      timeout "${POISSON_S:-540}" python3 -m benchmarks.poisson --wyoming-port 10300 --http-port 8890 --gpu "$gpu" \
        --out "$OUT/poisson" ${POISSON_ARGS:---http-voices custom_voice} 2>&1 | tee "$OUT/poisson/poisson.log" | tail -40
      kill -TERM $server; wait $server
      cp /tmp/poisson/server.log "$OUT/poisson/server.log"; grep -E "ERROR|Traceback" /tmp/poisson/server.log | head -5 ;;
    wsfirst)
      python3 -m wyoming_qwen3tts.testing.checkpoint .ckpt/full/custom_voice --type custom_voice --size full > /dev/null
      mkdir -p /tmp/wsfirst/voices "$OUT/wsfirst"
      python3 -m wyoming_qwen3tts --uri tcp://127.0.0.1:10300 --http-host 127.0.0.1 --http-port 8890 \
        --data-dir /tmp/wsfirst/data --voices-dir /tmp/wsfirst/voices --clone-model none --design-model none \
        --custom-voice-model .ckpt/full/custom_voice --voice ryan --device cuda --no-zeroconf --local-files-only \
        --max-streams 32 --fixed-frames 75 --seed 17 ${WSFIRST_SERVER_ARGS:---max-queue 64} > /tmp/wsfirst/server.log 2>&1 &
      server=$!
      for _ in $(seq 360); do grep -q "Ready: Wyoming" /tmp/wsfirst/server.log && break; sleep 0.5; done
      timeout "${WSFIRST_S:-300}" python3 -m benchmarks.ws_first_audio --wyoming-port 10300 --http-port 8890 \
        --out "$OUT/wsfirst" ${WSFIRST_ARGS:-} 2>&1 | tee "$OUT/wsfirst/ws_first_audio.log" | tail -20
      kill -TERM $server; wait $server
      cp /tmp/wsfirst/server.log "$OUT/wsfirst/server.log"; grep -E "ERROR|Traceback" /tmp/wsfirst/server.log | head -5 ;;
    breakdown)
      ckpt=${BREAKDOWN_CKPT:-.ckpt/full/custom_voice}
      [ -n "${BREAKDOWN_CKPT:-}" ] || python3 -m wyoming_qwen3tts.testing.checkpoint "$ckpt" --type custom_voice --size full > /dev/null
      rm -rf /tmp/breakdown; mkdir -p /tmp/breakdown/voices "$OUT/breakdown"
      python3 -m wyoming_qwen3tts --uri tcp://127.0.0.1:10300 --http-host 127.0.0.1 --http-port 8890 \
        --data-dir /tmp/breakdown/data --voices-dir /tmp/breakdown/voices --clone-model none --design-model none \
        --custom-voice-model "$ckpt" --voice ryan --device "${BREAKDOWN_DEVICE:-cuda}" --no-zeroconf --local-files-only \
        --max-streams 32 --fixed-frames 75 --seed 17 --max-queue 64 ${BREAKDOWN_SERVER_ARGS:-} > /tmp/breakdown/server.log 2>&1 &
      server=$!
      for _ in $(seq 360); do grep -q "Ready: Wyoming" /tmp/breakdown/server.log && break; sleep 0.5; done
      timeout "${BREAKDOWN_S:-330}" python3 -m benchmarks.poisson --wyoming-port 10300 --http-port 8890 --gpu "${BREAKDOWN_DEVICE:-cuda}" \
        --rates 1 --seconds 200 --warmup-s 3 --pause-s 0 --doors wyoming --voices custom_voice \
        --out "$OUT/breakdown" ${BREAKDOWN_ARGS:-} 2>&1 | tee "$OUT/breakdown/poisson.log" | grep -E "^wyoming|Error"
      kill -TERM $server; wait $server
      cp /tmp/breakdown/server.log "$OUT/breakdown/server.log"; grep -E "ERROR|Traceback" /tmp/breakdown/server.log | head -5
      # the measured requests: the last n of the log (replies of 75 frames each end in arrival order)
      n=$(python3 -c "import json, sys; print(json.load(open(sys.argv[1]))['rows'][0]['n'])" "$OUT/breakdown/poisson.json")
      python3 -m benchmarks.lone_breakdown "$OUT/breakdown/server.log" --door wyoming --last "$n" \
        --client "$OUT/breakdown/poisson.json" --out "$OUT/breakdown"
      # a run brings back at most 8 files: the logs and the client's other outputs in one archive
      (cd "$OUT/breakdown" || exit; files=(server.log poisson.log poisson-detail.json poisson.md)
       [ -f poisson.png ] && files+=(poisson.png)
       tar czf breakdown-logs.tgz "${files[@]}" && rm -f "${files[@]}") ;;
    *) echo "unknown stage $stage"; exit 2 ;;
  esac
  echo "== $stage: $(( $(date +%s) - start )) s"
done
