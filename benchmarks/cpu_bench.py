"""CPU benchmark: the pipeline, GGML (qwentts.cpp wheel) and PyTorch reference engines, same run, same machine.

For each model size (full-size random 0.6B and 1.7B CustomVoice checkpoints, built by
``wyoming_qwen3tts.testing.checkpoint``; the GGML engine gets them converted to GGUF by our
converter at the given quantization) and each engine, a server is started as a user starts
it, and a Wyoming client asks for one sentence ``REQUESTS`` times, measuring

* ``ttfa_ms``: Synthesize sent -> first AudioChunk received (median of the requests);
* ``speed``: seconds of audio per second of wall time, whole requests (median);
* ``gap_ms``: the longest silence a client heard between two chunks, playing each chunk as
  it arrives (or when the one before it ends): a chunk's arrival minus the end of the audio
  before it, 0 while the client is ahead; the largest of the requests;
* ``--clients 2``: that many clients ask at once (each round), every figure per client: the
  median TTFA and speed over all of them and ``ttfa_ms_max`` (the slower client's median);
* ``rss_gb``: the server's resident memory (VmRSS) after the requests, serving; also
  ``rss_peak_gb`` (VmHWM: the GGML engine peaks while loading, when the weight files are
  resident beside the library's copy) and ``rss_anon_gb`` (the anonymous part).

Each request is capped at ``--frames`` codec frames (``--fixed-frames``: the reference engine
generates exactly that many; the GGML engine stops there at the latest, and earlier if the
random weights emit EOS; speed counts the audio actually delivered). Figures, not tests.

    python -m benchmarks.cpu_bench --out benchmarks/results/cpu-2core [--frames 25] [--sizes 0.6b full]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import socket
import statistics
import subprocess
import sys
import time
from pathlib import Path

TEXT = "The quick brown fox jumps over the lazy dog near the quiet river bank."
REQUESTS = 2
SIZES = {"0.6b": "0.6B", "full": "1.7B"}


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _status_gb(pid: int, key: str) -> float:
    """A ``/proc/PID/status`` memory figure (``VmHWM``: peak resident set; ``RssAnon``: its
    anonymous part now, i.e. without the mapped weight files' page cache) in GB."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024 / 1024
    return float("nan")


async def _one_request(port: int, text: str = TEXT) -> tuple[float, float, float]:
    """(TTFA ms, audio s per wall s, longest silence ms) of one Synthesize."""
    from wyoming.audio import AudioChunk, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    async with AsyncTcpClient("127.0.0.1", port) as client:
        started = time.perf_counter()
        await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name="ryan")).event())
        first = None
        samples = 0
        gap = 0.0
        played_until = 0.0  # when the audio received so far ends, playing from its arrival
        while True:
            event = await client.read_event()
            if event is None:
                raise RuntimeError("server closed the connection")
            if AudioChunk.is_type(event.type):
                chunk = AudioChunk.from_event(event)
                now = time.perf_counter()
                first = first or now
                if samples:
                    gap = max(gap, now - played_until)  # silence before this chunk
                n = len(chunk.audio) // chunk.width
                played_until = max(now, played_until) + n / 24000
                samples += n
            elif AudioStop.is_type(event.type):
                wall = time.perf_counter() - started
                assert first is not None
                return (first - started) * 1000, samples / 24000 / wall, gap * 1000


#: Thread settings a shell may carry (the project's test instructions set OMP_NUM_THREADS=1):
#: the servers get none of them, so each engine runs with the threads a user's server gets.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OPENBLAS_NUM_THREADS")


async def _round(port: int, text: str, clients: int) -> list[tuple[float, float, float]]:
    """``clients`` requests sent at once; their results in order."""
    return list(await asyncio.gather(*(_one_request(port, text) for _ in range(clients))))


