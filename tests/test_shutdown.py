"""Graceful shutdown: SIGTERM (the add-on's stop, ``docker stop``) ends every open stream
cleanly, withdraws the zeroconf announcement, and the process exits within 10 s."""

from __future__ import annotations

import asyncio
import json
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.event import Event
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeVoice

from .conftest import start_server
from .test_zeroconf import SERVER_ADDRESS, netns  # noqa: F401 - the fixture

#: Slow: real server processes stopped by signals, a network namespace.
pytestmark = pytest.mark.full

#: Many short sentences: the one CPU worker takes turns between the streams at sentence
#: boundaries, so all four get their first audio soon. Far more than can be spoken before
#: SIGTERM (the one-shot Wyoming stream must still be open then, however the machine shares
#: its time between the streams); SIGTERM drops the rest.
TEXT = "Short sentence here. " * 100
#: Docker's default stop grace before SIGKILL.
EXIT_WITHIN_S = 10.0
_GUARD_S = 180.0


async def _wyoming_until_first_audio(port: int, streamed: bool) -> AsyncTcpClient:
    client = AsyncTcpClient("127.0.0.1", port)
    await client.connect()
    if streamed:  # a text stream still open: synthesize-start and a chunk, no stop
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name="aria")).event())
        await client.write_event(SynthesizeChunk(text=TEXT).event())
    else:
        await client.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice(name="aria")).event())
    while True:
        event = await asyncio.wait_for(client.read_event(), _GUARD_S)
        assert event is not None and not Error.is_type(event.type), event
        if event.type == "audio-chunk":
            return client


async def _wyoming_rest(client: AsyncTcpClient) -> list[Event]:
    """Events until the server closes the connection."""
    events = []
    while True:
        event = await asyncio.wait_for(client.read_event(), _GUARD_S)
        if event is None:
            return events
        events.append(event)


async def _http_until_first_audio(
    session: aiohttp.ClientSession, url: str, body: dict[str, Any]
) -> tuple[aiohttp.ClientResponse, bytes]:
    resp = await session.post(f"{url}/v1/audio/speech", json={"input": TEXT, "voice": "aria", **body})
    assert resp.status == 200
    return resp, await resp.content.readany()


async def test_sigterm_ends_four_active_streams_cleanly(
    checkpoints: Path, voices_dir: Path, tmp_path: Path
) -> None:
    """Two Wyoming streams (one-shot, and streamed text still open) and two HTTP responses
    (SSE and raw WAV) are generating when SIGTERM comes. Each Wyoming client gets an
    ``error`` (code ``server-stopping``) then ``audio-stop``, then the connection closes;
    the SSE client an ``error`` event and a complete body; the raw client a body cut
    without its final chunk (never a short file passed off as whole); an idle connection
    gets ``error`` ``server-stopping``, then EOF; the process exits 0 within 10 s, with no traceback."""
    server = start_server(
        checkpoints, voices_dir, tmp_path / "server.log",
        extra=["--no-zeroconf", "--clone-model", "none", "--custom-voice-model", "none"],
    )
    try:
        idle_reader, _idle_writer = await asyncio.open_connection("127.0.0.1", server.port)
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=_GUARD_S)) as session:
            one_shot, streamed = await asyncio.gather(
                _wyoming_until_first_audio(server.port, streamed=False),
                _wyoming_until_first_audio(server.port, streamed=True),
            )
            (sse, sse_head), (raw, _) = await asyncio.gather(
                _http_until_first_audio(session, server.http_url, {"response_format": "pcm", "stream_format": "sse"}),
                _http_until_first_audio(session, server.http_url, {"response_format": "wav"}),
            )
            sent = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            for client in (one_shot, streamed):
                events = await _wyoming_rest(client)
                types = [e.type for e in events]
                assert types[-2:] == ["error", "audio-stop"], types
                assert set(types[:-2]) <= {"audio-chunk"}, types
                error = Error.from_event(events[-2])
                assert error.code == "server-stopping" and "incomplete" in (error.text or "")
            text = (sse_head + await sse.content.read()).decode()
            events = [json.loads(line[6:]) for line in text.splitlines() if line.startswith("data: ")]
            assert events[-1]["type"] == "error" and events[-1]["error"]["code"] == "server-stopping"
            assert {e["type"] for e in events[:-1]} == {"speech.audio.delta"}
            with pytest.raises(aiohttp.ClientPayloadError):
                await raw.content.read()
            # The idle connection is told why, as on the idle timeout: error, then EOF.
            said = await asyncio.wait_for(idle_reader.read(), _GUARD_S)
            header, _, rest = said.partition(b"\n")
            assert json.loads(header)["type"] == "error", said
            assert json.loads(rest)["code"] == "server-stopping", said
        code = await asyncio.to_thread(server.proc.wait, EXIT_WITHIN_S + 5)
        took = time.monotonic() - sent
    finally:
        if server.alive():
            server.proc.kill()
    log = server.output()
    assert code == 0 and took < EXIT_WITHIN_S, (code, took, log[-3000:])
    assert "Shutting down: 4 request(s) open" in log and "Stopped in" in log
    assert "Traceback" not in log and "never retrieved" not in log, log[-4000:]
    print(f"SIGTERM to exit: {took:.2f} s")


