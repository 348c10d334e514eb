"""The fuzzing corpora against the real server: every committed input, sent as a client
would send it, to a server on the tiny checkpoints (``--fixed-frames 2``: one codec frame a
sentence, so inputs that ask for speech cost little). Afterwards the server still serves,
and its log has no traceback and no "Task exception was never retrieved"."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path

import pytest
from wyoming.client import AsyncTcpClient
from wyoming.tts import Synthesize

from .conftest import Server, start_server, stop_server
from .test_fuzz_http import API_KEY, ROUTES
from .test_fuzz_http import CORPUS as HTTP_CORPUS
from .test_fuzz_wyoming import CORPUS as WYOMING_CORPUS
from .test_wyoming import describe, read_until

#: Slow: the fuzz corpora against a real server process.
pytestmark = pytest.mark.full

#: Seconds to read a reply before giving up on it (the replay does not wait for audio).
_READ_S = 10.0


@pytest.fixture(scope="module")
def target(checkpoints: Path, voices_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    folder = tmp_path_factory.mktemp("server-fuzz")
    srv = start_server(
        checkpoints, voices_dir, folder / "server.log",
        extra=["--no-zeroconf", "--fixed-frames", "2", "--api-key", API_KEY],
    )
    yield srv
    stop_server(srv)


async def _exchange(port: int, data: bytes) -> bytes:
    """Send ``data``, half-close, read what comes back (until EOF or ``_READ_S``)."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    reply = bytearray()
    try:
        writer.write(data)
        await writer.drain()
        if writer.can_write_eof():
            writer.write_eof()
        while chunk := await asyncio.wait_for(reader.read(1 << 16), _READ_S):
            reply += chunk
    except (asyncio.TimeoutError, ConnectionError):
        pass
    finally:
        writer.close()
    return bytes(reply)


def _http_request(data: bytes) -> bytes:
    """The raw request ``tests.test_fuzz_http`` builds from an input."""
    method, path = ROUTES[data[0] % len(ROUTES)] if data else ROUTES[0]
    keyed = len(data) < 2 or data[1] % 4 != 0
    body = data[2:]
    head = [f"{method} {path} HTTP/1.1", "Host: 127.0.0.1", "Content-Type: application/json",
            f"Content-Length: {len(body)}", "Connection: close"]
    head += [f"Authorization: Bearer {API_KEY}"] if keyed else []
    return "\r\n".join(head).encode() + b"\r\n\r\n" + body


async def test_corpora_against_the_real_server(target: Server) -> None:
    wyoming = sorted(p for p in WYOMING_CORPUS.iterdir() if p.is_file())
    http = sorted(p for p in HTTP_CORPUS.iterdir() if p.is_file())
    statuses: set[bytes] = set()
    for batch in range(0, max(len(wyoming), len(http)), 8):  # a few connections at a time
        replies = await asyncio.gather(
            *(_exchange(target.port, p.read_bytes()) for p in wyoming[batch : batch + 8]),
            *(_exchange(target.http_port, _http_request(p.read_bytes())) for p in http[batch : batch + 8]),
        )
        statuses |= {r[9:12] for r in replies if r.startswith(b"HTTP/1.1 ")}
        assert target.alive()
    assert not any(s.startswith(b"5") for s in statuses), statuses
    async with AsyncTcpClient("127.0.0.1", target.port) as client:
        assert (await describe(client)).tts
        await client.write_event(Synthesize(text="Still here.").event())
        events = await read_until(client, "audio-stop")
    assert sum(1 for e in events if e.type == "audio-chunk") >= 1
    log = target.output()
    assert "Traceback" not in log and "never retrieved" not in log, log[-5000:]
