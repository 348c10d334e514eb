"""The GGML engine through the server against the qwentts.cpp library called directly, back to back.

Same GGUF files, same thread split (one generating thread and one codec thread on 2 cores,
as ``GgmlEngine`` chooses), same sentence, seed and frame cap. Two processes are loaded at
once and take turns, so that both meet the same machine moment:

* ``server``: ``python -m wyoming_qwen3tts --engine ggml`` as a user starts it, asked by a
  Wyoming client (first ``audio-chunk``; audio seconds per wall second);
* ``direct``: a bare Python process with ``qwentts_cpp_cpu.QwenTTS.stream`` (first chunk out
  of the binding's iterator; same ratio).

For each request the script also records the CPU seconds each process spent (``/proc/PID/stat``
utime + stime, its threads included) and the load average, and for the direct process the
library's own split of the work (its ``[Perf]`` log lines: prompt prefill, talker decode,
code predictor, codec decode, in ms). Figures, not tests.

    python -m benchmarks.ggml_gap --talker T.gguf --codec C.gguf --checkpoint DIR [--rounds 4] [--out FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

from benchmarks.cpu_bench import TEXT, THREAD_VARIABLES, _free_port, _one_request

SEED = 1
#: The library's per-request work split, from its log lines (ms).
PERF = {
    "prefill_ms": re.compile(r"\[Perf\] Prefill ([\d.]+) ms"),
    "talker_ms": re.compile(r"\[Perf\] TalkerDecode ([\d.]+) ms"),
    "code_predictor_ms": re.compile(r"\[Perf\] CodePredictor ([\d.]+) ms"),
    "codec_ms": re.compile(r"\[Perf\] CodecDecode ([\d.]+) ms"),
    "total_ms": re.compile(r"\[Perf\] Total ([\d.]+) ms"),
}


def _cpu_s(pid: int) -> float:
    """CPU seconds (user + system, all threads, those that ended included) of process ``pid``."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def _status_mb(pid: int) -> dict[str, int]:
    keys = ("VmRSS", "RssAnon", "RssFile", "VmHWM")
    return {
        line.split(":")[0]: int(line.split()[1]) // 1024
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.split(":")[0] in keys
    }


def direct_worker(talker: str, codec: str, frames: int) -> None:
    """The bare library: load, warm up, then one request per line read on stdin, one JSON line out."""
    import qwentts_cpp_cpu

    lines: list[str] = []
    library = qwentts_cpp_cpu.QwenLibrary()
    library.set_log_callback(lambda level, message: lines.append(message))
    cores = len(os.sched_getaffinity(0))
    codec_threads = max(1, cores // 4) if cores >= 2 else 0
    tts = qwentts_cpp_cpu.QwenTTS(
        talker, codec, cpu_threads=cores - codec_threads, cpu_codec_threads=codec_threads, cpu_stream_frames=1
    )

    def one(max_new_tokens: int) -> dict:
        lines.clear()
        started = time.perf_counter()
        first = None
        samples = 0
        for chunk, _rate in tts.stream(text=TEXT, lang="english", speaker="ryan", seed=SEED, max_new_tokens=max_new_tokens):
            first = first or time.perf_counter()
            samples += len(chunk)
        wall = time.perf_counter() - started
        assert first is not None
        row: dict = {"ttfa_ms": round((first - started) * 1000, 1), "speed": round(samples / 24000 / wall, 4), "audio_s": samples / 24000}
        text = "\n".join(lines)
        for key, pattern in PERF.items():
            match = pattern.search(text)
            if match:
                row[key] = float(match.group(1))
        profile = tts.last_stream_profile or {}
        row["callback_ms"] = round(profile.get("callback_copy_ms_total", 0.0) + profile.get("callback_queue_ms_total", 0.0), 2)
        return row

    one(2)  # the server warms up with a 2-frame generation too
    print("ready", flush=True)
    for _ in sys.stdin:
        print(json.dumps(one(frames)), flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--talker", required=True)
    parser.add_argument("--codec", required=True)
    parser.add_argument("--checkpoint", type=Path, required=True, help="the checkpoint folder the server converts (its GGUF pair cached in --data)")
    parser.add_argument("--data", type=Path, default=Path("/tmp/cpu-bench/data"))
    parser.add_argument("--frames", type=int, default=25)
    parser.add_argument("--rounds", type=int, default=4)
    parser.add_argument("--out", type=Path)
    parser.add_argument("--direct-worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.direct_worker:
        direct_worker(args.talker, args.codec, args.frames)
        return

    port = _free_port()
    log = args.data / "gap-server.log"
    env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
    server = subprocess.Popen(
        [
            sys.executable, "-m", "wyoming_qwen3tts", "--uri", f"tcp://127.0.0.1:{port}", "--http-port", "0",
            "--data-dir", str(args.data), "--clone-model", "none", "--design-model", "none",
            "--custom-voice-model", str(args.checkpoint), "--voice", "ryan", "--engine", "ggml", "--device", "cpu",
            "--anchors", "off", "--no-zeroconf", "--fixed-frames", str(args.frames), "--seed", str(SEED),
            "--local-files-only",
        ],
        stdout=log.open("w"), stderr=subprocess.STDOUT, env=env,
    )
    direct = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.ggml_gap", "--direct-worker", "--talker", args.talker, "--codec", args.codec,
         "--checkpoint", str(args.checkpoint), "--frames", str(args.frames)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, env=env,
    )
    assert direct.stdin is not None and direct.stdout is not None
    try:
        while "Ready: Wyoming" not in log.read_text(errors="replace"):
            if server.poll() is not None:
                raise RuntimeError(f"server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(0.5)
        if direct.stdout.readline().strip() != "ready":
            raise RuntimeError("the direct worker did not start")
        rows: list[dict] = []
        for round_ in range(args.rounds):
            for who in ("server", "direct") if round_ % 2 == 0 else ("direct", "server"):
                load = os.getloadavg()[0]
                pid = server.pid if who == "server" else direct.pid
                cpu = _cpu_s(pid)
                started = time.perf_counter()
                if who == "server":
                    ttfa, speed = asyncio.run(_one_request(port))
                    row: dict = {"ttfa_ms": round(ttfa, 1), "speed": round(speed, 4)}
                else:
                    direct.stdin.write("go\n")
                    direct.stdin.flush()
                    row = json.loads(direct.stdout.readline())
                wall = time.perf_counter() - started
                row.update(who=who, round=round_, load1=round(load, 2), cpu_s=round(_cpu_s(pid) - cpu, 2), wall_s=round(wall, 2))
                print(json.dumps(row), flush=True)
                rows.append(row)
        memory = {"server": _status_mb(server.pid), "direct": _status_mb(direct.pid)}
    finally:
        server.terminate()
        direct.kill()
        server.wait(timeout=60)
    summary = {
        who: {
            "ttfa_ms": round(statistics.median(r["ttfa_ms"] for r in rows if r["who"] == who), 1),
            "speed": round(statistics.median(r["speed"] for r in rows if r["who"] == who), 4),
            "cpu_per_wall": round(statistics.median(r["cpu_s"] / r["wall_s"] for r in rows if r["who"] == who), 2),
            "memory_mb": memory[who],
        }
        for who in ("server", "direct")
    }
    result = {"summary": summary, "rows": rows, "frames": args.frames, "date": time.strftime("%Y-%m-%d %H:%M:%S %Z")}
    print(json.dumps(summary, indent=2))
    if args.out:
        args.out.write_text(json.dumps(result, indent=2) + "\n")


if __name__ == "__main__":
    main()
