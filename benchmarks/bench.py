"""GPU benchmark: first audio and speed at the client, against the bare engine, in one run.

``python -m benchmarks.bench`` on a machine with an NVIDIA GPU:

1. builds full-size random 1.7B VoiceDesign and Base checkpoints (offline) unless present;
2. loads the bare engine (faster-qwen3-tts's own streaming generator) in this process and
   starts one real server process per chunk size (``--device cuda --fixed-frames N --seed S
   --max-streams M``);
3. measures, interleaved (engine, server, engine, server, ...) so that drift between blocks
   of runs cancels, never both on the GPU at the same moment:
   one client: the Wyoming ``synthesize`` -> first ``audio-chunk`` / ``audio-stop``, the HTTP
   endpoint's time to first byte, Home Assistant-style streamed text (a few characters per
   delta at LLM speed); 1, 2, 4, 8 and 16 concurrent Wyoming clients (the bare engine serves
   them one after another: it cannot batch); streamed text from 4 clients at once; cloning;
4. reads the server's join stall (GPU time of a batched prefill, during which running
   streams wait) from ``/metrics`` and its memory per slot from its log;
5. checks that under 8 concurrent clients every client gets its own audio (same seed,
   distinct texts, compared with single-client runs);
6. writes ``results.json``, ``results.md`` and ``first_audio.png`` to
   ``benchmarks/results/<gpu-name>/`` and prints the table.

Every generation is exactly ``--frames`` codec frames (``min_new_tokens = max_new_tokens``),
so like is compared with like. First audio and speed are reported as server / engine ratios.
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

from wyoming_qwen3tts.common.audio import SAMPLE_RATE, SAMPLES_PER_FRAME
from wyoming_qwen3tts.testing.checkpoint import build_checkpoint
from wyoming_qwen3tts.common.vocabulary import ModelKind
from wyoming_qwen3tts.catalogue.voices import VoiceCatalog

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
#: The baseline's row label: faster-qwen3-tts's own streaming generator, in this process.
BARE = "bare faster-qwen3-tts"
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
    speed_min_stream: float | None = None  # the slowest stream's audio s per wall s
    join_stall_ms: float | None = None  # mean GPU time of a batched prefill (server)


def summarize(path: str, voice: str, chunk: int, clients: int, blocks: list[list[Sample]], **extra: float | None) -> Row:
    """Fold blocks of concurrent samples into a row."""
    samples = [s for block in blocks for s in block]
    firsts = [s.first_audio * 1000 for s in samples]
    per_stream = [s.audio_s / s.done for s in samples]
    aggregate = [sum(s.audio_s for s in b) / max(s.done for s in b) for b in blocks]
    return Row(
        path, voice, chunk, clients, len(blocks), _pct(firsts, 50), _pct(firsts, 95),
        float(np.median(per_stream)), float(np.median(aggregate)),
        speed_min_stream=float(min(per_stream)), **extra,  # type: ignore[arg-type]
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
                 frames: int, seed: int, max_streams: int) -> ServerProcess:
    """Start ``python -m wyoming_qwen3tts`` on CUDA with this chunk size (frames), exactly
    ``frames`` codec frames per sentence, a fixed seed and ``max_streams`` slots per model;
    logs go to WORK/server-chunkN.log."""
    port, http_port = _free_port(), _free_port()
    log = work / f"server-chunk{chunk}.log"
    args = [
        sys.executable, "-m", "wyoming_qwen3tts", "--uri", f"tcp://127.0.0.1:{port}",
        "--data-dir", str(work / "data"), "--voices-dir", str(voices_dir),
        "--clone-model", str(checkpoints[ModelKind.BASE]),
        "--design-model", str(checkpoints[ModelKind.VOICE_DESIGN]),
        "--device", "cuda", "--chunk-size", str(chunk), "--fixed-frames", str(frames),
        "--seed", str(seed), "--no-zeroconf", "--local-files-only", "--max-streams", str(max_streams),
        "--anchors", "off",  # presets designed live, as the bare engine designs them
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


async def concurrent_streamed(port: int, text: str, voice: str, clients: int) -> list[Sample]:
    """``clients`` Home Assistant-style streamed texts at the same moment."""
    return list(await asyncio.gather(*(wyoming_streamed_text(port, text, voice, 4, 0.025) for _ in range(clients))))


def slot_mb(log: Path) -> float | None:
    """The server's memory per slot (MB), from its start-up log line."""
    found = re.search(r"slots of (\d+) MB", log.read_text(errors="replace"))
    return float(found.group(1)) if found else None


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
              "audio s / wall s per stream (median) | slowest stream | aggregate | queue wait (ms) | "
              "join stall (ms) | GPU mem (GB) |")
    lines = [header, "|" + "---|" * 13]

    def fmt(value: float | None, digits: int) -> str:
        return f"{value:.{digits}f}" if value is not None else ""

    for r in rows:
        lines.append(f"| {r.path} | {r.voice} | {r.chunk_frames} | {r.clients} | {r.runs} | {r.first_audio_p50_ms:.0f} | "
                     f"{r.first_audio_p95_ms:.0f} | {r.speed_per_stream:.2f} | {fmt(r.speed_min_stream, 2)} | "
                     f"{r.speed_aggregate:.2f} | {fmt(r.queue_wait_ms, 0)} | {fmt(r.join_stall_ms, 1)} | "
                     f"{fmt(r.gpu_memory_gb, 1)} |")
    ratios = extra.get("ratios", {})
    lines += ["", "| ratio (server / bare engine, same run) | value |", "|---|---|"]
    lines += [f"| {k} | {v:.3f} |" for k, v in ratios.items()]
    targets = extra.get("targets", {})
    if targets:
        lines += ["", "| target | measured | met |", "|---|---|---|"]
        lines += [f"| {k} | {v['measured']} | {'yes' if v['met'] else 'NO'} |" for k, v in targets.items()]
    table = "\n".join(lines)
    (out / "results.md").write_text(f"# Benchmark on {extra.get('gpu')}\n\n{json.dumps(extra.get('settings'))}\n\n{table}\n")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(7, 4.5))
        for path, style in ((BARE, "--"), ("wyoming", "-")):
            for chunk in sorted({r.chunk_frames for r in rows}):
                pts = sorted((r.clients, r.first_audio_p95_ms) for r in rows
                             if r.path == path and r.chunk_frames == chunk and r.voice == VOICE)
                if len(pts) > 1:
                    ax.plot(*zip(*pts), style, marker="o", label=f"{path}, chunk {chunk}")
        ax.set_xlabel("concurrent clients")
        ax.set_ylabel("first audio p95 (ms)")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
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
    parser.add_argument("--chunk-sizes", default="1,2", help="Server chunk sizes (frames), comma separated")
    parser.add_argument("--clients", default="1,2,4,8,16", help="Concurrency levels (at --concurrency-chunk)")
    parser.add_argument("--concurrency-chunk", type=int, default=2, help="Chunk size of the concurrency rows")
    parser.add_argument("--max-streams", type=int, default=16, help="Server slots per model")
    parser.add_argument("--frames", type=int, default=24, help="Codec frames per generation (80 ms each)")
    parser.add_argument("--runs", type=int, default=8, help="Runs per single-client configuration")
    parser.add_argument("--concurrent-runs", type=int, default=3, help="Blocks per concurrency level")
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
    conc_chunk = args.concurrency_chunk if args.concurrency_chunk in chunks else chunks[0]

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

    servers = {c: start_server(c, checkpoints, voices_dir, work, args.frames, args.seed, args.max_streams)
               for c in chunks}
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

    def stall_ms(server: ServerProcess, before: tuple[float, float]) -> float | None:
        after = (scrape(server.http_port, "tts_join_stall_seconds_sum"),
                 scrape(server.http_port, "tts_join_stall_seconds_count"))
        count = after[1] - before[1]
        return 1000 * (after[0] - before[0]) / count if count else None

    def stall_mark(server: ServerProcess) -> tuple[float, float]:
        return (scrape(server.http_port, "tts_join_stall_seconds_sum"),
                scrape(server.http_port, "tts_join_stall_seconds_count"))

    # One client at each chunk size: Wyoming, HTTP and streamed text, interleaved with the engine.
    for chunk, server in servers.items():
        mark = stall_mark(server)
        e_blocks, s_blocks = interleave(
            lambda: [engine.generate(ModelKind.VOICE_DESIGN, TEXTS[0], chunk, instruct, language)],
            lambda: [run(wyoming_request(server.port, TEXTS[0], VOICE))], args.runs)
        rows.append(summarize(BARE, VOICE, chunk, 1, e_blocks, gpu_memory_gb=engine.memory_gb()))
        rows.append(summarize("wyoming", VOICE, chunk, 1, s_blocks, gpu_memory_gb=mem.get(server.proc.pid),
                              join_stall_ms=stall_ms(server, mark)))
        _e, h_blocks = interleave(
            lambda: [engine.generate(ModelKind.VOICE_DESIGN, TEXTS[0], chunk, instruct, language)],
            lambda: [run(http_request(server.http_port, TEXTS[0], VOICE))], args.runs)
        rows.append(summarize("http (TTFB)", VOICE, chunk, 1, h_blocks))
        streamed = [[run(wyoming_streamed_text(server.port, STREAMED_TEXT, VOICE, 4, 0.025))]
                    for _ in range(max(3, args.runs // 2))]
        rows.append(summarize("wyoming streamed text (from first delta)", VOICE, chunk, 1, streamed))
        print(f"chunk {chunk}, one client: done at {time.perf_counter() - t0:.0f} s", flush=True)

    # Concurrency: N Wyoming clients at once; the bare engine serves them one after another.
    server = servers[conc_chunk]
    for clients in levels:
        if clients == 1:
            continue
        texts = (TEXTS * ((clients + len(TEXTS) - 1) // len(TEXTS)))[:clients]
        waits0 = scrape(server.http_port, "tts_queue_wait_seconds_sum"), scrape(server.http_port, "tts_queue_wait_seconds_count")
        mark = stall_mark(server)
        e_blocks, s_blocks = interleave(
            lambda: engine.serial(texts, conc_chunk, instruct, language),
            lambda: run(concurrent(server.port, texts, VOICE)), args.concurrent_runs)
        waits1 = scrape(server.http_port, "tts_queue_wait_seconds_sum"), scrape(server.http_port, "tts_queue_wait_seconds_count")
        wait_ms = 1000 * (waits1[0] - waits0[0]) / max(1.0, waits1[1] - waits0[1])
        rows.append(summarize(BARE, VOICE, conc_chunk, clients, e_blocks))
        rows.append(summarize("wyoming", VOICE, conc_chunk, clients, s_blocks, queue_wait_ms=wait_ms,
                              join_stall_ms=stall_ms(server, mark), gpu_memory_gb=gpu_memory_by_pid().get(server.proc.pid)))
        print(f"{clients} clients: done at {time.perf_counter() - t0:.0f} s", flush=True)
    streamed4 = [run(concurrent_streamed(server.port, STREAMED_TEXT, VOICE, 4)) for _ in range(args.concurrent_runs)]
    rows.append(summarize("wyoming streamed text (from first delta)", VOICE, conc_chunk, 4, streamed4))

    # Cloning (Base model, ICL), one client.
    ref = (voices_dir / "clone.wav", CLONE_TRANSCRIPT)
    e_blocks, s_blocks = interleave(
        lambda: [engine.generate(ModelKind.BASE, TEXTS[0], conc_chunk, "", "auto", ref)],
        lambda: [run(wyoming_request(server.port, TEXTS[0], "clone"))], args.runs)
    rows.append(summarize(BARE, "clone", conc_chunk, 1, e_blocks))
    rows.append(summarize("wyoming", "clone", conc_chunk, 1, s_blocks))

    # Isolation: 8 concurrent clients, each against what a lone client gets.
    texts = TEXTS[:8]
    alone = {t: run(wyoming_request(server.port, t, VOICE)).pcm for t in texts}
    again = run(wyoming_request(server.port, texts[0], VOICE)).pcm
    together = run(concurrent(server.port, texts, VOICE))
    expected_bytes = args.frames * SAMPLES_PER_FRAME * 2

    def max_diff(a: bytes, b: bytes) -> int:
        if len(a) != len(b):
            return 1 << 16
        return int(np.abs(np.frombuffer(a, "<i2").astype(np.int32) - np.frombuffer(b, "<i2")).max())

    isolation = {
        "clients": len(texts),
        "single_client_repeatable": again == alone[texts[0]],
        "identical_to_single_client": sum(alone[t] == s.pcm for t, s in zip(texts, together)),
        "max_sample_difference_to_single_client": max(max_diff(alone[t], s.pcm) for t, s in zip(texts, together)),
        "frames_per_stream": args.frames,
        "all_lengths_exact": all(len(s.pcm) == expected_bytes for s in together)
        and all(len(p) == expected_bytes for p in alone.values()),
        "distinct_streams": len({s.pcm for s in together}),
    }

    def get(path: str, chunk: int, clients: int = 1, voice: str = VOICE) -> Row:
        return next(r for r in rows if r.path == path and r.chunk_frames == chunk and r.clients == clients and r.voice == voice)

    ratios: dict[str, float] = {}
    for chunk in chunks:
        eng, wyo = get(BARE, chunk), get("wyoming", chunk)
        ratios[f"wyoming first audio p95, chunk {chunk}"] = wyo.first_audio_p95_ms / eng.first_audio_p95_ms
        ratios[f"wyoming first audio p50, chunk {chunk}"] = wyo.first_audio_p50_ms / eng.first_audio_p50_ms
        ratios[f"engine speed / wyoming speed, chunk {chunk}"] = eng.speed_per_stream / wyo.speed_per_stream
        ratios[f"http TTFB p95, chunk {chunk}"] = get("http (TTFB)", chunk).first_audio_p95_ms / eng.first_audio_p95_ms
    ratios["clone wyoming first audio p95"] = (
        get("wyoming", conc_chunk, voice="clone").first_audio_p95_ms / get(BARE, conc_chunk, voice="clone").first_audio_p95_ms)

    targets: dict[str, dict[str, Any]] = {}

    def target(name: str, measured: float, ok: bool, unit: str = "") -> None:
        targets[name] = {"measured": f"{measured:.2f}{unit}", "met": bool(ok)}

    for clients, speed, p95 in ((8, 2.0, 150.0), (16, 1.5, 250.0)):
        if clients in levels:
            r = get("wyoming", conc_chunk, clients)
            target(f"{clients} clients: slowest stream >= {speed}x realtime", r.speed_min_stream or 0, (r.speed_min_stream or 0) >= speed, "x")
            target(f"{clients} clients: first audio p95 <= {p95:.0f} ms", r.first_audio_p95_ms, r.first_audio_p95_ms <= p95, " ms")
    for chunk in chunks:
        target(f"one client, chunk {chunk}: first audio p95 ratio <= 1.05", ratios[f"wyoming first audio p95, chunk {chunk}"],
               ratios[f"wyoming first audio p95, chunk {chunk}"] <= 1.05)
        target(f"one client, chunk {chunk}: speed ratio (engine / server) <= 1.05", ratios[f"engine speed / wyoming speed, chunk {chunk}"],
               ratios[f"engine speed / wyoming speed, chunk {chunk}"] <= 1.05)
    if 1 in chunks:
        r = get("wyoming", 1)
        target("chunk 1: first audio p50 <= 50 ms", r.first_audio_p50_ms, r.first_audio_p50_ms <= 50, " ms")
        target("chunk 1: first audio p95 <= 70 ms", r.first_audio_p95_ms, r.first_audio_p95_ms <= 70, " ms")
        target("chunk 1: speed >= 6x realtime", r.speed_per_stream, r.speed_per_stream >= 6, "x")
    ha = next(r for r in rows if r.path.startswith("wyoming streamed") and r.clients == 1 and r.chunk_frames == conc_chunk)
    target("streamed text (1 client): first audio p95 <= 250 ms", ha.first_audio_p95_ms, ha.first_audio_p95_ms <= 250, " ms")

    for proc in servers.values():
        proc.proc.terminate()
    extra = {
        "gpu": gpu,
        "settings": {"frames_per_generation": args.frames, "seed": args.seed, "chunk_sizes": chunks,
                     "clients": levels, "concurrency_chunk": conc_chunk, "max_streams": args.max_streams,
                     "runs": args.runs, "concurrent_runs": args.concurrent_runs, "torch": torch.__version__,
                     "checkpoints": "random full-size 1.7B (VoiceDesign, Base), bf16",
                     "server_slot_mb": slot_mb(servers[conc_chunk].log)},
        "ratios": ratios,
        "targets": targets,
        "isolation": isolation,
        "wall_s": round(time.perf_counter() - t0, 1),
    }
    table = write_report(rows, extra, out)
    print(table)
    print("isolation:", json.dumps(isolation))
    print(f"results in {out}")


if __name__ == "__main__":
    main()
