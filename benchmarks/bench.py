"""GPU benchmark: first audio and speed at the client, against the bare engine, in one run.

``python -m benchmarks.bench`` on a machine with an NVIDIA GPU:

1. builds full-size random 1.7B VoiceDesign and Base checkpoints (offline) unless present;
2. loads the bare engine (faster-qwen3-tts) in this process and starts one real server
   process per chunk size (``--device cuda --fixed-frames N --seed S``);
3. measures, interleaved (engine, server, engine, server, ...) so that drift between blocks
   of runs cancels, never both on the GPU at the same moment:
   the Wyoming ``synthesize`` -> first ``audio-chunk`` / ``audio-stop``; Home Assistant-style
   streamed text (a few characters per delta at LLM speed); the HTTP endpoint's time to
   first byte; 1, 2, 4 and 8 concurrent clients;
4. checks that under 8 concurrent clients every client gets exactly its own audio (same
   seed, distinct texts, compared with single-client runs);
5. writes ``results.json``, ``results.md`` and ``first_audio.png`` to
   ``benchmarks/results/<gpu-name>/`` and prints the table.

Every generation is exactly ``--frames`` codec frames (``min_new_tokens = max_new_tokens``),
so like is compared with like. First audio is reported as server / engine ratios.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import re
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf

from wyoming_qwen3tts.audio import SAMPLE_RATE, SAMPLES_PER_FRAME
from wyoming_qwen3tts.testing.checkpoint import build_checkpoint
from wyoming_qwen3tts.voices import ModelKind, VoiceCatalog

#: Distinct one-sentence texts, one per concurrent client.
TEXTS = [
    "The kitchen lights are now switched off for the night.",
    "Tomorrow will be sunny with a light breeze from the west.",
    "Your package has arrived and is waiting at the front door.",
    "The washing machine finished its cycle ten minutes ago.",
    "It is currently twenty one degrees in the living room.",
    "Remember to water the plants on the balcony this evening.",
    "The garage door has been open for more than an hour.",
    "Your next meeting starts in fifteen minutes in room four.",
]
#: Two sentences, streamed as Home Assistant streams an LLM reply.
STREAMED_TEXT = "Sure, I turned on the hallway lights. Anything else I can do for you?"
VOICE = "aria"
CLONE_TRANSCRIPT = "This is a short reference recording for the benchmark."


def _pct(values: list[float], q: float) -> float:
    return float(np.percentile(values, q)) if values else float("nan")


@dataclass
class Sample:
    """One request seen by one client. Times in seconds from sending."""

    first_audio: float
    done: float
    audio_s: float
    pcm: bytes = field(default=b"", repr=False)


@dataclass
class Row:
    """One measured configuration."""

    path: str  # engine / wyoming / wyoming-streamed-text / http
    voice: str
    chunk_frames: int
    clients: int
    runs: int
    first_audio_p50_ms: float
    first_audio_p95_ms: float
    speed_per_stream: float  # audio s per wall s, median over streams
    speed_aggregate: float  # audio s of all streams / wall s of the block, median over blocks
    queue_wait_ms: float | None = None
    gpu_memory_gb: float | None = None


def summarize(path: str, voice: str, chunk: int, clients: int, blocks: list[list[Sample]], **extra: float | None) -> Row:
    """Fold blocks of concurrent samples into a row."""
    samples = [s for block in blocks for s in block]
    firsts = [s.first_audio * 1000 for s in samples]
    per_stream = [s.audio_s / s.done for s in samples]
    aggregate = [sum(s.audio_s for s in b) / max(s.done for s in b) for b in blocks]
    return Row(
        path, voice, chunk, clients, len(blocks), _pct(firsts, 50), _pct(firsts, 95),
        float(np.median(per_stream)), float(np.median(aggregate)), **extra,  # type: ignore[arg-type]
    )


# ---------------------------------------------------------------------------- bare engine


class Engine:
    """faster-qwen3-tts called directly: the baseline."""

    def __init__(self, checkpoints: dict[ModelKind, Path], frames: int, seed: int) -> None:
        import torch
        from faster_qwen3_tts import FasterQwen3TTS

        self.torch = torch
        self.frames = frames
        self.seed = seed
        self.models = {
            kind: FasterQwen3TTS.from_pretrained(str(path), device="cuda", dtype=torch.bfloat16)
            for kind, path in checkpoints.items()
        }
        for model in self.models.values():
            model.warmup()

    def generate(self, kind: ModelKind, text: str, chunk: int, instruct: str, language: str,
                 reference: tuple[Path, str] | None = None) -> Sample:
        """One streamed generation; times from the call."""
        self.torch.manual_seed(self.seed)
        model = self.models[kind]
        common = dict(language=language, max_new_tokens=self.frames, min_new_tokens=self.frames,
                      chunk_size=chunk, non_streaming_mode=True)
        start = time.perf_counter()
        if kind is ModelKind.VOICE_DESIGN:
            chunks = model.generate_voice_design_streaming(text=text, instruct=instruct, **common)
        else:
            assert reference is not None
            chunks = model.generate_voice_clone_streaming(
                text=text, ref_audio=str(reference[0]), ref_text=reference[1], **common)
        first = None
        samples = 0
        for audio, _sr, _timing in chunks:
            if first is None:
                self.torch.cuda.synchronize()
                first = time.perf_counter() - start
            samples += len(audio)
        done = time.perf_counter() - start
        return Sample(first or done, done, samples / SAMPLE_RATE)

    def serial(self, texts: list[str], chunk: int, instruct: str, language: str) -> list[Sample]:
        """N requests arriving at once, served one after another (no batching: the best a
        single model can do); each stream's times count from the common arrival."""
        out: list[Sample] = []
        offset = 0.0
        for text in texts:
            s = self.generate(ModelKind.VOICE_DESIGN, text, chunk, instruct, language)
            out.append(Sample(offset + s.first_audio, offset + s.done, s.audio_s))
            offset += s.done
        return out

    def memory_gb(self) -> float:
        """Peak GPU memory this process allocated through torch, in GB."""
        return self.torch.cuda.max_memory_allocated() / 1e9


