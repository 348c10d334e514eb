"""First audio from the first text delta: the WebSocket door against the Wyoming door's
streamed text, on one server, under Poisson arrivals (issue 28's acceptance figure).

``python -m benchmarks.ws_first_audio --wyoming-port 10300 --http-port 8890 --out DIR``
against a server that is already running (``benchmarks/gpu.sh wsfirst`` starts one).

Each door gets ``--requests`` requests arriving as its own seeded Poisson process of
``--rate`` per second (exponential gaps, open loop: each sent at its arrival whatever the
others are doing); both doors run at once, on the same server. A request streams a
two-sentence reply as an LLM would: one word (with the whitespace after it) per delta,
a delta every ``--delta-ms`` milliseconds from the first (the cadence of nari-labs'
harness; on the WebSocket each append also waits for its ``input_text.ack``, as the
harness does). The clock of a request starts when its first delta is sent:

* WebSocket (``nari.speech.v1``): connect, ``request.start``, ``request.configured``;
  then the first ``input_text.append`` starts the clock; first audio is the first binary
  message;
* Wyoming: connect, ``synthesize-start``; then the first ``synthesize-chunk`` starts the
  clock; first audio is the first ``audio-chunk``.

Writes ``ws_first_audio.json`` (per door: n, failed, p50/p95/p99/max first audio in ms, and
the p95 difference WebSocket minus Wyoming) and ``ws_first_audio.md`` (the table).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import re
import sys
import time
import urllib.request
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from .bench import TEXTS
from .poisson import percentile

DOORS = ("websocket", "wyoming")
#: Two-sentence replies: consecutive sentences of the single-client benchmark's prompts.
REPLIES = [f"{TEXTS[i]} {TEXTS[(i + 1) % len(TEXTS)]}" for i in range(len(TEXTS))]


@dataclass
class Result:
    """One request: first audio in seconds from its first delta (None: no audio), or an error."""

    door: str
    arrival: float
    first_audio: float | None = None
    error: str = ""


def deltas(text: str) -> list[str]:
    """One word per delta, each with the whitespace after it (joined, the exact text)."""
    return re.findall(r"\S+\s*", text)


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """``n`` seeded Poisson arrival times (exponential gaps of mean ``1 / rate`` s)."""
    rng, t, times = random.Random(seed), 0.0, []
    for _ in range(n):
        t += rng.expovariate(rate)
        times.append(t)
    return times


async def _paced(words: list[str], interval: float, send: Any) -> None:
    """Send each word at an absolute cadence from the first (``send(index, word)``)."""
    first = time.perf_counter()
    for i, word in enumerate(words):
        delay = first + i * interval - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        await send(i, word)


async def websocket_request(
    http: aiohttp.ClientSession, args: argparse.Namespace, text: str, out: Result
) -> None:
    """One ``nari.speech.v1`` session; first audio from the first ``input_text.append``."""
    url = f"ws://{args.host}:{args.http_port}/v1/audio/speech/ws"
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    async with http.ws_connect(url, protocols=("nari.speech.v1",), headers=headers, compress=0) as ws:
        assert (await ws.receive_json())["type"] == "session.created"
        await ws.send_json({"type": "request.start", "voice": args.voice, "response_format": "pcm"})
        configured = await ws.receive_json()
        if configured["type"] != "request.configured":
            raise RuntimeError(json.dumps(configured)[:200])
        acked: dict[int, asyncio.Event] = {}
        first_sent: list[float] = []
        done = asyncio.Event()

        async def receive() -> None:
            async for msg in ws:
                if msg.type is aiohttp.WSMsgType.BINARY:
                    if out.first_audio is None and first_sent:
                        out.first_audio = time.perf_counter() - first_sent[0]
                    continue
                event = json.loads(msg.data)
                if event["type"] == "input_text.ack":
                    acked.setdefault(event["sequence"], asyncio.Event()).set()
                elif event["type"] == "error":
                    raise RuntimeError(json.dumps(event["error"])[:200])
                elif event["type"] == "response.done":
                    done.set()

        receiver = asyncio.create_task(receive())

        async def send(i: int, word: str) -> None:
            if not first_sent:
                first_sent.append(time.perf_counter())
            await ws.send_json({"type": "input_text.append", "sequence": i, "text": word})
            waiter = asyncio.ensure_future(acked.setdefault(i, asyncio.Event()).wait())
            await asyncio.wait({waiter, receiver}, return_when=asyncio.FIRST_COMPLETED)
            if receiver.done():
                waiter.cancel()
                receiver.result()  # its error
                raise RuntimeError("closed before the ack")

        words = deltas(text)
        await _paced(words, args.delta_ms / 1000, send)
        await ws.send_json({"type": "input_text.end", "sequence": len(words)})
        await receiver
        if not done.is_set():
            raise RuntimeError("closed without response.done")


async def wyoming_request(args: argparse.Namespace, text: str, out: Result) -> None:
    """``synthesize-start``, one ``synthesize-chunk`` per word, ``synthesize-stop`` (Home
    Assistant's streamed text); first audio from the first chunk."""
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

    async with AsyncTcpClient(args.host, args.wyoming_port) as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name=args.voice)).event())

        first_sent: list[float] = []

        async def send(_i: int, word: str) -> None:
            if not first_sent:
                first_sent.append(time.perf_counter())
            await client.write_event(SynthesizeChunk(text=word).event())

        async def feed() -> None:
            await _paced(deltas(text), args.delta_ms / 1000, send)
            await client.write_event(SynthesizeStop().event())

        feeder = asyncio.create_task(feed())
        while True:
            event = await client.read_event()
            if event is None:
                raise ConnectionError("server closed the connection")
            if event.type == "audio-chunk" and out.first_audio is None and first_sent:
                out.first_audio = time.perf_counter() - first_sent[0]
            elif event.type == "error":
                raise RuntimeError(str(event.data)[:200])
            elif event.type == "synthesize-stopped":
                break
        await feeder