BROWSER = r"""
import json, sys, time
from zeroconf import ServiceBrowser, ServiceStateChange, Zeroconf
zc = Zeroconf()
def changed(zeroconf, service_type, name, state_change):
    print(json.dumps({"name": name, "state": state_change.name}), flush=True)
ServiceBrowser(zc, "_wyoming._tcp.local.", handlers=[changed])
time.sleep(float(sys.argv[1]))
zc.close()
"""


@pytest.mark.netns
def test_sigterm_withdraws_the_zeroconf_announcement(
    netns: str, checkpoints: Path, voices_dir: Path, tmp_path: Path  # noqa: F811
) -> None:
    """In a network namespace of its own: a zeroconf browser sees the service added, then,
    after SIGTERM, removed (the goodbye of ``async_unregister_service``); exit within 10 s."""
    wrap = ["ip", "netns", "exec", netns]
    server = start_server(
        checkpoints, voices_dir, tmp_path / "server.log",
        extra=["--zeroconf", "qwen3tts-stop", "--clone-model", "none", "--custom-voice-model", "none"],
        wrap=wrap, uri_host="0.0.0.0",
    )
    browser = subprocess.Popen(
        wrap + [sys.executable, "-c", BROWSER, "60"], stdout=subprocess.PIPE, text=True
    )
    try:
        assert browser.stdout is not None
        seen: list[dict[str, str]] = []
        for line in browser.stdout:
            seen.append(json.loads(line))
            if seen[-1] == {"name": "qwen3tts-stop._wyoming._tcp.local.", "state": "Added"}:
                break
        assert seen and seen[-1]["state"] == "Added", seen
        sent = time.monotonic()
        server.proc.send_signal(signal.SIGTERM)
        for line in browser.stdout:
            seen.append(json.loads(line))
            if seen[-1]["state"] == "Removed":
                break
        removed = time.monotonic() - sent
        code = server.proc.wait(EXIT_WITHIN_S + 5)
        took = time.monotonic() - sent
    finally:
        browser.kill()
        if server.alive():
            server.proc.kill()
    assert seen[-1] == {"name": "qwen3tts-stop._wyoming._tcp.local.", "state": "Removed"}, seen
    assert code == 0 and took < EXIT_WITHIN_S, (code, took, server.output()[-3000:])
    assert "Zeroconf: withdrew qwen3tts-stop._wyoming._tcp.local." in server.output()
    print(f"announcement withdrawn {removed:.2f} s after SIGTERM; exit after {took:.2f} s ({SERVER_ADDRESS})")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_during_start_up_exits_at_once_and_says_so(
    checkpoints: Path, voices_dir: Path, tmp_path: Path, sig: signal.Signals
) -> None:
    """SIGTERM (``docker stop``) or Ctrl-C while a model loads: the process exits with 0
    within Docker's grace, its log says it stopped during start-up, and no traceback."""
    log = tmp_path / "server.log"
    args = [
        sys.executable, "-m", "wyoming_qwen3tts", "--uri", "tcp://127.0.0.1:0", "--http-port", "0",
        "--data-dir", str(tmp_path / "data"), "--voices-dir", str(voices_dir), "--no-zeroconf",
        "--clone-model", str(checkpoints / "base"), "--design-model", str(checkpoints / "voice_design"),
        "--custom-voice-model", "none", "--device", "cpu", "--engine", "reference", "--local-files-only",
    ]
    with log.open("w") as out:
        proc = subprocess.Popen(args, stdout=out, stderr=subprocess.STDOUT, text=True, cwd=tmp_path)
    try:
        deadline = time.monotonic() + _GUARD_S
        while "Loading base model" not in log.read_text():
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.05)
        proc.send_signal(sig)
        code = proc.wait(EXIT_WITHIN_S)
    finally:
        proc.kill()
    text = log.read_text()
    assert code == 0, text[-3000:]
    assert f"Stopped during start-up ({sig.name})" in text and "Traceback" not in text, text[-3000:]
    assert "Ready: Wyoming" not in text