# ---------------------------------------------------------------------------- server


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class ServerProcess:
    """A real server process started as users start it."""

    chunk: int
    proc: subprocess.Popen[bytes]
    port: int
    http_port: int
    log: Path

    def ready(self) -> bool:
        """True once the server logs that it serves. Raises RuntimeError if it exited."""
        text = self.log.read_text(errors="replace")
        if self.proc.poll() is not None:
            raise RuntimeError(f"server (chunk {self.chunk}) exited:\n{text[-3000:]}")
        return "Ready: Wyoming" in text


def start_server(chunk: int, checkpoints: dict[ModelKind, Path], voices_dir: Path, work: Path,
                 frames: int, seed: int) -> ServerProcess:
    """Start ``python -m wyoming_qwen3tts`` on CUDA with this chunk size (frames), exactly
    ``frames`` codec frames per sentence and a fixed seed; logs go to WORK/server-chunkN.log."""
    port, http_port = _free_port(), _free_port()
    log = work / f"server-chunk{chunk}.log"
    args = [
        sys.executable, "-m", "wyoming_qwen3tts", "--uri", f"tcp://127.0.0.1:{port}",
        "--data-dir", str(work / "data"), "--voices-dir", str(voices_dir),
        "--clone-model", str(checkpoints[ModelKind.BASE]),
        "--design-model", str(checkpoints[ModelKind.VOICE_DESIGN]),
        "--device", "cuda", "--chunk-size", str(chunk), "--fixed-frames", str(frames),
        "--seed", str(seed), "--no-zeroconf", "--local-files-only",
        "--http-host", "127.0.0.1", "--http-port", str(http_port),
    ]
    proc = subprocess.Popen(args, stdout=log.open("wb"), stderr=subprocess.STDOUT)
    return ServerProcess(chunk, proc, port, http_port, log)


async def _collect(client: Any, start: float, end_type: str) -> Sample:
    """Read events until ``end_type``, keeping the PCM; times count from ``start``."""
    from wyoming.audio import AudioChunk

    first, pcm = None, bytearray()
    while True:
        event = await client.read_event()
        if event is None:
            raise RuntimeError("server closed the connection")
        if AudioChunk.is_type(event.type):
            first = first or time.perf_counter() - start
            pcm += AudioChunk.from_event(event).audio
        elif event.type == end_type:
            done = time.perf_counter() - start
            return Sample(first or done, done, len(pcm) / 2 / SAMPLE_RATE, bytes(pcm))
        elif event.type == "error":
            raise RuntimeError(f"server error: {event.data}")


async def wyoming_request(port: int, text: str, voice: str) -> Sample:
    """synthesize -> first audio-chunk, audio-stop."""
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    async with AsyncTcpClient("127.0.0.1", port) as client:
        start = time.perf_counter()
        await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=voice)).event())
        return await _collect(client, start, "audio-stop")