def run_row(
    engine: str, checkpoint: Path, data: Path, frames: int, quant: str, text: str = TEXT, clients: int = 1,
    extra: list[str] | None = None,
) -> dict:
    port = _free_port()
    data.mkdir(parents=True, exist_ok=True)
    log = data / f"server-{engine}-{checkpoint.name}.log"
    args = [
        sys.executable, "-m", "wyoming_qwen3tts", "--uri", f"tcp://127.0.0.1:{port}", "--http-port", "0",
        "--data-dir", str(data), "--clone-model", "none", "--design-model", "none",
        "--custom-voice-model", str(checkpoint), "--voice", "ryan", "--engine", engine, "--device", "cpu",
        "--anchors", "off", "--no-zeroconf", "--fixed-frames", str(frames), "--gguf-quant", quant,
        "--local-files-only", *(extra or []),
    ]
    with log.open("w") as handle:
        env = {k: v for k, v in os.environ.items() if k not in THREAD_VARIABLES}
        proc = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        deadline = time.monotonic() + 3600
        while "Ready: Wyoming" not in log.read_text(errors="replace"):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"{engine} server did not start:\n{log.read_text()[-3000:]}")
            time.sleep(1)
        load = os.getloadavg()[0]
        rounds = [asyncio.run(_round(port, text, clients)) for _ in range(REQUESTS)]
        results = [r for one in rounds for r in one]
        streams = next((l for l in log.read_text(errors="replace").splitlines()
                        if ("CPU engine, " in l or "CPU pipeline engine, " in l) and "model: " in l), "")  # the CPU engines' start-up line
        rss, peak, anon = (_status_gb(proc.pid, key) for key in ("VmRSS", "VmHWM", "RssAnon"))
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    per_client = [[rnd[i] for rnd in rounds] for i in range(clients)]
    return {
        "clients": clients,
        "ttfa_ms": round(statistics.median(r[0] for r in results), 1),
        "ttfa_ms_max": round(max(statistics.median(r[0] for r in c) for c in per_client), 1),
        "speed": round(statistics.median(r[1] for r in results), 4),
        "gap_ms": round(max(r[2] for r in results), 1),
        "loadavg_1min": round(load, 2),
        "plan": streams.split("model: ", 1)[-1] if streams else "",
        "rss_gb": round(rss, 2),
        "rss_peak_gb": round(peak, 2),
        "rss_anon_gb": round(anon, 2),
        "requests": [{"ttfa_ms": round(t, 1), "speed": round(s, 4), "gap_ms": round(g, 1)} for t, s, g in results],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("benchmarks/results/cpu-2core"))
    parser.add_argument("--work", type=Path, default=Path("/tmp/cpu-bench"), help="checkpoints and data folder")
    parser.add_argument("--frames", type=int, default=25, help="codec frames per request (80 ms each)")
    parser.add_argument("--sizes", nargs="+", default=list(SIZES), choices=list(SIZES))
    parser.add_argument("--engines", nargs="+", default=["pipeline", "ggml", "reference"], choices=["pipeline", "ggml", "reference"])
    parser.add_argument("--quant", default="Q8_0")
    parser.add_argument("--text", default=TEXT, help="the sentence asked for")
    parser.add_argument("--clients", type=int, nargs="+", default=[1], help="rows with this many clients at once (e.g. 1 2)")
    parser.add_argument("--gguf-dir", type=Path, help="GGML rows serve DIR/<QUANT>/ (GGUF files of the --sizes' one size) instead of converting at start")
    parser.add_argument("--ggml-args", default="", help="extra server flags for the GGML rows (e.g. '--ggml-streams 2')")
    args = parser.parse_args()
    from wyoming_qwen3tts.testing.checkpoint import build_checkpoint

    load_before = os.getloadavg()
    rows = []
    for size in args.sizes:
        checkpoint = build_checkpoint(args.work / size / "custom_voice", "custom_voice", size)
        for engine in args.engines:
            print(f"{engine} {SIZES[size]} ...", flush=True)
            weights = {"ggml": f"GGUF {args.quant} (qwentts.cpp)",
                       "pipeline": f"GGUF {args.quant} (our ggml graphs), codec on ONNX Runtime (float32)"}.get(engine, "float32 (qwen_tts on the CPU)")
            for clients in args.clients if engine != "reference" else [1]:  # the reference engine: one client (its figure beside)
                row = {"engine": engine, "model": SIZES[size], "quant": args.quant if engine in ("ggml", "pipeline") else "float32", "weights": weights}
                extra = args.ggml_args.split() if engine == "ggml" else []
                source = args.gguf_dir / args.quant if engine == "ggml" and args.gguf_dir else checkpoint
                row.update(run_row(engine, source, args.work / "data", args.frames, args.quant, args.text, clients, extra))
                print(row, flush=True)
                rows.append(row)
    meta = {
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
        "cpu": next((l.split(":", 1)[1].strip() for l in Path("/proc/cpuinfo").read_text().splitlines() if l.startswith("model name")), platform.processor()),
        "cores": len(os.sched_getaffinity(0)),
        "loadavg_before": [round(x, 2) for x in load_before],
        "loadavg_after": [round(x, 2) for x in os.getloadavg()],
        "frames_per_request": args.frames,
        "requests_per_row": REQUESTS,
        "text": args.text,
        "server_thread_env": "none of " + ", ".join(THREAD_VARIABLES) + " (library defaults: torch and ggml pick their own threads)",
        "note": "quant: the configuration a row belongs to; the reference engine runs float32 weights (see weights)",
    }
    args.out.mkdir(parents=True, exist_ok=True)
    # results.json: the fields exactly; results-detail.json: whole rows and the run's settings.
    # (one client's rows; the rows of several clients at once are in the detail only)
    fields = ("engine", "model", "quant", "ttfa_ms", "speed", "rss_gb")
    single = [{k: r[k] for k in fields} for r in rows if r["clients"] == 1]
    (args.out / "results.json").write_text(json.dumps({"rows": single}, indent=2) + "\n")
    (args.out / "results-detail.json").write_text(json.dumps({"rows": rows, "meta": meta}, indent=2) + "\n")
    print(json.dumps({"rows": rows, "meta": meta}, indent=2))


if __name__ == "__main__":
    main()
