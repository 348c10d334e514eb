"""Soak: a running server under a steady mix of real clients, for N requests or T minutes.

``python -m benchmarks.soak --wyoming-port 10200 --http-port 8880 --requests 1000`` (or
``--minutes 30``) against a server that is already running, here or on the GPU machine.
``--concurrency`` clients each send one request after another, drawn (seeded) from:

* ``wyoming``: one-shot ``synthesize``; ``wyoming-stream``: streamed text as Home Assistant
  sends it (``synthesize-start``, small deltas, the compatibility ``synthesize``,
  ``synthesize-stop``), which must end in ``synthesize-stopped``;
* ``http-<format>``: ``POST /v1/audio/speech`` in pcm, wav, mp3, opus, aac and flac (and
  SSE), whose whole body must decode (soundfile for pcm/wav/flac, PyAV for the rest);
* ``cancel-wyoming`` / ``cancel-http``: the client leaves after its first audio;
* ``bad-wyoming`` / ``bad-http``: malformed events and bodies, unknown voices, empty text,
  out-of-range fields, which must get an ``error`` / a 4xx in OpenAI's shape while the
  connection stays usable.

A request "fails" when anything else happens: a 5xx, a dropped connection, a missing
``audio-stop`` or ``synthesize-stopped``, audio that does not decode, a refusal with
``overloaded`` (run fewer clients than ``--max-queue``), or a reply later than ``--timeout``.

Meanwhile the server's memory is sampled every ``--sample-s``: RSS from ``/proc`` (``--pid``,
or the process listening on the Wyoming port) and, when ``nvidia-smi`` is there, its GPU
memory. Growth is measured after ``--warmup`` requests: the mean of the last tenth of the
samples against the first sample after warm-up.

Writes ``soak.json`` (config, outcomes by kind, first-audio percentiles by kind, the
memory series and growth, the failures) and ``soak.png`` (memory and first audio over
time) to ``--out``, prints a summary, and exits 1 when a request failed or memory grew
more than ``--max-growth`` (10 %).
"""

from __future__ import annotations

import argparse
import asyncio
import base64
import io
import json
import math
import random
import shutil
import subprocess
import sys
import time
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import soundfile as sf

#: Sentences the requests are built from (each request takes one to three).
SENTENCES = [
    "The kitchen lights are off.",
    "Tomorrow will be sunny with a light breeze.",
    "Your package is at the front door.",
    "It is twenty one degrees in the living room.",
    "Remember to water the plants this evening.",
    "The garage door has been open for an hour.",
    "Your next meeting starts in fifteen minutes.",
    "Sure, I turned on the hallway lights.",
]
#: Kinds and their weights in the mix.
MIX = {
    "wyoming": 4,
    "wyoming-stream": 3,
    "http-pcm": 1,
    "http-wav": 1,
    "http-mp3": 1,
    "http-opus": 1,
    "http-aac": 1,
    "http-flac": 1,
    "http-sse": 1,
    "cancel-wyoming": 1,
    "cancel-http": 1,
    "bad-wyoming": 1,
    "bad-http": 1,
}
_BAD_WYOMING: list[tuple[bytes, str]] = [
    (b"not json at all\n", "malformed-event"),
    (b'{"type": "synthesize", "data": {"text": "' + b"x" * 20_000 + b'"}}\n', "text-too-long"),
    (b'{"type": "synthesize", "data": {"text": "Hi.", "voice": {"name": "nobody-here"}}}\n', "unknown-voice"),
    (b'{"type": "synthesize", "data": {"text": "Hi.", "voice": {"name": "aria", "language": "xx"}}}\n', "unsupported-language"),
    (b'{"type": "synthesize-chunk", "data": {"text": "orphan"}}\n', "bad-request"),
    (b'{"type": "synthesize", "data": {"text": 5}}\n', "malformed-event"),
]
_BAD_HTTP: list[tuple[bytes, int]] = [
    (b"{not json", 400),
    (b'{"input": ""}', 400),
    (b'{"input": "Hi.", "voice": "nobody-here"}', 404),
    (b'{"input": "Hi.", "speed": 9}', 400),
    (b'{"input": "Hi.", "response_format": "ogg"}', 400),
    (b'{"input": "Hi.", "model": "whisper-1"}', 404),
]