async def wyoming_streamed_text(port: int, text: str, voice: str, delta_chars: int, delta_s: float) -> Sample:
    """Home Assistant's streaming path: deltas of a few characters at LLM speed.
    first_audio counts from the first delta."""
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

    async with AsyncTcpClient("127.0.0.1", port) as client:
        start = time.perf_counter()
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name=voice)).event())

        async def feed() -> None:
            for i in range(0, len(text), delta_chars):
                await client.write_event(SynthesizeChunk(text=text[i : i + delta_chars]).event())
                await asyncio.sleep(delta_s)
            await client.write_event(SynthesizeStop().event())

        feeder = asyncio.create_task(feed())
        sample = await _collect(client, start, "synthesize-stopped")
        await feeder
        return sample


async def http_request(http_port: int, text: str, voice: str) -> Sample:
    """POST /v1/audio/speech (pcm): time to first body byte and to the end."""
    import aiohttp

    async with aiohttp.ClientSession() as session:
        start = time.perf_counter()
        body = {"model": "tts-1", "input": text, "voice": voice, "response_format": "pcm"}
        async with session.post(f"http://127.0.0.1:{http_port}/v1/audio/speech", json=body) as resp:
            resp.raise_for_status()
            first, size = None, 0
            async for data in resp.content.iter_any():
                first = first or time.perf_counter() - start
                size += len(data)
        done = time.perf_counter() - start
    return Sample(first or done, done, size / 2 / SAMPLE_RATE)


async def concurrent(port: int, texts: list[str], voice: str) -> list[Sample]:
    """One Wyoming client per text, all sending at the same moment."""
    return list(await asyncio.gather(*(wyoming_request(port, t, voice) for t in texts)))


def scrape(http_port: int, name: str) -> float:
    """Sum of a metric's samples on /metrics (all label sets)."""
    import urllib.request

    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5).read().decode()
    return sum(float(m.group(1)) for m in re.finditer(rf"^{name}(?:{{[^}}]*}})? (\S+)$", text, re.M))


def gpu_memory_by_pid() -> dict[int, float]:
    """GPU memory in GB per process, from nvidia-smi."""
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return {int(p): float(m) / 1024 for p, m in (line.split(",") for line in out.strip().splitlines() if "," in line)}


# ---------------------------------------------------------------------------- report