async def run_door(door: str, args: argparse.Namespace, seed: int) -> list[Result]:
    """Send ``--requests`` requests at Poisson arrivals and wait for every reply."""
    times = poisson_arrivals(args.requests, args.rate, seed)
    results = [Result(door, t) for t in times]
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as http:
        start = time.perf_counter()

        async def one(i: int, out: Result) -> None:
            await asyncio.sleep(max(0.0, start + out.arrival - time.perf_counter()))
            replies = args.text or REPLIES
            text = replies[i % len(replies)]
            try:
                async with asyncio.timeout(args.timeout):
                    if door == "websocket":
                        await websocket_request(http, args, text, out)
                    else:
                        await wyoming_request(args, text, out)
            except Exception as err:  # noqa: BLE001 - a failed request is a result
                out.error = f"{type(err).__name__}: {err}"[:300]

        await asyncio.gather(*(one(i, r) for i, r in enumerate(results)))
    return results


def summary(results: list[Result]) -> dict[str, Any]:
    """n, failed, and first audio p50/p95/p99/max in ms over the requests that got audio."""
    ms = [r.first_audio * 1000 for r in results if r.first_audio is not None and not r.error]
    row: dict[str, Any] = {
        "n": len(ms),
        "failed": sum(1 for r in results if r.error or r.first_audio is None),
    }
    for q in (50, 95, 99):
        value = percentile(ms, q)
        row[f"p{q}_ms"] = None if value is None else round(value, 1)
    row["max_ms"] = round(max(ms), 1) if ms else None
    return row


def wait_ready(args: argparse.Namespace) -> None:
    """Wait for ``/ready`` (the models warmed up)."""
    deadline = time.monotonic() + args.ready_s
    while True:
        try:
            with urllib.request.urlopen(f"http://{args.host}:{args.http_port}/ready", timeout=5) as resp:
                if resp.status == 200:
                    return
        except OSError:
            pass
        if time.monotonic() > deadline:
            raise SystemExit(f"server not ready in {args.ready_s} s")
        time.sleep(0.5)


async def run(args: argparse.Namespace) -> dict[str, list[Result]]:
    """Both doors at once (each its own Poisson stream), after one warm-up request each."""
    text = (args.text or REPLIES)[0]
    for door in DOORS:
        warm = Result(door, 0.0)
        if door == "websocket":
            async with aiohttp.ClientSession() as http:
                await websocket_request(http, args, text, warm)
        else:
            await wyoming_request(args, text, warm)
    rows = await asyncio.gather(*(run_door(door, args, args.seed + i) for i, door in enumerate(DOORS)))
    return dict(zip(DOORS, rows))


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--wyoming-port", type=int, default=10300)
    parser.add_argument("--http-port", type=int, default=8890)
    parser.add_argument("--api-key", default=None, help="the server's --api-key, if set")
    parser.add_argument("--requests", type=int, default=200, help="requests per door")
    parser.add_argument("--rate", type=float, default=1.0, help="mean arrivals per second, per door")
    parser.add_argument("--voice", default="ryan")
    parser.add_argument(
        "--text", action="append", help="a reply to stream instead of the built-in ones (repeatable)"
    )
    parser.add_argument("--delta-ms", type=float, default=10.0, help="milliseconds between word deltas")
    parser.add_argument("--seed", type=int, default=28)
    parser.add_argument("--timeout", type=float, default=60.0, help="a request longer than this fails")
    parser.add_argument("--ready-s", type=float, default=300.0)
    parser.add_argument("--out", type=Path, required=True)
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    wait_ready(args)
    began = time.monotonic()
    results = asyncio.run(run(args))
    rows = {door: summary(rs) for door, rs in results.items()}
    ws, wy = rows["websocket"]["p95_ms"], rows["wyoming"]["p95_ms"]
    report = {
        "rows": rows,
        "p95_difference_ms": None if ws is None or wy is None else round(ws - wy, 1),
        "config": {
            k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items() if k != "api_key"
        },
        "seconds": round(time.monotonic() - began, 1),
        "errors": [asdict(r) for rs in results.values() for r in rs if r.error][:20],
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "ws_first_audio.json").write_text(json.dumps(report, indent=2) + "\n")
    lines = [
        f"First audio from the first delta, {args.requests} requests per door at {args.rate:g}/s Poisson, both doors at once, voice {args.voice}",
        "",
        "| door | n | failed | p50 ms | p95 ms | p99 ms | max ms |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for door, row in rows.items():
        lines.append(
            f"| {door} | {row['n']} | {row['failed']} | {row['p50_ms']} | {row['p95_ms']} | {row['p99_ms']} | {row['max_ms']} |"
        )
    lines += ["", f"p95 WebSocket minus Wyoming: {report['p95_difference_ms']} ms ({report['seconds']} s)"]
    (args.out / "ws_first_audio.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))
    for error in report["errors"][:5]:
        print("error:", error, file=sys.stderr)
    return 0 if all(row["failed"] == 0 for row in rows.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
