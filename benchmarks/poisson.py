"""Open-loop Poisson benchmark: first audio, refusals and playback underruns under load.

``python -m benchmarks.poisson --wyoming-port 10300 --http-port 8890 --out DIR`` against a
server that is already running (``benchmarks/gpu.sh poisson`` starts one on the full-size
checkpoints with ``--max-streams 32 --fixed-frames 75``: every reply is 6 s of audio).

The method of the public nari-labs/benchmarks harness: for each (door, voice, rate), requests
arrive as a seeded Poisson process (exponential gaps of mean ``1 / rate`` seconds), each sent
at its arrival time whatever the earlier ones are doing (open loop), for ``--warmup-s`` seconds
whose requests are not counted, then ``--seconds`` measured; one sentence per request. At the
client it measures

* first audio (TTFA): from sending the request to the first audio sample (Wyoming: the first
  ``audio-chunk`` after ``synthesize``; HTTP: the first body bytes of a streamed
  ``response_format: pcm`` response), p50 / p95 / p99 over the measured requests;
* refused (Wyoming ``error`` with code ``overloaded``, HTTP 429) and failed (anything else
  that is not a whole reply: another error, a dropped connection, a timeout);
* playback underruns: the client plays each chunk on arrival, from the first, at 24 kHz; a
  chunk that arrives after the audio before it has finished playing is an underrun (playback
  then resumes from that chunk's arrival). Counted per event, and as requests with any;
* join stall p95: the server's ``tts_join_stall_seconds`` histogram (what running streams
  waited for an admission: GPU time from its start to the next step's start; admissions into
  an idle pool are not counted), its increase over the measured window, p95
  interpolated within buckets (so at the buckets' resolution: 1 ms up to 5, then 7.5, 10, 15, 20 ms...).

With ``--bursts N``, first (Wyoming, each voice): ``--burst-joiners`` requests sent at once
while ``--burst-running`` streams play, N times; the join stall of their admissions (p95 and
the highest bucket reached), the stall of "8 joining at once".

Writes ``poisson.json`` (``{"rows": [...]}``, the issue's fields), ``poisson-detail.json`` (whole
rows, ``"bursts"``, ``"config"``, ``"anchors"``), ``poisson.md``
(the table, with the published anchors) and, where matplotlib is installed, ``poisson.png``
(p95 first audio against request rate, the published anchors drawn in).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import re
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np

from wyoming_qwen3tts.common.audio import PCM_WIDTH as BYTES_PER_SAMPLE, SAMPLE_RATE, SAMPLES_PER_FRAME

# One sentence per request, drawn in turn: the single-client benchmark's English prompts.
from .bench import TEXTS as SENTENCES

#: Voice kinds and the catalogue names that speak them: an ICL clone (``--clone-voice``, a
#: 3 s reference in the voices folder), an anchored VoiceDesign preset, a CustomVoice speaker.
VOICES = {"clone": "clone", "preset": "aria", "custom_voice": "ryan"}
#: Published p95 first audio (ms) by request rate: nari-labs/benchmarks,
#: ``reports/Qwen3-TTS-1.7B-CustomVoice/*/README.md`` (one H100 SXM, HTTP streaming raw PCM,
#: CustomVoice speaker Ryan); and ours before issue 17 (H200, Wyoming, ICL clone).
ANCHORS: dict[str, dict[float, float]] = {
    "nari-qwen3-tts (H100, published)": {1: 26.5, 4: 31.6, 10: 34.1, 12: 62.2, 20: 77.2},
    "vLLM-Omni (H100, published)": {1: 56.8, 4: 79.3, 10: 135.8, 12: 182.5, 20: 396.9},
    "sglang-omni (H100, published)": {1: 120.9, 6: 273.7, 10: 660.0, 12: 2382.0},
    "ours before (H200, Wyoming clone)": {1: 87.0, 4: 136.0, 10: 181.0, 20: 2298.0},
}


@dataclass
class Outcome:
    """One request as the client saw it (seconds from its send time)."""

    arrival: float  # seconds since the row's start
    measured: bool  # arrived after the warm-up
    status: str = "ok"  # ok, refused, failed
    first_audio: float | None = None
    done: float | None = None
    samples: int = 0
    underruns: int = 0
    late_s: float = 0.0  # the longest wait for a late chunk
    error: str = ""
    chunks: list[tuple[float, int]] = field(default_factory=list, repr=False)
    head: bytearray = field(default_factory=bytearray, repr=False)  # the first 4 frames' PCM
    frame_db: list[float] = field(default_factory=list)  # RMS (dBFS) of frames 1-4

    def keep(self, pcm: bytes) -> None:
        """Keep the start of the audio, for the silent-first-frames check."""
        if len(self.head) < 4 * SAMPLES_PER_FRAME * BYTES_PER_SAMPLE:
            self.head += pcm

    def account(self) -> None:
        """Playback from the first chunk's arrival, each chunk played on arrival or when the
        audio before it has finished, whichever is later; count chunks that come late."""
        if not self.chunks:
            return
        self.first_audio = self.chunks[0][0]
        play_until = self.chunks[0][0]  # when the audio received so far has been played
        for i, (at, samples) in enumerate(self.chunks):
            if i and at > play_until:
                self.underruns += 1
                self.late_s = max(self.late_s, at - play_until)
                play_until = at
            play_until += samples / SAMPLE_RATE
            self.samples += samples
        self.chunks.clear()
        audio = np.frombuffer(bytes(self.head[: len(self.head) // 2 * 2]), "<i2").astype(np.float64) / 32768
        for i in range(min(4, len(audio) // SAMPLES_PER_FRAME)):
            frame = audio[i * SAMPLES_PER_FRAME : (i + 1) * SAMPLES_PER_FRAME]
            self.frame_db.append(round(20 * math.log10(max(float(np.sqrt(np.mean(frame**2))), 1e-6)), 1))
        self.head = bytearray()


@dataclass
class Row:
    """One (door, voice, rate) of ``poisson.json`` (first-audio figures in ms)."""

    door: str
    voice: str
    rate: float
    n: int
    ttfa_p50_ms: float | None
    ttfa_p95_ms: float | None
    ttfa_p99_ms: float | None
    refused: int
    failed: int
    underruns: int
    join_stall_p95_ms: float | None
    underrun_requests: int = 0
    longest_underrun_ms: float = 0.0
    ttfa_max_ms: float | None = None
    audio_s_mean: float | None = None
    joins: int = 0
    seconds: float = 0.0
    #: Median loudness of codec frames 1, 2, 3, 4 of each reply, dBFS: does a reply (an ICL
    #: continuation above all) start with silent frames?
    first_frames_db: list[float] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)


# --- the two doors ----------------------------------------------------------------------


async def wyoming_request(host: str, port: int, text: str, voice: str, out: Outcome, timeout: float) -> None:
    """``synthesize`` over Wyoming (the ``wyoming`` package's client); every ``audio-chunk``'s
    arrival time and length go to ``out.chunks``."""
    from wyoming.audio import AudioChunk, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.error import Error
    from wyoming.tts import Synthesize, SynthesizeVoice

    start = time.perf_counter()
    async with asyncio.timeout(timeout), AsyncTcpClient(host, port) as client:
        await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=voice)).event())
        while True:
            event = await client.read_event()
            if event is None:
                raise ConnectionError("server closed the connection")
            if AudioChunk.is_type(event.type):
                chunk = AudioChunk.from_event(event)
                out.chunks.append((time.perf_counter() - start, len(chunk.audio) // BYTES_PER_SAMPLE))
                out.keep(chunk.audio)
            elif AudioStop.is_type(event.type):
                out.done = time.perf_counter() - start
                return
            elif Error.is_type(event.type):
                error = Error.from_event(event)
                out.status = "refused" if error.code == "overloaded" else "failed"
                out.error = f"{error.code}: {error.text}"[:200]
                return


async def http_request(
    session: aiohttp.ClientSession, port: int, text: str, voice: str, out: Outcome, timeout: float
) -> None:
    """``POST /v1/audio/speech``, raw PCM streamed (``stream_format: audio``)."""
    body = {"model": "tts-1", "input": text, "voice": voice, "response_format": "pcm", "stream_format": "audio"}
    start = time.perf_counter()
    async with asyncio.timeout(timeout), session.post(f"http://127.0.0.1:{port}/v1/audio/speech", json=body) as resp:
        if resp.status != 200:
            out.status = "refused" if resp.status == 429 else "failed"
            out.error = f"HTTP {resp.status}: {(await resp.text())[:200]}"
            return
        carry = 0
        async for data in resp.content.iter_any():
            carry += len(data)
            samples, carry = divmod(carry, BYTES_PER_SAMPLE)
            if samples:
                out.chunks.append((time.perf_counter() - start, samples))
            out.keep(data)
        out.done = time.perf_counter() - start


# --- the server's join stall ------------------------------------------------------------


def join_buckets(http_port: int) -> dict[float, float]:
    """Cumulative counts of ``tts_join_stall_seconds`` by upper bound (all models summed)."""
    text = urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=10).read().decode()
    counts: dict[float, float] = {}
    for match in re.finditer(r'^tts_join_stall_seconds_bucket\{[^}]*le="([^"]+)"[^}]*\} (\S+)$', text, re.M):
        le = math.inf if match.group(1) == "+Inf" else float(match.group(1))
        counts[le] = counts.get(le, 0.0) + float(match.group(2))
    return counts


def histogram_quantile(q: float, before: dict[float, float], after: dict[float, float]) -> tuple[float | None, int]:
    """(q-quantile in seconds, count) of the observations between two scrapes, interpolated
    linearly within a bucket as Prometheus's ``histogram_quantile`` does; None when empty."""
    bounds = sorted(after)
    cumulative = [after[b] - before.get(b, 0.0) for b in bounds]
    total = cumulative[-1] if cumulative else 0.0
    if total <= 0:
        return None, 0
    rank = q * total
    lower, below = 0.0, 0.0
    for bound, count in zip(bounds, cumulative, strict=True):
        if count >= rank:
            if math.isinf(bound):
                return lower, int(total)  # above the last finite bucket: its bound
            inside = count - below
            return lower + (bound - lower) * ((rank - below) / inside if inside else 1.0), int(total)
        lower, below = bound, count
    return lower, int(total)


# --- one row ----------------------------------------------------------------------------


def percentile(values: list[float], q: float) -> float | None:
    """The q-th percentile (0-100) of ``values`` by linear interpolation; None when empty."""
    if not values:
        return None
    ordered = sorted(values)
    k = (len(ordered) - 1) * q / 100
    lo, hi = math.floor(k), math.ceil(k)
    return ordered[lo] + (ordered[hi] - ordered[lo]) * (k - lo)


def arrivals(rate: float, seconds: float, seed: int) -> list[float]:
    """Seeded Poisson arrival times in [0, seconds): exponential gaps of mean 1 / rate."""
    rng = random.Random(seed)
    times, t = [], rng.expovariate(rate)
    while t < seconds:
        times.append(t)
        t += rng.expovariate(rate)
    return times


async def run_row(args: argparse.Namespace, door: str, voice: str, rate: float, seed: int) -> Row:
    """Send one row's arrivals open-loop, wait for every reply, and summarise."""
    name = VOICES[voice]
    times = arrivals(rate, args.warmup_s + args.seconds, seed)
    outcomes = [Outcome(t, t >= args.warmup_s) for t in times]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:

        async def one(i: int, out: Outcome, t0: float) -> None:
            await asyncio.sleep(max(0.0, t0 + out.arrival - time.perf_counter()))
            text = SENTENCES[i % len(SENTENCES)]
            try:
                if door == "wyoming":
                    await wyoming_request("127.0.0.1", args.wyoming_port, text, name, out, args.timeout)
                else:
                    await http_request(session, args.http_port, text, name, out, args.timeout)
            except Exception as err:  # noqa: BLE001 - any other ending is a failed request
                out.status, out.error = "failed", f"{type(err).__name__}: {err}"[:200]
            if out.status == "ok" and out.done is None:
                out.status, out.error = "failed", "no end of audio"
            out.account()

        t0 = time.perf_counter()
        tasks = [asyncio.create_task(one(i, o, t0)) for i, o in enumerate(outcomes)]
        await asyncio.sleep(max(0.0, t0 + args.warmup_s - time.perf_counter()))
        before = join_buckets(args.http_port)
        await asyncio.gather(*tasks)
        after = join_buckets(args.http_port)
        elapsed = time.perf_counter() - t0
    measured = [o for o in outcomes if o.measured]
    ok = [o for o in measured if o.status == "ok"]
    ttfa = [o.first_audio * 1000 for o in ok if o.first_audio is not None]
    stall, joins = histogram_quantile(0.95, before, after)
    return Row(
        door=door, voice=voice, rate=rate, n=len(measured),
        ttfa_p50_ms=_round(percentile(ttfa, 50)), ttfa_p95_ms=_round(percentile(ttfa, 95)),
        ttfa_p99_ms=_round(percentile(ttfa, 99)),
        refused=sum(o.status == "refused" for o in measured), failed=sum(o.status == "failed" for o in measured),
        underruns=sum(o.underruns for o in ok), join_stall_p95_ms=_round(stall * 1000 if stall is not None else None),
        underrun_requests=sum(o.underruns > 0 for o in ok),
        longest_underrun_ms=round(max((o.late_s for o in ok), default=0.0) * 1000, 1),
        ttfa_max_ms=_round(max(ttfa, default=None)),
        audio_s_mean=_round(sum(o.samples for o in ok) / len(ok) / SAMPLE_RATE if ok else None, 2),
        joins=joins, seconds=round(elapsed, 1),
        first_frames_db=[
            round(float(np.median([o.frame_db[i] for o in ok if len(o.frame_db) > i])), 1)
            for i in range(4) if any(len(o.frame_db) > i for o in ok)
        ],
        errors=sorted({o.error for o in measured if o.error})[:5],
    )


@dataclass
class Burst:
    """``joiners`` requests sent at once while ``running`` streams already play (Wyoming):
    what the running streams waited for their admission (``tts_join_stall_seconds`` between
    the burst and its last first audio: p95 and the highest bucket reached, ms), in how many
    admissions, and the burst's first audio (ms)."""

    voice: str
    running: int
    joiners: int
    repeats: int
    joins: int
    join_stall_p95_ms: float | None
    join_stall_max_ms: float | None
    ttfa_p50_ms: float | None
    ttfa_max_ms: float | None
    failed: int


def stall_max(before: dict[float, float], after: dict[float, float]) -> float | None:
    """The upper bound (s) of the highest bucket an observation reached between two scrapes
    (``inf``: above the last finite bucket); None when there was none."""
    bounds = sorted(after)
    total = after[bounds[-1]] - before.get(bounds[-1], 0.0) if bounds else 0.0
    if total <= 0:
        return None
    return next(b for b in bounds if after[b] - before.get(b, 0.0) >= total)


async def run_burst(args: argparse.Namespace, voice: str) -> Burst:
    """``--burst-running`` streams start and play for a second; then ``--burst-joiners``
    requests arrive at once; the join stall is read from the first of them sent to the last
    first audio (the running streams admit nobody else meanwhile). ``--bursts`` times."""
    name = VOICES[voice]
    ttfa: list[float] = []
    failed = 0
    deltas: list[tuple[dict[float, float], dict[float, float]]] = []
    for repeat in range(args.bursts):
        running = [Outcome(0.0, False) for _ in range(args.burst_running)]
        joiners = [Outcome(0.0, True) for _ in range(args.burst_joiners)]

        async def send(i: int, out: Outcome) -> None:
            try:
                await wyoming_request("127.0.0.1", args.wyoming_port, SENTENCES[i % len(SENTENCES)], name, out, args.timeout)
            except Exception as err:  # noqa: BLE001 - any other ending is a failed request
                out.status, out.error = "failed", f"{type(err).__name__}: {err}"[:200]

        background = [asyncio.create_task(send(i, o)) for i, o in enumerate(running)]
        await asyncio.sleep(1.0)  # every running stream admitted and playing
        before = join_buckets(args.http_port)
        burst = [asyncio.create_task(send(100 + repeat * 10 + i, o)) for i, o in enumerate(joiners)]
        while any(not o.chunks and o.status == "ok" and not t.done() for o, t in zip(joiners, burst, strict=True)):
            await asyncio.sleep(0.005)
        after = join_buckets(args.http_port)
        await asyncio.gather(*background, *burst)
        deltas.append((before, after))
        for out in joiners:
            out.account()
            failed += out.status != "ok"
            if out.first_audio is not None:
                ttfa.append(out.first_audio * 1000)
        await asyncio.sleep(args.pause_s)
    # the repeats' observations together: the sum of each burst's increase per bucket
    counts: dict[float, float] = {}
    for before, after in deltas:
        for b in after:
            counts[b] = counts.get(b, 0.0) + after[b] - before.get(b, 0.0)
    p95, joins = histogram_quantile(0.95, {}, counts)
    top = stall_max({}, counts)
    return Burst(
        voice=voice, running=args.burst_running, joiners=args.burst_joiners, repeats=args.bursts, joins=joins,
        join_stall_p95_ms=_round(p95 * 1000 if p95 is not None else None),
        join_stall_max_ms=_round(top * 1000 if top is not None and math.isfinite(top) else None),
        ttfa_p50_ms=_round(percentile(ttfa, 50)), ttfa_max_ms=_round(max(ttfa, default=None)), failed=failed,
    )


def _round(value: float | None, digits: int = 1) -> float | None:
    return None if value is None else round(value, digits)


# --- report -----------------------------------------------------------------------------


def table(rows: list[Row]) -> str:
    """The Markdown table of the rows, then the published anchors."""
    def cell(value: float | None) -> str:
        return "-" if value is None else f"{value:g}"

    lines = [
        "| door | voice | req/s | n | first audio p50 / p95 / p99 (ms) | refused | failed | underruns (requests) | join stall p95 (ms) |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        lines.append(
            f"| {r.door} | {r.voice} | {r.rate:g} | {r.n} | {cell(r.ttfa_p50_ms)} / {cell(r.ttfa_p95_ms)} / "
            f"{cell(r.ttfa_p99_ms)} | {r.refused} | {r.failed} | {r.underruns} ({r.underrun_requests}) | "
            f"{cell(r.join_stall_p95_ms)} |"
        )
    rates = sorted({rate for series in ANCHORS.values() for rate in series})
    lines += ["", "Published p95 first audio (ms) at the same request rates:", "",
              "| engine | " + " | ".join(f"{r:g} req/s" for r in rates) + " |",
              "| --- |" + " --- |" * len(rates)]
    for engine, series in ANCHORS.items():
        lines.append(f"| {engine} | " + " | ".join(cell(series.get(r)) for r in rates) + " |")
    return "\n".join(lines) + "\n"


def plot(rows: list[Row], path: Path, title: str) -> bool:
    """p95 first audio against request rate, one line per (door, voice), anchors dashed."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib not installed: no plot (python -m benchmarks.poisson --plot-only JSON)", file=sys.stderr)
        return False
    fig, ax = plt.subplots(figsize=(8, 5))
    for door, voice in sorted({(r.door, r.voice) for r in rows}):
        points = [(r.rate, r.ttfa_p95_ms) for r in rows if (r.door, r.voice) == (door, voice) and r.ttfa_p95_ms]
        if points:
            ax.plot(*zip(*sorted(points)), marker="o", label=f"ours: {door}, {voice}")
    for engine, series in ANCHORS.items():
        ax.plot(list(series), list(series.values()), linestyle="--", marker="x", alpha=0.7, label=engine)
    ax.set_xlabel("requests per second (Poisson)")
    ax.set_ylabel("first audio p95 (ms)")
    ax.set_yscale("log")
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return True


#: ``poisson.json``'s row fields, exactly as the serving issue specifies them; everything else
#: a row holds goes to ``poisson-detail.json``.
JSON_FIELDS = (
    "door", "voice", "rate", "n", "ttfa_p50_ms", "ttfa_p95_ms", "ttfa_p99_ms", "refused", "failed",
    "underruns", "join_stall_p95_ms",
)


def burst_table(bursts: list[Burst]) -> str:
    """The Markdown table of the burst measurements ('' without any)."""
    if not bursts:
        return ""
    lines = [
        "", "Bursts: requests arriving at once while others play (Wyoming):", "",
        "| voice | running | joining at once | admissions | join stall p95 / highest bucket (ms) | first audio p50 / max (ms) | failed |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for b in bursts:
        lines.append(
            f"| {b.voice} | {b.running} | {b.joiners} x {b.repeats} | {b.joins} | {b.join_stall_p95_ms} / "
            f"{b.join_stall_max_ms} | {b.ttfa_p50_ms} / {b.ttfa_max_ms} | {b.failed} |"
        )
    return "\n".join(lines) + "\n"


def write(rows: list[Row], config: dict[str, Any], out: Path, bursts: list[Burst] | None = None) -> str:
    """poisson.json (``JSON_FIELDS`` per row), poisson-detail.json (whole rows, bursts, the
    run's settings, the published anchors), poisson.md and poisson.png under ``out``; returns
    the tables."""
    out.mkdir(parents=True, exist_ok=True)
    anchors = {k: {str(r): v for r, v in s.items()} for k, s in ANCHORS.items()}
    whole = [asdict(r) for r in rows]
    (out / "poisson.json").write_text(json.dumps({"rows": [{k: r[k] for k in JSON_FIELDS} for r in whole]}, indent=2))
    detail = {"rows": whole, "bursts": [asdict(b) for b in bursts or []], "config": config, "anchors": anchors}
    (out / "poisson-detail.json").write_text(json.dumps(detail, indent=2))
    text = table(rows) + burst_table(bursts or [])
    (out / "poisson.md").write_text(f"# Poisson arrivals ({config.get('gpu', '?')})\n\n{text}")
    plot(rows, out / "poisson.png", f"p95 first audio under Poisson arrivals ({config.get('gpu', '?')})")
    return text


def wait_ready(args: argparse.Namespace) -> None:
    """Until ``/ready`` answers 200 and, for the preset voice, its anchor is served."""
    deadline = time.monotonic() + args.ready_s
    while time.monotonic() < deadline:
        try:
            urllib.request.urlopen(f"http://127.0.0.1:{args.http_port}/ready", timeout=5).read()
            if "preset" not in args.voices:
                return
            data = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{args.http_port}/v1/audio/voices", timeout=5).read())
            voice = next((v for v in data["voices"] if v["name"].lower() == VOICES["preset"]), None)
            # final: served from its anchor, or designed live for good (no anchor, or one that
            # failed, or one rendered while the Base model that would clone it is off)
            if voice is None or voice.get("served") == "anchor" or voice.get("anchor") in ("off", "failed", "ready"):
                if voice is not None and voice.get("served") != "anchor":
                    print(f"preset {VOICES['preset']!r} is not anchored ({voice.get('anchor')}): designed live", file=sys.stderr)
                return
            # the anchor renders on the first use of the preset
            body = json.dumps({"input": "Hello.", "voice": VOICES["preset"], "response_format": "pcm"}).encode()
            request = urllib.request.Request(f"http://127.0.0.1:{args.http_port}/v1/audio/speech", body, {"Content-Type": "application/json"})
            urllib.request.urlopen(request, timeout=60).read()
        except OSError:
            pass
        time.sleep(1.0)
    print("server not ready (or preset anchor missing) in time; measuring anyway", file=sys.stderr)


async def run(args: argparse.Namespace) -> tuple[list[Row], list[Burst]]:
    rows: list[Row] = []
    bursts: list[Burst] = []
    if args.bursts:
        for voice in args.voices:
            burst = await run_burst(args, voice)
            bursts.append(burst)
            print(
                f"burst    {voice:12} {burst.joiners} joining {burst.running} running x{burst.repeats}: "
                f"{burst.joins} admissions, join stall p95 {burst.join_stall_p95_ms} ms, highest bucket "
                f"{burst.join_stall_max_ms} ms, first audio p50/max {burst.ttfa_p50_ms}/{burst.ttfa_max_ms} ms, "
                f"failed {burst.failed}",
                flush=True,
            )
            write(rows, _config(args), args.out, bursts)
    for door in args.doors:
        voices = args.http_voices if door == "http" and args.http_voices else args.voices
        for voice in voices:
            for rate in args.rates:
                seed = args.seed * 1000 + int(rate * 10)  # the same arrivals for every door and voice
                row = await run_row(args, door, voice, rate, seed)
                rows.append(row)
                print(
                    f"{door:8} {voice:12} {rate:5g}/s n={row.n:4} TTFA p50/p95/p99 {row.ttfa_p50_ms}/{row.ttfa_p95_ms}/"
                    f"{row.ttfa_p99_ms} ms refused {row.refused} failed {row.failed} underruns {row.underruns} "
                    f"({row.underrun_requests} req) join stall p95 {row.join_stall_p95_ms} ms ({row.joins} joins) "
                    f"frames 1-4 {row.first_frames_db} dBFS "
                    f"{row.errors[:1]}",
                    flush=True,
                )
                write(rows, _config(args), args.out, bursts)  # after every row: a run cut short keeps its rows
                await asyncio.sleep(args.pause_s)  # let the last replies drain from the server
    return rows, bursts


def _config(args: argparse.Namespace) -> dict[str, Any]:
    """The run's settings as JSON values (written beside the rows)."""
    return {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--wyoming-port", type=int, default=10300)
    parser.add_argument("--http-port", type=int, default=8890, help="HTTP door; also /metrics for the join stall")
    parser.add_argument("--rates", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 4.0, 10.0, 20.0, 30.0])
    parser.add_argument("--seconds", type=float, default=20.0, help="measured seconds of arrivals per row")
    parser.add_argument("--warmup-s", type=float, default=2.0, help="arrivals before the measured ones, not counted")
    parser.add_argument("--pause-s", type=float, default=1.0, help="idle time between rows")
    parser.add_argument("--doors", type=lambda s: s.split(","), default=["wyoming", "http"])
    parser.add_argument("--voices", type=lambda s: s.split(","), default=list(VOICES))
    parser.add_argument("--http-voices", type=lambda s: s.split(","), default=None, help="voices for the HTTP door (default: --voices)")
    parser.add_argument("--bursts", type=int, default=0, help="burst measurements per voice before the rows (0: none)")
    parser.add_argument("--burst-running", type=int, default=8, help="streams playing when a burst arrives")
    parser.add_argument("--burst-joiners", type=int, default=8, help="requests of a burst, sent at once")
    parser.add_argument("--seed", type=int, default=17)
    parser.add_argument("--timeout", type=float, default=60.0, help="a reply later than this fails")
    parser.add_argument("--ready-s", type=float, default=180.0)
    parser.add_argument("--gpu", default="unknown", help="label for the report (the GPU's name)")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--plot-only", type=Path, help="draw poisson.png from this poisson-detail.json and stop")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    if args.plot_only is not None:
        data = json.loads(args.plot_only.read_text())
        rows = [Row(**r) for r in data["rows"]]
        return 0 if plot(rows, args.out / "poisson.png", f"p95 first audio ({data['config'].get('gpu')})") else 1
    unknown = sorted(set(args.voices + (args.http_voices or [])) - set(VOICES))
    if unknown:
        raise SystemExit(f"unknown voice kinds {unknown}; choose from {sorted(VOICES)}")
    wait_ready(args)
    rows, bursts = asyncio.run(run(args))
    print(write(rows, _config(args), args.out, bursts))
    return 0


if __name__ == "__main__":
    sys.exit(main())