def write_report(rows: list[Row], extra: dict[str, Any], out: Path) -> str:
    """results.json, results.md and first_audio.png; returns the Markdown table."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps({"rows": [asdict(r) for r in rows], **extra}, indent=2))
    header = ("| path | voice | chunk (frames) | clients | runs | first audio p50 (ms) | p95 (ms) | "
              "audio s / wall s per stream | aggregate | queue wait (ms) | GPU mem (GB) |")
    lines = [header, "|" + "---|" * 11]
    for r in rows:
        qw = f"{r.queue_wait_ms:.0f}" if r.queue_wait_ms is not None else ""
        mem = f"{r.gpu_memory_gb:.1f}" if r.gpu_memory_gb is not None else ""
        lines.append(f"| {r.path} | {r.voice} | {r.chunk_frames} | {r.clients} | {r.runs} | {r.first_audio_p50_ms:.0f} | "
                     f"{r.first_audio_p95_ms:.0f} | {r.speed_per_stream:.2f} | {r.speed_aggregate:.2f} | {qw} | {mem} |")
    ratios = extra.get("ratios", {})
    lines += ["", "| ratio (server / bare engine, same run) | value |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in ratios.items()]
    table = "\n".join(lines)
    (out / "results.md").write_text(f"# Benchmark on {extra.get('gpu')}\n\n{json.dumps(extra.get('settings'))}\n\n{table}\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for path, style in (("engine", "--"), ("wyoming", "-")):
            for chunk in sorted({r.chunk_frames for r in rows}):
                pts = sorted((r.clients, r.first_audio_p50_ms) for r in rows
                             if r.path == path and r.chunk_frames == chunk and r.voice == VOICE)
                if pts:
                    ax.plot(*zip(*pts), style, marker="o", label=f"{path}, chunk {chunk}")
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel("first audio p50 (ms)")
        ax.set_xscale("log", base=2)
        ax.set_title(f"First audio vs concurrency ({extra.get('gpu')})")
        ax.legend(fontsize=8)
        ax.grid(alpha=0.3)
        fig.tight_layout()
        fig.savefig(out / "first_audio.png", dpi=120)
    except ImportError:
        print("matplotlib not installed: no plot", file=sys.stderr)
    return table


# ---------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> None:
    """Run the whole benchmark (see the module docstring). Raises SystemExit without CUDA."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks.bench", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--checkpoints", default=".ckpt/full", help="Where full-size random checkpoints live")
    parser.add_argument("--out", default="benchmarks/results", help="Results go in OUT/<gpu-name>/")
    parser.add_argument("--work", default="/tmp/qwen3tts-bench", help="Server logs and scratch files")
    parser.add_argument("--chunk-sizes", default="1,2,4,8", help="Server chunk sizes (frames), comma separated")
    parser.add_argument("--clients", default="1,2,4,8", help="Concurrency levels")
    parser.add_argument("--frames", type=int, default=24, help="Codec frames per generation (80 ms each)")
    parser.add_argument("--runs", type=int, default=6, help="Runs per single-client configuration")
    parser.add_argument("--concurrent-runs", type=int, default=2, help="Blocks per concurrency level")
    parser.add_argument("--seed", type=int, default=1234)
    args = parser.parse_args(argv)

    import torch

    if not torch.cuda.is_available():
        raise SystemExit("The benchmark needs an NVIDIA GPU")
    gpu = torch.cuda.get_device_name()
    out = Path(args.out) / re.sub(r"[^a-z0-9]+", "-", gpu.lower()).strip("-")
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    chunks = [int(c) for c in args.chunk_sizes.split(",")]
    levels = [int(c) for c in args.clients.split(",")]

    t0 = time.perf_counter()
    checkpoints = {
        kind: build_checkpoint(Path(args.checkpoints) / kind.value, kind.value, "full")
        for kind in (ModelKind.VOICE_DESIGN, ModelKind.BASE)
    }
    print(f"checkpoints ready in {time.perf_counter() - t0:.0f} s", flush=True)
    voices_dir = work / "voices"
    voices_dir.mkdir(exist_ok=True)
    t = np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE
    sf.write(voices_dir / "clone.wav", (0.2 * np.sin(2 * np.pi * 190 * t)).astype(np.float32), SAMPLE_RATE)
    (voices_dir / "clone.txt").write_text(CLONE_TRANSCRIPT)

    servers = {c: start_server(c, checkpoints, voices_dir, work, args.frames, args.seed) for c in chunks}
    engine = Engine(checkpoints, args.frames, args.seed)
    preset = VoiceCatalog(None, {ModelKind.VOICE_DESIGN}).get(VOICE)
    instruct, language = preset.instruct or "", preset.language
    while not all(s.ready() for s in servers.values()):
        time.sleep(0.5)
    print(f"engine and {len(servers)} servers ready at {time.perf_counter() - t0:.0f} s", flush=True)

    loop = asyncio.new_event_loop()
    run = loop.run_until_complete
    rows: list[Row] = []
    mem = gpu_memory_by_pid()

    def interleave(engine_fn: Callable[[], list[Sample]], server_fn: Callable[[], list[Sample]], n: int) -> tuple[list[list[Sample]], list[list[Sample]]]:
        engine_fn(), server_fn()  # warm-up, not counted
        e_blocks, s_blocks = [], []
        for _ in range(n):
            e_blocks.append(engine_fn())
            s_blocks.append(server_fn())
        return e_blocks, s_blocks

    for chunk, server in servers.items():
        for clients in levels:
            texts = TEXTS[:clients]
            n = args.runs if clients == 1 else args.concurrent_runs
            waits0 = scrape(server.http_port, "tts_queue_wait_seconds_sum"), scrape(server.http_port, "tts_queue_wait_seconds_count")
            e_blocks, s_blocks = interleave(
                lambda: engine.serial(texts, chunk, instruct, language),
                lambda: run(concurrent(server.port, texts, VOICE)), n)
            waits1 = scrape(server.http_port, "tts_queue_wait_seconds_sum"), scrape(server.http_port, "tts_queue_wait_seconds_count")
            wait_ms = 1000 * (waits1[0] - waits0[0]) / max(1.0, waits1[1] - waits0[1])
            rows.append(summarize("engine", VOICE, chunk, clients, e_blocks, gpu_memory_gb=engine.memory_gb()))
            rows.append(summarize("wyoming", VOICE, chunk, clients, s_blocks, queue_wait_ms=wait_ms,
                                  gpu_memory_gb=mem.get(server.proc.pid)))
            print(f"chunk {chunk} clients {clients}: done at {time.perf_counter() - t0:.0f} s", flush=True)

    # Home Assistant streamed text and HTTP, at each chunk size, one client, interleaved with the engine.
    for chunk, server in servers.items():
        e_blocks, s_blocks = interleave(
            lambda: [engine.generate(ModelKind.VOICE_DESIGN, TEXTS[0], chunk, instruct, language)],
            lambda: [run(http_request(server.http_port, TEXTS[0], VOICE))], args.runs)
        rows.append(summarize("http (TTFB)", VOICE, chunk, 1, s_blocks))
        streamed = [[run(wyoming_streamed_text(server.port, STREAMED_TEXT, VOICE, 4, 0.025))] for _ in range(max(3, args.runs // 2))]
        rows.append(summarize("wyoming streamed text (from first delta)", VOICE, chunk, 1, streamed))

    # Cloning (Base model), default chunk size, one client.
    ref = (voices_dir / "clone.wav", CLONE_TRANSCRIPT)
    clone_chunk = 2 if 2 in servers else chunks[0]
    e_blocks, s_blocks = interleave(
        lambda: [engine.generate(ModelKind.BASE, TEXTS[0], clone_chunk, "", "auto", ref)],
        lambda: [run(wyoming_request(servers[clone_chunk].port, TEXTS[0], "clone"))], args.runs)
    rows.append(summarize("engine", "clone", clone_chunk, 1, e_blocks))
    rows.append(summarize("wyoming", "clone", clone_chunk, 1, s_blocks))

    # Isolation: 8 concurrent clients each get exactly the audio a lone client gets.
    iso_server = servers[clone_chunk]
    texts = TEXTS[: max(levels)]
    alone = {t: run(wyoming_request(iso_server.port, t, VOICE)).pcm for t in texts}
    again = run(wyoming_request(iso_server.port, texts[0], VOICE)).pcm
    together = run(concurrent(iso_server.port, texts, VOICE))
    expected_bytes = round(engine.generate(ModelKind.VOICE_DESIGN, texts[0], clone_chunk, instruct, language).audio_s * SAMPLE_RATE) * 2
    isolation = {
        "clients": len(texts),
        "single_client_repeatable": again == alone[texts[0]],
        "identical_to_single_client": sum(alone[t] == s.pcm for t, s in zip(texts, together)),
        "bytes_per_stream": expected_bytes,
        "frames_per_stream": expected_bytes // (2 * SAMPLES_PER_FRAME),
        "all_lengths_equal_engine": all(len(s.pcm) == expected_bytes for s in together) and all(len(p) == expected_bytes for p in alone.values()),
        "distinct_streams": len({s.pcm for s in together}),
    }

    ratios: dict[str, float] = {}
    for chunk in chunks:
        def get(path: str, voice: str = VOICE, c: int = chunk) -> Row:
            return next(r for r in rows if r.path == path and r.chunk_frames == c and r.clients == 1 and r.voice == voice)
        eng = get("engine")
        ratios[f"wyoming first audio p95, chunk {chunk}"] = get("wyoming").first_audio_p95_ms / eng.first_audio_p95_ms
        ratios[f"wyoming first audio p50, chunk {chunk}"] = get("wyoming").first_audio_p50_ms / eng.first_audio_p50_ms
        ratios[f"http TTFB p95, chunk {chunk}"] = get("http (TTFB)").first_audio_p95_ms / eng.first_audio_p95_ms
    ratios["clone wyoming first audio p95"] = (
        next(r for r in rows if r.voice == "clone" and r.path == "wyoming").first_audio_p95_ms
        / next(r for r in rows if r.voice == "clone" and r.path == "engine").first_audio_p95_ms)

    for server in servers.values():
        server.proc.terminate()
    extra = {
        "gpu": gpu,
        "settings": {"frames_per_generation": args.frames, "seed": args.seed, "chunk_sizes": chunks,
                     "clients": levels, "runs": args.runs, "concurrent_runs": args.concurrent_runs,
                     "torch": torch.__version__, "checkpoints": "random full-size 1.7B (VoiceDesign, Base), bf16"},
        "ratios": ratios,
        "isolation": isolation,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    table = write_report(rows, extra, out)
    print(table)
    print("isolation:", json.dumps(isolation))
    print(f"results in {out}")


if __name__ == "__main__":
    main()