@dataclass
class Result:
    """One request. Times in seconds since the soak began; durations in seconds."""

    kind: str
    start: float
    outcome: str = "ok"  # ok, failed
    first_audio: float | None = None
    duration: float = 0.0
    audio_s: float = 0.0
    detail: str = ""


@dataclass
class MemorySample:
    """Server memory at ``t`` seconds since the soak began, in MiB."""

    t: float
    rss_mib: float
    gpu_mib: float | None = None
    done: int = 0  # requests finished by then


@dataclass
class Soak:
    """What the clients share: addresses, limits, the seeded mix and the results."""

    host: str
    wyoming_port: int
    http_port: int
    api_key: str | None
    timeout: float
    rng: random.Random
    started: float = field(default_factory=time.monotonic)
    results: list[Result] = field(default_factory=list)

    def now(self) -> float:
        return time.monotonic() - self.started


# --- Wyoming ----------------------------------------------------------------------------


def _event(event_type: str, data: dict[str, Any] | None = None) -> bytes:
    body = json.dumps(data or {}).encode()
    return json.dumps({"type": event_type, "data_length": len(body)}).encode() + b"\n" + body


async def _read_event(reader: asyncio.StreamReader) -> tuple[str, dict[str, Any], bytes] | None:
    line = await reader.readline()
    if not line:
        return None
    header = json.loads(line)
    data = header.get("data") or {}
    if header.get("data_length"):
        data.update(json.loads(await reader.readexactly(header["data_length"])))
    payload = await reader.readexactly(header["payload_length"]) if header.get("payload_length") else b""
    return header["type"], data, payload


async def _wyoming(soak: Soak, result: Result, streamed: bool, cancel: bool) -> None:
    text = " ".join(soak.rng.sample(SENTENCES, soak.rng.randint(1, 3)))
    reader, writer = await asyncio.open_connection(soak.host, soak.wyoming_port)
    sent = time.monotonic()
    try:
        if streamed:
            writer.write(_event("synthesize-start", {"voice": {"name": "aria"}}))
            cuts = sorted(soak.rng.sample(range(1, len(text)), min(6, len(text) - 1)))
            for a, b in zip([0] + cuts, cuts + [len(text)]):
                writer.write(_event("synthesize-chunk", {"text": text[a:b]}))
            writer.write(_event("synthesize", {"text": text}))
            writer.write(_event("synthesize-stop"))
        else:
            writer.write(_event("synthesize", {"text": text, "voice": {"name": "aria"}}))
        await writer.drain()
        end = "synthesize-stopped" if streamed else "audio-stop"
        samples = 0
        while True:
            event = await _read_event(reader)
            if event is None:
                raise ConnectionError(f"connection closed before {end}")
            kind, data, payload = event
            if kind == "error":
                raise RuntimeError(f"error {data.get('code')}: {data.get('text')}")
            if kind == "audio-chunk":
                if result.first_audio is None:
                    result.first_audio = time.monotonic() - sent
                    if cancel:
                        return
                samples += len(payload) // 2
            if kind == end:
                break
        if samples == 0 or samples % 1920:
            raise RuntimeError(f"{samples} samples: not a whole number of codec frames")
        result.audio_s = samples / 24000
    finally:
        writer.close()


async def _bad_wyoming(soak: Soak, result: Result) -> None:
    data, code = soak.rng.choice(_BAD_WYOMING)
    reader, writer = await asyncio.open_connection(soak.host, soak.wyoming_port)
    try:
        writer.write(data + _event("describe"))
        await writer.drain()
        event = await _read_event(reader)
        if event is None or event[0] != "error" or event[1].get("code") != code:
            raise RuntimeError(f"expected error {code}, got {event and event[:2]}")
        event = await _read_event(reader)
        if data.startswith(b'{"type": "synthesize", '):
            if event is not None:  # a refused synthesize ends the connection (as wyoming-piper's)
                raise RuntimeError(f"the connection went on after a refused synthesize: {event[0]}")
        elif event is None or event[0] != "info":  # the connection still answers
            raise RuntimeError(f"no info after the error: {event and event[0]}")
    finally:
        writer.close()


# --- HTTP -------------------------------------------------------------------------------


def _decoded_seconds(data: bytes, fmt: str) -> float:
    if fmt == "pcm":
        return len(data) / 2 / 24000
    if fmt in ("wav", "flac"):
        info = sf.info(io.BytesIO(data))
        return float(info.frames) / info.samplerate
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        samples = sum(frame.samples for frame in container.decode(stream))
        return samples / stream.codec_context.sample_rate


async def _http(soak: Soak, session: aiohttp.ClientSession, result: Result, fmt: str, sse: bool, cancel: bool) -> None:
    text = " ".join(soak.rng.sample(SENTENCES, soak.rng.randint(1, 3)))
    body: dict[str, Any] = {"input": text, "voice": "alloy", "response_format": fmt}
    if sse:
        body["stream_format"] = "sse"
    sent = time.monotonic()
    async with session.post(f"http://{soak.host}:{soak.http_port}/v1/audio/speech", json=body) as resp:
        if resp.status != 200:
            raise RuntimeError(f"HTTP {resp.status}: {(await resp.text())[:300]}")
        first = await resp.content.readany()
        result.first_audio = time.monotonic() - sent
        if cancel:
            resp.close()
            return
        data = first + await resp.read()
    if sse:
        events = [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: ")]
        if not events or events[-1].get("type") != "speech.audio.done":
            raise RuntimeError(f"SSE ended with {events[-1] if events else None}")
        data = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    result.audio_s = _decoded_seconds(data, fmt)
    if result.audio_s <= 0:
        raise RuntimeError("no audio")


async def _bad_http(soak: Soak, session: aiohttp.ClientSession, result: Result) -> None:
    data, status = soak.rng.choice(_BAD_HTTP)
    async with session.post(
        f"http://{soak.host}:{soak.http_port}/v1/audio/speech", data=data,
        headers={"Content-Type": "application/json"},
    ) as resp:
        error = (await resp.json()).get("error", {})
        if resp.status != status or set(error) != {"message", "type", "param", "code"}:
            raise RuntimeError(f"expected {status} in OpenAI's shape, got {resp.status} {error}")


# --- the run ----------------------------------------------------------------------------


async def _dispatch(soak: Soak, session: aiohttp.ClientSession, result: Result) -> None:
    kind = result.kind
    if kind in ("wyoming", "wyoming-stream", "cancel-wyoming"):
        await _wyoming(soak, result, streamed=kind == "wyoming-stream", cancel=kind.startswith("cancel"))
    elif kind == "bad-wyoming":
        await _bad_wyoming(soak, result)
    elif kind == "bad-http":
        await _bad_http(soak, session, result)
    else:
        fmt = {"http-sse": "pcm", "cancel-http": "pcm"}.get(kind, kind.removeprefix("http-"))
        await _http(soak, session, result, fmt, sse=kind == "http-sse", cancel=kind == "cancel-http")


async def one(soak: Soak, session: aiohttp.ClientSession, kind: str) -> Result:
    """Run one request of ``kind``; a failure is recorded, never raised."""
    result = Result(kind, soak.now())
    began = time.monotonic()
    try:
        await asyncio.wait_for(_dispatch(soak, session, result), soak.timeout)
    except Exception as err:  # noqa: BLE001 - every failure is a finding of the soak
        result.outcome, result.detail = "failed", f"{type(err).__name__}: {err}"[:400]
    result.duration = time.monotonic() - began
    return result


async def client(soak: Soak, session: aiohttp.ClientSession, budget: dict[str, float]) -> None:
    kinds, weights = list(MIX), list(MIX.values())
    while budget["left"] > 0 and time.monotonic() < budget["deadline"]:
        budget["left"] -= 1
        kind = soak.rng.choices(kinds, weights)[0]
        soak.results.append(await one(soak, session, kind))


def server_pid(port: int) -> int | None:
    """The process listening on TCP ``port`` (psutil), or None."""
    import psutil

    for conn in psutil.net_connections(kind="tcp"):
        if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
            return int(conn.pid)
    return None


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS for process {pid}")


def gpu_mib(pid: int) -> float | None:
    """GPU memory of ``pid`` from nvidia-smi, in MiB (None without nvidia-smi or GPU use)."""
    if shutil.which("nvidia-smi") is None:
        return None
    out = subprocess.run(
        ["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
        capture_output=True, text=True, check=False,
    ).stdout
    used = [float(mem) for p, mem in (line.split(",") for line in out.splitlines() if "," in line) if int(p) == pid]
    return sum(used) if used else None


async def sample_memory(soak: Soak, pid: int, every: float, samples: list[MemorySample], stop: asyncio.Event) -> None:
    while True:
        gpu = await asyncio.to_thread(gpu_mib, pid)
        samples.append(MemorySample(soak.now(), rss_mib(pid), gpu, len(soak.results)))
        try:
            await asyncio.wait_for(stop.wait(), every)
            return
        except asyncio.TimeoutError:
            pass


def percentiles(values: list[float]) -> dict[str, float]:
    if not values:
        return {}
    return {f"p{q}": round(float(np.percentile(values, q)) * 1000, 1) for q in (50, 90, 95, 99)} | {"n": len(values)}


def growth(samples: list[MemorySample], warmup: int, key: str) -> dict[str, float] | None:
    """Memory after warm-up: the first sample once ``warmup`` requests were done, against
    the mean of the last tenth of the run."""
    series = [(s.done, getattr(s, key)) for s in samples if getattr(s, key) is not None]
    after = [value for done, value in series if done >= warmup]
    if len(after) < 3:
        return None
    base = after[0]
    tail = float(np.mean(after[-max(1, len(after) // 10) :]))
    return {"baseline_mib": round(base, 1), "end_mib": round(tail, 1), "growth_pct": round(100 * (tail - base) / base, 2)}


def plot(report: dict[str, Any], results: list[Result], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (mem, lat) = plt.subplots(2, 1, figsize=(12, 7), sharex=True)
    series = report["memory"]["samples"]
    t = [s["t"] for s in series]
    mem.plot(t, [s["rss_mib"] for s in series], label="server RSS")
    if any(s["gpu_mib"] is not None for s in series):
        mem.plot(t, [s["gpu_mib"] or math.nan for s in series], label="server GPU memory")
    warm = next((s["t"] for s in series if s["done"] >= report["config"]["warmup"]), None)
    if warm is not None:
        mem.axvline(warm, color="grey", linestyle="--", label="end of warm-up")
    mem.set_ylabel("MiB")
    mem.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    mem.set_title(
        f"Soak: {len(results)} requests, {report['failed']} failed; "
        f"RSS growth after warm-up {report['memory']['rss_growth'] and report['memory']['rss_growth']['growth_pct']} %"
    )
    colours = plt.get_cmap("tab20")
    for i, kind in enumerate(sorted({r.kind for r in results})):
        points = [(r.start, r.first_audio * 1000) for r in results if r.kind == kind and r.first_audio is not None]
        if points:
            lat.scatter(*zip(*points), s=8, label=kind, color=colours(i % 20))
    failed = [r.start for r in results if r.outcome == "failed"]
    if failed:
        lat.scatter(failed, [0] * len(failed), marker="x", color="red", label="failed")
    lat.set_yscale("log")
    lat.set_ylabel("first audio (ms)")
    lat.set_xlabel("seconds since start")
    lat.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    fig.tight_layout()
    fig.savefig(path, dpi=110)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    soak = Soak(args.host, args.wyoming_port, args.http_port, args.api_key, args.timeout, random.Random(args.seed))
    pid = args.pid or server_pid(args.wyoming_port)
    if pid is None:
        raise SystemExit(f"no process listens on port {args.wyoming_port} here: pass --pid")
    budget = {"left": float(args.requests or math.inf), "deadline": time.monotonic() + 60 * (args.minutes or math.inf)}
    samples: list[MemorySample] = []
    stop = asyncio.Event()
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else None
    sampler = asyncio.create_task(sample_memory(soak, pid, args.sample_s, samples, stop))
    async with aiohttp.ClientSession(headers=headers, timeout=aiohttp.ClientTimeout(total=args.timeout)) as session:
        await asyncio.gather(*(client(soak, session, budget) for _ in range(args.concurrency)))
    stop.set()
    await sampler
    results = soak.results
    by_kind: dict[str, Counter[str]] = {}
    for r in results:
        by_kind.setdefault(r.kind, Counter())[r.outcome] += 1
    report: dict[str, Any] = {
        "config": {k: v for k, v in vars(args).items() if k != "api_key"} | {"pid": pid},
        "requests": len(results),
        "failed": sum(r.outcome == "failed" for r in results),
        "elapsed_s": round(soak.now(), 1),
        "outcomes": {kind: dict(counts) for kind, counts in sorted(by_kind.items())},
        "first_audio_ms": {
            kind: percentiles([r.first_audio for r in results if r.kind == kind and r.first_audio is not None])
            for kind in sorted(by_kind)
        }
        | {"all": percentiles([r.first_audio for r in results if r.first_audio is not None and not r.kind.startswith("cancel")])},
        "audio_s": round(sum(r.audio_s for r in results), 1),
        "memory": {
            "samples": [asdict(s) for s in samples],
            "rss_growth": growth(samples, args.warmup, "rss_mib"),
            "gpu_growth": growth(samples, args.warmup, "gpu_mib"),
        },
        "failures": [asdict(r) for r in results if r.outcome == "failed"][:100],
    }
    return report | {"_results": results}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks.soak", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--host", default="127.0.0.1", help="server address (default 127.0.0.1)")
    parser.add_argument("--wyoming-port", type=int, default=10200, help="Wyoming port (default 10200)")
    parser.add_argument("--http-port", type=int, default=8880, help="HTTP port (default 8880)")
    parser.add_argument("--api-key", help="the server's --api-key, if set")
    parser.add_argument("--pid", type=int, help="server process id (default: the one listening on the Wyoming port)")
    parser.add_argument("--requests", type=int, help="stop after this many requests")
    parser.add_argument("--minutes", type=float, help="stop after this many minutes")
    parser.add_argument("--concurrency", type=int, default=4, help="clients at once (default 4; keep below --max-queue)")
    parser.add_argument("--warmup", type=int, default=20, help="requests before memory growth is measured (default 20)")
    parser.add_argument("--sample-s", type=float, default=2.0, help="seconds between memory samples (default 2)")
    parser.add_argument("--timeout", type=float, default=300.0, help="seconds a request may take (default 300)")
    parser.add_argument("--max-growth", type=float, default=10.0, help="memory growth after warm-up that fails the soak, in %% (default 10)")
    parser.add_argument("--seed", type=int, default=0, help="seed of the request mix (default 0)")
    parser.add_argument("--out", type=Path, default=Path("soak-results"), help="folder for soak.json and soak.png")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if not args.requests and not args.minutes:
        raise SystemExit("give --requests N or --minutes T (or both: whichever comes first)")
    report = asyncio.run(run(args))
    results = report.pop("_results")
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "soak.json").write_text(json.dumps(report, indent=1, default=str))
    plot(report, results, args.out / "soak.png")
    rss = report["memory"]["rss_growth"]
    gpu = report["memory"]["gpu_growth"]
    print(f"{report['requests']} requests in {report['elapsed_s']} s, {report['failed']} failed, {report['audio_s']} s of audio")
    for kind, counts in report["outcomes"].items():
        ttfa = report["first_audio_ms"].get(kind) or {}
        print(f"  {kind:16} {dict(counts)}  first audio p50 {ttfa.get('p50', '-')} ms, p95 {ttfa.get('p95', '-')} ms")
    print(f"RSS after warm-up: {rss}; GPU: {gpu}")
    for failure in report["failures"][:10]:
        print(f"  FAILED {failure['kind']} at {failure['start']:.1f} s: {failure['detail']}")
    print(f"wrote {args.out / 'soak.json'} and {args.out / 'soak.png'}")
    grew = any(g is not None and g["growth_pct"] > args.max_growth for g in (rss, gpu))
    return 1 if report["failed"] or grew else 0


if __name__ == "__main__":
    sys.exit(main())
