"""The WebSocket door (``/v1/audio/speech/ws``, ``nari.speech.v1``): a real server process
started as users start it, and a client written here from the protocol (aiohttp).

Random weights never emit EOS, so every sentence runs to its frame budget; with the
server's ``--seed`` the audio of a text is the same whichever door speaks it.
"""

from __future__ import annotations

import asyncio
import contextlib
import io
import json
import os
import re
import signal
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from wyoming.client import AsyncTcpClient
from wyoming.tts import SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeVoice

from wyoming_qwen3tts.doors.http import ws_events as ev
from wyoming_qwen3tts.common.audio import SAMPLES_PER_FRAME
from wyoming_qwen3tts.doors.http.websocket import MAX_ERRORS_IN_A_ROW
from wyoming_qwen3tts.service.speech import DESIGNED_VOICE
from wyoming_qwen3tts.text.segmenter import frame_budget

from .conftest import Server, start_server, stop_server
from .test_http import metric, scrape

KEY = "ws-test-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
#: Seconds a session with open text may send nothing (the test server's --idle-timeout).
IDLE_S = 6.0
MAX_CHARS = 300
_GUARD = aiohttp.ClientTimeout(total=240)
HARNESS = json.loads((Path(__file__).parent / "data" / "nari_ws_harness.json").read_text())
TWO_SENTENCES = "Hi there, friend. Bye now."
_CLOSED = (aiohttp.WSMsgType.CLOSE, aiohttp.WSMsgType.CLOSING, aiohttp.WSMsgType.CLOSED)


@pytest.fixture(scope="module")
def ws_server(
    checkpoints: Path, voices_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """The CPU reference engine, all three models, a fixed seed, a short idle timeout, a
    small text limit and an API key."""
    folder = tmp_path_factory.mktemp("ws-server")
    extra = [
        "--no-zeroconf",
        "--anchors",
        "off",
        "--seed",
        "7",
        "--idle-timeout",
        str(IDLE_S),
        "--max-chars",
        str(MAX_CHARS),
        "--api-key",
        KEY,
    ]
    srv = start_server(checkpoints, voices_dir, folder / "server.log", extra=extra)
    yield srv
    stop_server(srv)


def words(text: str) -> list[str]:
    """``text`` as deltas of one word each (with the whitespace after it), as an LLM streams."""
    return re.findall(r"\S+\s*", text)


class Session:
    """One WebSocket session's messages, in order: JSON events as dicts, audio as bytes."""

    def __init__(self, ws: aiohttp.ClientWebSocketResponse) -> None:
        self.ws = ws
        self.messages: list[dict[str, Any] | bytes] = []

    @property
    def events(self) -> list[dict[str, Any]]:
        return [m for m in self.messages if isinstance(m, dict)]

    @property
    def pcm(self) -> bytes:
        return b"".join(m for m in self.messages if isinstance(m, bytes))

    def types(self) -> list[str]:
        return [m["type"] if isinstance(m, dict) else "<audio>" for m in self.messages]

    async def next(self) -> dict[str, Any] | bytes | None:
        """The next message (None once the server closed the WebSocket)."""
        msg = await self.ws.receive()
        if msg.type in _CLOSED:
            return None
        assert msg.type in (aiohttp.WSMsgType.TEXT, aiohttp.WSMsgType.BINARY), msg
        item: dict[str, Any] | bytes = (
            json.loads(msg.data) if msg.type is aiohttp.WSMsgType.TEXT else bytes(msg.data)
        )
        self.messages.append(item)
        return item

    async def until(self, kind: str, **fields: Any) -> dict[str, Any]:
        """Read up to the event of type ``kind`` (and ``fields``); fails on close first."""
        while True:
            item = await self.next()
            assert item is not None, f"closed before {kind}: {self.types()}"
            if (
                isinstance(item, dict)
                and item["type"] == kind
                and all(item.get(k) == v for k, v in fields.items())
            ):
                return item

    async def send(self, event: dict[str, Any]) -> None:
        await self.ws.send_json(event)

    async def rest(self) -> int | None:
        """Read until the server closes; returns its close code."""
        while await self.next() is not None:
            pass
        return self.ws.close_code


async def connect(
    http: aiohttp.ClientSession, server: Server, headers: dict[str, str] | None = None
) -> Session:
    ws = await http.ws_connect(
        f"{server.http_url}{ev.PATH}", protocols=(ev.PROTOCOL,), headers=AUTH if headers is None else headers
    )
    assert ws.protocol == ev.PROTOCOL
    session = Session(ws)
    created = await session.until("session.created")
    assert created == {"type": "session.created", "protocol": ev.PROTOCOL, "audio": ev.AUDIO}
    return session


async def speak(session: Session, deltas: list[str], **start: Any) -> None:
    """request.start, then each delta acknowledged in turn, then the end."""
    await session.send({"type": "request.start", "response_format": "pcm", **start})
    await session.until("request.configured")
    for sequence, delta in enumerate(deltas):
        await session.send({"type": "input_text.append", "sequence": sequence, "text": delta})
        await session.until("input_text.ack", event="input_text.append", sequence=sequence)
    await session.send({"type": "input_text.end", "sequence": len(deltas)})
    await session.until("input_text.ack", event="input_text.end", sequence=len(deltas))


def check_response(session: Session, close_code: int | None) -> None:
    """A complete response: response.started once before the first audio, response.done
    counting the binary messages, no error, close 1000."""
    types = session.types()
    assert "error" not in types, session.events
    started = types.index("response.started")
    assert types.count("response.started") == 1 and "<audio>" not in types[:started], types
    done = session.events[-1]
    assert done["type"] == "response.done" and done["stop_reason"] == "stop", done
    assert done["audio_chunks"] == types.count("<audio>") > 0
    assert done["audio_samples"] * 2 == len(session.pcm)
    assert close_code == 1000


async def wyoming_streamed(server: Server, deltas: list[str], voice: str) -> bytes:
    """The same deltas through the Wyoming door's streamed text; its PCM."""
    pcm = b""
    async with AsyncTcpClient("127.0.0.1", server.port) as client:
        await client.write_event(SynthesizeStart(voice=SynthesizeVoice(name=voice)).event())
        for delta in deltas:
            await client.write_event(SynthesizeChunk(text=delta).event())
        await client.write_event(SynthesizeStop().event())
        while True:
            event = await asyncio.wait_for(client.read_event(), 240)
            assert event is not None and event.type != "error", event
            if event.type == "audio-chunk":
                pcm += event.payload or b""
            elif event.type == "synthesize-stopped":
                return pcm


# --- the exchange -------------------------------------------------------------------------


# Fast set: the smoke test of the WebSocket door (and the Wyoming door's text stream) on a
# real reference-engine server.
async def test_whole_exchange_speaks_as_the_wyoming_streamed_text(ws_server: Server) -> None:
    """Word deltas, each acknowledged; the audio is byte for byte what the Wyoming door's
    synthesize-start/chunk/stop gives for the same deltas (same front end, same seed)."""
    deltas = words(TWO_SENTENCES)
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        session = await connect(http, ws_server)
        await speak(session, deltas, voice="ryan")
        check_response(session, await session.rest())
    configured = next(e for e in session.events if e["type"] == "request.configured")
    assert configured["voice"] == "ryan" and configured["request_id"].startswith("ws-")
    acks = [e["sequence"] for e in session.events if e["type"] == "input_text.ack"]
    assert acks == list(range(len(deltas) + 1))
    assert len(session.pcm) % (2 * SAMPLES_PER_FRAME) == 0
    assert session.pcm == await wyoming_streamed(ws_server, deltas, "ryan")


@pytest.mark.full
async def test_first_audio_comes_before_the_last_delta(ws_server: Server) -> None:
    """Speech starts at the first sentence while the text is still open: the client sends
    the second sentence only once audio came."""
    first, second = words("Hi there, friend. "), words("Bye now.")
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        session = await connect(http, ws_server)
        await session.send({"type": "request.start", "voice": "ryan"})
        for sequence, delta in enumerate(first):
            await session.send({"type": "input_text.append", "sequence": sequence, "text": delta})
        while not isinstance(await session.next(), bytes):
            pass  # no end, no more text: only the first sentence's audio can come
        for sequence, delta in enumerate(second, start=len(first)):
            await session.send({"type": "input_text.append", "sequence": sequence, "text": delta})
        await session.send({"type": "input_text.end", "sequence": len(first) + len(second)})
        check_response(session, await session.rest())
    assert session.pcm == await wyoming_streamed(ws_server, first + second, "ryan")


@pytest.mark.full
async def test_speed_seed_and_language_work_as_on_the_http_door(ws_server: Server) -> None:
    """``speed`` 2 halves the audio (tempo, as /v1/audio/speech); a ``seed`` changes it; an
    unknown language is refused with the HTTP door's code."""
    text = "Hello there."
    sessions = []
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        for start in ({}, {"speed": 2.0}, {"seed": 123}):
            session = await connect(http, ws_server)
            await speak(session, [text], voice="ryan", **start)
            check_response(session, await session.rest())
            sessions.append(session)
        refused = await connect(http, ws_server)
        await refused.send({"type": "request.start", "voice": "ryan", "language": "klingon"})
        error = await refused.until("error")
        assert error["error"]["code"] == "unsupported-language"
        await refused.ws.close()
    normal, fast, seeded = sessions
    assert abs(len(fast.pcm) - len(normal.pcm) / 2) < 2 * 2400, (len(fast.pcm), len(normal.pcm))
    assert len(seeded.pcm) == len(normal.pcm) and seeded.pcm != normal.pcm


@pytest.mark.full
async def test_three_sessions_at_once(ws_server: Server) -> None:
    texts = ["One small sentence.", "Another one here.", "And a third, too."]
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        sessions = [await connect(http, ws_server) for _ in texts]

        async def one(session: Session, text: str) -> None:
            await speak(session, words(text), voice="ryan")
            check_response(session, await session.rest())

        await asyncio.gather(*(one(s, t) for s, t in zip(sessions, texts)))
    ids = {s.events[-1]["request_id"] for s in sessions}
    assert len(ids) == 3


@pytest.mark.full
async def test_harness_sequence_replayed(ws_server: Server) -> None:
    """The exact messages nari-labs' tts_bench sends (``tests/data/nari_ws_harness.json``,
    recorded from its source), checked as it checks the server's answers."""
    h = HARNESS
    assert "".join(a["text"] for a in h["appends"]) == h["prompt"]
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        ws = await http.ws_connect(
            f"{ws_server.http_url}{h['handshake']['path']}",
            protocols=tuple(h["handshake"]["subprotocols"]),
            compress=h["handshake"]["compress"],
            headers=AUTH,  # the harness sends no key; our server has one
        )
        assert ws.protocol == h["requires"]["negotiated_subprotocol"]
        session = Session(ws)
        first = await session.next()
        assert first == h["server_first"]
        await session.send(h["start"])
        assert (await session.next() or {})["type"] == h["expect_after_start"]  # type: ignore[index]
        for append in h["appends"]:
            await session.send(append)
            await session.until("input_text.ack", event="input_text.append", sequence=append["sequence"])
        await session.send(h["end"])
        await session.until("input_text.ack", event="input_text.end", sequence=h["end"]["sequence"])
        close_code = await session.rest()
    req = h["requires"]
    after = session.messages[2:]
    allowed = set(req["text_events_after_configured"])
    assert all(isinstance(m, bytes) or m["type"] in allowed for m in after), session.types()
    started = [m for m in after if isinstance(m, dict) and m["type"] == "response.started"]
    assert len(started) == 1 and isinstance(started[0]["request_id"], str) and started[0]["request_id"]
    assert started[0]["audio"] == req["response_started"]["audio_equals"]
    first_audio = next(i for i, m in enumerate(after) if isinstance(m, bytes))
    assert after.index(started[0]) < first_audio
    done = after[-1]
    assert isinstance(done, dict) and done["type"] == "response.done"
    assert (
        done["request_id"] == started[0]["request_id"]
        and done["stop_reason"] == req["response_done"]["stop_reason"]
    )
    assert done["audio_chunks"] == sum(isinstance(m, bytes) for m in after)
    assert close_code == req["close"]["code"]


# --- limits and bad input -----------------------------------------------------------------


@pytest.mark.full
async def test_bad_input_gets_error_events_and_the_session_goes_on(ws_server: Server) -> None:
    """Every refusal but the ones that end the session leaves it open (docs/api.md): a refused
    ``request.start`` opened no request, its error (in place of ``request.configured``)
    names the id the server gave that attempt, and a good ``request.start`` on the same
    socket then opens a request of its own id that speaks its whole text."""
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        session = await connect(http, ws_server)

        async def refused(message: str | dict[str, Any], code: str) -> None:
            if isinstance(message, str):
                await session.ws.send_str(message)
            else:
                await session.send(message)
            error = await session.until("error")
            assert error["error"]["code"] == code and error["error"]["message"], error

        await refused("{not json", "invalid-json")
        await refused("[1, 2]", "invalid-json")
        await refused({"type": "session.update"}, "unknown-event")
        await refused({"type": "input_text.append", "sequence": 0, "text": "early"}, "not-configured")
        await refused({"type": "request.start", "voice": "no-such-voice"}, "unknown-voice")
        await refused(
            {"type": "request.start", "voice": "ryan", "response_format": "mp3"}, "unsupported-format"
        )
        await refused({"type": "request.start", "voice": "ryan", "speed": 9}, "invalid-value")
        # /v1/audio/speech's body as it is: its text belongs in input_text.append.
        await refused({"type": "request.start", "voice": "ryan", "input": "Hi."}, "invalid-event")
        assert "input_text.append" in session.events[-1]["error"]["message"]
        refusals = [e for e in session.events if e["type"] == "error"]
        await session.send({"type": "request.start", "voice": "ryan"})
        request_id = (await session.until("request.configured"))["request_id"]
        await refused({"type": "request.start", "voice": "ryan"}, "already-configured")
        await refused({"type": "input_text.append", "sequence": 5, "text": "Hi."}, "invalid-sequence")
        await refused({"type": "input_text.append", "sequence": 0, "text": 7}, "invalid-event")
        await session.send({"type": "input_text.append", "sequence": 0, "text": "Hello there."})
        await session.until("input_text.ack", sequence=0)
        await session.send({"type": "input_text.end", "sequence": 1})
        await session.until("input_text.ack", event="input_text.end")
        await refused({"type": "input_text.append", "sequence": 2, "text": "Too late."}, "input-ended")
        close_code = await session.rest()
    # Nothing was lost: the accepted text's whole audio, then the usual end.
    done = session.events[-1]
    assert done["type"] == "response.done" and done["stop_reason"] == "stop" and close_code == 1000
    # Events before any request.start name no request; each refused start its own attempt's.
    assert [e["request_id"] for e in refusals[:4]] == [None] * 4, refusals
    attempts = [e["request_id"] for e in refusals[4:]]
    assert len(attempts) == 4 and all(a.startswith("ws-") for a in attempts) and len(set(attempts)) == 4, attempts
    assert request_id not in attempts and done["request_id"] == request_id
    assert session.pcm == await wyoming_streamed(ws_server, ["Hello there."], "ryan")
    assert "Traceback" not in ws_server.output()


@pytest.mark.full
async def test_a_refused_request_start_is_logged_as_refused_with_its_reason(ws_server: Server) -> None:
    """A refused ``request.start`` is logged at INFO and counted as an error even after an
    ignored event (the new-user trial: junk first hid the refusal from the log, since only a
    session's first error was logged); ignored events are not counted as failed requests."""
    mark = len(ws_server.output())
    errors = metric(await scrape(ws_server), "tts_requests_total", door="websocket", outcome="error")
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        session = await connect(http, ws_server)
        await session.ws.send_str("ping")  # not JSON: ignored, the session goes on
        assert (await session.until("error"))["error"]["code"] == "invalid-json"
        await session.send({"type": "request.start", "voice": "no-such-voice"})
        error = await session.until("error")
        assert error["error"]["code"] == "unknown-voice"
        await session.ws.close()
    log = ws_server.output()[mark:]
    assert "WebSocket session ignored an event: The message is not valid JSON" in log, log
    # The refusal names the id the server gave this request.start, as an accepted one's
    # request.configured would have; the log line names the same id.
    assert error["request_id"].startswith("ws-"), error
    assert f"WebSocket {error['request_id']} refused: {error['error']['message']} (unknown-voice)" in log, log
    after = metric(await scrape(ws_server), "tts_requests_total", door="websocket", outcome="error")
    assert after == errors + 1  # the refusal; not the ignored event


@pytest.mark.full
async def test_a_request_start_the_protocol_refuses_is_a_refusal_not_an_ignored_event(ws_server: Server) -> None:
    """A ``request.start`` with ``input`` opens no request: it is refused (logged as refused
    at INFO, counted), as one with an unknown voice is, even after an ignored event (the
    new-user trial: it was logged as "ignored an event" and not counted)."""
    mark = len(ws_server.output())
    errors = metric(await scrape(ws_server), "tts_requests_total", door="websocket", outcome="error")
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        session = await connect(http, ws_server)
        await session.send({"type": "session.update"})  # ignored
        assert (await session.until("error"))["error"]["code"] == "unknown-event"
        await session.send({"type": "request.start", "voice": "ryan", "input": "Hi."})
        error = await session.until("error")
        assert error["error"]["code"] == "invalid-event" and error["request_id"].startswith("ws-"), error
        await session.ws.close()
    log = ws_server.output()[mark:]
    assert f"WebSocket {error['request_id']} refused: {error['error']['message']} (invalid-event)" in log, log
    after = metric(await scrape(ws_server), "tts_requests_total", door="websocket", outcome="error")
    assert after == errors + 1


@pytest.mark.full
async def test_too_many_errors_in_a_row_end_the_session_with_an_error_saying_so(ws_server: Server) -> None:
    """After ``MAX_ERRORS_IN_A_ROW`` refused events the session ends with ``error``
    ``too-many-errors`` before the close (1008), counted once and logged once (the new-user
    trial: the close came with no error event)."""
    mark = len(ws_server.output())
    errors = metric(await scrape(ws_server), "tts_errors_total", door="websocket", code="too-many-errors")
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        session = await connect(http, ws_server)
        await session.send({"type": "request.start", "voice": "ryan"})
        await session.until("request.configured")
        for _ in range(MAX_ERRORS_IN_A_ROW):
            await session.send({"type": "bogus"})
        close_code = await session.rest()
    codes = [e["error"]["code"] for e in session.events if e["type"] == "error"]
    assert codes == ["unknown-event"] * MAX_ERRORS_IN_A_ROW + ["too-many-errors"], codes
    assert close_code == 1008
    log = ws_server.output()[mark:]
    if "QWEN3TTS_TEST_DEBUG" not in os.environ:  # --debug would add the DEBUG line
        assert log.count(f"after {MAX_ERRORS_IN_A_ROW} refused events in a row") == 1, log
    after = metric(await scrape(ws_server), "tts_errors_total", door="websocket", code="too-many-errors")
    assert after == errors + 1



@pytest.mark.full
async def test_first_audio_counts_from_the_first_text_not_from_request_start(ws_server: Server) -> None:
    """A client that opens its request and sends its first words later (a voice agent
    waiting for its LLM) is not charged that wait: the log line's first audio and the
    ``delivered`` point are measured from the same arrival, the first text (the new-user
    trial: first audio 2212 ms after a 2 s wait, its points ending at 159.7 ms)."""
    mark = len(ws_server.output())
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        session = await connect(http, ws_server)
        await session.send({"type": "request.start", "voice": "ryan"})
        configured = await session.until("request.configured")
        await asyncio.sleep(2.0)  # the LLM thinks
        await session.send({"type": "input_text.append", "sequence": 0, "text": "Hello there."})
        await session.send({"type": "input_text.end", "sequence": 1})
        assert await session.rest() == 1000
    line = next(l for l in ws_server.output()[mark:].splitlines() if "websocket request ok" in l)
    first = re.search(r"first audio (\d+) ms \(.*delivered ([\d.]+)", line)
    assert first is not None and configured["request_id"], line
    assert abs(float(first.group(1)) - float(first.group(2))) <= 1.0, line

def test_overloaded_has_the_http_doors_error_type() -> None:
    """``overloaded`` is a ``rate_limit_error`` on the WebSocket as in HTTP's 429 (the
    new-user trial: it was a ``server_error`` here)."""
    assert ev.error("ws-1", "busy", "overloaded")["error"]["type"] == "rate_limit_error"
    assert ev.error("ws-1", "stopping", "server-stopping")["error"]["type"] == "server_error"
    assert ev.error(None, "no", "unknown-voice")["error"]["type"] == "invalid_request_error"


@pytest.mark.full
@pytest.mark.parametrize(
    ("deltas", "code", "close_code"),
    [
        (["x" * (MAX_CHARS - 10), "y" * 20], "text-too-long", 1009),
        (["  ", "🎉"], "empty-text", 1008),
        (["..", ". ", "!?"], "empty-text", 1008),
    ],
)
async def test_text_the_request_cannot_take_ends_the_session(
    ws_server: Server, deltas: list[str], code: str, close_code: int
) -> None:
    """The documented error event and close; the request is logged as refused with its
    reason (not as cancelled) and counted once, as an error."""
    cancelled = metric(await scrape(ws_server), "tts_requests_total", door="websocket", outcome="cancelled")
    mark = len(ws_server.output())
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        session = await connect(http, ws_server)
        await session.send({"type": "request.start", "voice": "ryan"})
        await session.until("request.configured")
        for sequence, delta in enumerate(deltas):
            await session.send({"type": "input_text.append", "sequence": sequence, "text": delta})
        await session.send({"type": "input_text.end", "sequence": len(deltas)})
        error = await session.until("error")
        assert error["error"]["code"] == code and error["request_id"].startswith("ws-")
        assert error["error"]["param"] == "input", error  # as POST /v1/audio/speech names it
        if code == "empty-text":  # every input_text event is acknowledged, then the refusal
            acks = [e for e in session.events if e["type"] == "input_text.ack"]
            assert acks[-1] == {
                "type": "input_text.ack", "event": "input_text.end", "sequence": len(deltas),
                "request_id": error["request_id"],
            }, session.types()
            assert session.types()[-2:] == ["input_text.ack", "error"], session.types()
        assert await session.rest() == close_code
        # The server serves on.
        other = await connect(http, ws_server)
        await speak(other, ["Still here."], voice="ryan")
        check_response(other, await other.rest())
    log = ws_server.output()[mark:]
    assert f"websocket request refused ({code}: {error['error']['message']}): voice ryan" in log, log
    assert log.count(error["error"]["message"]) == 1, log  # logged once, not by the door too
    assert "websocket request cancelled" not in log
    assert metric(await scrape(ws_server), "tts_requests_total", door="websocket", outcome="cancelled") == cancelled


@pytest.mark.full
@pytest.mark.parametrize("size", [1_500_000, 5_000_000])
async def test_message_over_the_size_limit_gets_text_too_long(ws_server: Server, size: int) -> None:
    """A message past aiohttp's max_msg_size (1 MiB here) is refused by aiohttp's reader
    before the session parses it: the client still gets error text-too-long, then 1009,
    and the server logs why."""
    mark = len(ws_server.output())
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        session = await connect(http, ws_server)
        await session.send({"type": "request.start", "voice": "ryan"})
        await session.until("request.configured")
        await session.send({"type": "input_text.append", "sequence": 0, "text": "x" * size})
        error = await session.until("error")
        assert error["error"]["code"] == "text-too-long" and error["request_id"].startswith("ws-")
        assert f"{MAX_CHARS} characters" in error["error"]["message"]
        assert error["error"]["param"] == "input", error
        assert await session.rest() == 1009
        other = await connect(http, ws_server)  # the server serves on
        await speak(other, ["Still here."], voice="ryan")
        check_response(other, await other.rest())
    log = ws_server.output()[mark:]
    assert f"websocket request refused (text-too-long: {error['error']['message']})" in log, log
    assert log.count(error["error"]["message"]) == 1 and "Traceback" not in log, log


@pytest.mark.full
async def test_idle_session_is_closed_with_an_event(ws_server: Server) -> None:
    mark = len(ws_server.output())
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        session = await connect(http, ws_server)
        await session.send({"type": "request.start", "voice": "ryan"})
        await session.until("request.configured")
        began = time.monotonic()
        error = await session.until("error")
        waited = time.monotonic() - began
        assert error["error"]["code"] == "idle-timeout" and "input_text.end" in error["error"]["message"]
        assert await session.rest() == 1008
    assert waited >= IDLE_S - 0.5  # not before its time (an ordering fact, not a speed one)
    log = ws_server.output()[mark:]
    assert f"websocket request refused (idle-timeout: {error['error']['message']})" in log, log
    assert log.count(error["error"]["message"]) == 1, log  # once: by the request's own line


@pytest.mark.full
async def test_disconnect_cancels_within_a_frame_and_the_server_serves_on(ws_server: Server) -> None:
    """A client leaves after the first audio of a very long sentence: its stream is
    cancelled (counted), and the engine's log shows the generation stopped a few frames
    after what was delivered, far short of its cap."""
    long = "This one sentence goes on and on and on " * 5 + "until the model has a long way to go."
    assert frame_budget(long) > 300 and len(long) + 9 < MAX_CHARS
    before = metric(await scrape(ws_server), "tts_requests_total", door="websocket", outcome="cancelled")
    mark = len(ws_server.output())
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        session = await connect(http, ws_server)
        await session.send({"type": "request.start", "voice": "ryan"})
        await session.send(
            {"type": "input_text.append", "text": long + " And then"}
        )  # the sentence is complete
        while not isinstance(chunk := await session.next(), bytes):
            pass
        delivered = len(chunk) // (2 * SAMPLES_PER_FRAME)
        await session.ws.close()
        deadline = time.monotonic() + 120  # a hang guard while the cancellation propagates
        while (
            metric(await scrape(ws_server), "tts_requests_total", door="websocket", outcome="cancelled")
            <= before
        ):
            assert time.monotonic() < deadline, "disconnect did not cancel the stream"
            await asyncio.sleep(0.2)
        other = await connect(http, ws_server)
        await speak(other, ["Next, please."], voice="ryan")
        check_response(other, await other.rest())
    stopped = re.search(
        r"Generation stopped after (\d+) codec frames \(cap (\d+)\)", ws_server.output()[mark:]
    )
    assert stopped, ws_server.output()[-3000:]
    made, cap = int(stopped[1]), int(stopped[2])
    assert cap > 300 and delivered <= made < delivered + 20, (delivered, made, cap)


@pytest.mark.full
async def test_response_cancel_ends_the_response_cancelled(ws_server: Server) -> None:
    """``response.cancel`` (what the harness sends when it gives up): the generation stops,
    ``response.done`` says ``cancelled`` and counts what was sent, then the close (1000)."""
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        session = await connect(http, ws_server)
        await session.send({"type": "request.start", "voice": "ryan"})
        await session.send({"type": "input_text.append", "text": "One sentence here. Another one follows. And more"})
        while not isinstance(await session.next(), bytes):
            pass
        await session.send({"type": "response.cancel"})
        close_code = await session.rest()
    done = session.events[-1]
    assert done["type"] == "response.done" and done["stop_reason"] == "cancelled", session.types()
    assert done["audio_chunks"] == session.types().count("<audio>") and close_code == 1000


@pytest.mark.full
async def test_api_key_and_handshake_errors(ws_server: Server) -> None:
    """A handshake without the key gets 401, counted as this door's error (its metrics
    label, ``door="websocket"``), not as the HTTP door's."""
    before = await scrape(ws_server)
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(f"{ws_server.http_url}{ev.PATH}", protocols=(ev.PROTOCOL,))
        assert refused.value.status == 401
        assert refused.value.headers["WWW-Authenticate"] == "Bearer"  # no key: no error code (RFC 6750 3.1)
        after = await scrape(ws_server)
        for door, more in (("websocket", 1), ("http", 0)):
            labels = {"door": door, "code": "invalid_api_key"}
            assert metric(after, "tts_errors_total", **labels) == metric(before, "tts_errors_total", **labels) + more
        async with http.get(f"{ws_server.http_url}{ev.PATH}", headers=AUTH) as plain:
            assert plain.status == 400 and (await plain.json())["error"]["code"] == "websocket-required"
        ws = await http.ws_connect(f"{ws_server.http_url}{ev.PATH}", headers=AUTH)  # no subprotocol offered
        session = Session(ws)
        error = await session.until("error")
        assert error["error"]["code"] == "subprotocol-required"
        assert await session.rest() == 1002


@pytest.mark.full
async def test_a_browser_offers_the_api_key_as_a_subprotocol(ws_server: Server) -> None:
    """Browsers cannot set headers on a WebSocket: ``new WebSocket(url, ["nari.speech.v1",
    "openai-insecure-api-key." + key])``. The right key gets in (the server selects
    ``nari.speech.v1`` and speaks); a wrong one gets 401."""
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        with pytest.raises(aiohttp.WSServerHandshakeError) as refused:
            await http.ws_connect(f"{ws_server.http_url}{ev.PATH}", protocols=(ev.PROTOCOL, ev.KEY_PROTOCOL_PREFIX + "wrong"))
        assert refused.value.status == 401
        assert 'error="invalid_token"' in refused.value.headers["WWW-Authenticate"]
        # Only the key offered: refused at the handshake (a browser fails a handshake that
        # selects none of its subprotocols, so it never reads an error event), and the key
        # reaches no log line.
        async with http.get(
            f"{ws_server.http_url}{ev.PATH}",
            headers={"Connection": "Upgrade", "Upgrade": "websocket", "Sec-WebSocket-Version": "13",
                     "Sec-WebSocket-Key": "dGhlIHNhbXBsZSBub25jZQ==", "Sec-WebSocket-Protocol": ev.KEY_PROTOCOL_PREFIX + KEY},
        ) as only_key:
            assert only_key.status == 400 and (await only_key.json())["error"]["code"] == "subprotocol-required"
        assert KEY not in ws_server.output()
        ws = await http.ws_connect(f"{ws_server.http_url}{ev.PATH}", protocols=(ev.PROTOCOL, ev.KEY_PROTOCOL_PREFIX + KEY))
        assert ws.protocol == ev.PROTOCOL
        session = Session(ws)
        await session.until("session.created")
        await speak(session, ["Hello there."])
        await session.until("response.done")
        await ws.close()
        assert "<audio>" in session.types() and "error" not in session.types()
        # Elsewhere the subprotocol is no key: a plain HTTP route still wants the header.
        async with http.get(f"{ws_server.http_url}/v1/models", headers={"Sec-WebSocket-Protocol": ev.KEY_PROTOCOL_PREFIX + KEY}) as plain:
            assert plain.status == 401


@pytest.mark.full
async def test_sigterm_ends_each_session_with_an_error_event(
    checkpoints: Path, voices_dir: Path, tmp_path: Path
) -> None:
    """SIGTERM while one session receives audio and another has not started its request:
    each gets ``error`` ``server-stopping``, then the close (1001); the process exits 0."""
    server = start_server(
        checkpoints,
        voices_dir,
        tmp_path / "server.log",
        extra=["--no-zeroconf", "--anchors", "off", "--clone-model", "none", "--design-model", "none"],
    )
    try:
        async with aiohttp.ClientSession(timeout=_GUARD) as http:
            speaking, waiting = await connect(http, server, {}), await connect(http, server, {})
            await speaking.send({"type": "request.start", "voice": "ryan"})
            await speaking.send({"type": "input_text.append", "text": "Short sentence here. " * 12})
            while not isinstance(await speaking.next(), bytes):
                pass
            server.proc.send_signal(signal.SIGTERM)
            for session in (speaking, waiting):
                code = await session.rest()
                error = session.events[-1]
                assert error["type"] == "error" and error["error"]["code"] == "server-stopping", (
                    session.types()
                )
                assert code == 1001
            assert "response.done" not in speaking.types()
        assert await asyncio.to_thread(server.proc.wait, 15) == 0
    finally:
        if server.alive():
            server.proc.kill()
    assert "Traceback" not in server.output(), server.output()[-3000:]


# --- the protocol's messages (no server) --------------------------------------------------


@pytest.mark.parametrize(
    ("message", "code"),
    [
        ("", "invalid-json"),
        ("null", "invalid-json"),
        ('"text"', "invalid-json"),
        ('{"type": "input_audio.append"}', "unknown-event"),
        ("{}", "unknown-event"),
        ('{"type": "input_text.append", "sequence": -1, "text": "a"}', "invalid-event"),
        ('{"type": "input_text.append", "sequence": true, "text": "a"}', "invalid-event"),
        ('{"type": "input_text.append", "text": null}', "invalid-event"),
        # text in the end would be lost quietly (the new-user trial): refused, the session goes on
        ('{"type": "input_text.end", "text": "Hello there."}', "invalid-event"),
    ],
)
def test_parse_refuses_with_a_code(message: str, code: str) -> None:
    with pytest.raises(ev.ProtocolError) as err:
        ev.parse_client_event(message)
    assert err.value.code == code


def test_parse_reads_the_harness_events() -> None:
    for event in (HARNESS["start"], *HARNESS["appends"], HARNESS["end"], HARNESS["on_failure_sends"]):
        parsed = ev.parse_client_event(json.dumps(event))
        assert parsed.type == event["type"] and parsed.sequence == event.get("sequence")
        assert parsed.text == event.get("text", "")


@pytest.mark.full
def test_readme_client_works_as_written(ws_server: Server) -> None:
    """The WebSocket client of the API page (docs/api.md, which the README links to), run as
    written but for the server's address and key."""
    readme = (Path(__file__).parent.parent / "docs" / "api.md").read_text()
    section = readme[readme.index("\n## Streamed text over a WebSocket\n") :]
    code = section[section.index("```python\n") + 10 : section.index("\n```", section.index("```python\n"))]
    assert len(code.splitlines()) <= 22
    url = f"ws://127.0.0.1:{ws_server.http_port}{ev.PATH}"
    code = code.replace("ws://localhost:8880/v1/audio/speech/ws", url).replace("your key, or anything", KEY)
    scope: dict[str, Any] = {}
    exec(compile(code, "docs/api.md", "exec"), scope)  # noqa: S102 - the page's own code
    pcm = scope["pcm"]
    assert isinstance(pcm, bytes) and len(pcm) > 0 and len(pcm) % (2 * SAMPLES_PER_FRAME) == 0
    # The next block: a wrong key, and how the client reads why (what it prints is the
    # page's comment; the log line the page quotes is the server's).
    rest = section[section.index("\n```", section.index("```python\n")) + 4 :]
    wrong = rest[rest.index("```python\n") + 10 : rest.index("\n```", rest.index("```python\n"))]
    printed = io.StringIO()
    mark = len(ws_server.output())
    with contextlib.redirect_stdout(printed):
        exec(compile(wrong, "docs/api.md", "exec"), scope)  # noqa: S102 - the page's own code
    said = wrong.splitlines()[-2].removeprefix("# ")
    assert printed.getvalue().strip() == said == '401 Bearer error="invalid_token", error_description="Incorrect API key provided"'
    quoted = re.search(r"\(`(HTTP GET [^`]+)`\)", section[: section.index(wrong)])
    assert quoted is not None and quoted[1] in ws_server.output()[mark:]


@pytest.mark.full
def test_first_audio_benchmark_runs_both_doors(ws_server: Server, tmp_path: Path) -> None:
    """``benchmarks/ws_first_audio.py`` (the GPU figure's script), a few requests per door
    against the tiny server: every request gets audio and the report has both doors (the
    figures themselves are the GPU machine's)."""
    from benchmarks.ws_first_audio import deltas, main

    assert "".join(deltas("Hi there.  Two\\nlines.")) == "Hi there.  Two\\nlines."
    code = main(
        [
            "--wyoming-port",
            str(ws_server.port),
            "--http-port",
            str(ws_server.http_port),
            "--api-key",
            KEY,
            "--requests",
            "2",
            "--rate",
            "4",
            "--text",
            "Hi there. Bye.",
            "--timeout",
            "200",
            "--out",
            str(tmp_path),
        ]
    )
    report = json.loads((tmp_path / "ws_first_audio.json").read_text())
    assert code == 0, report["errors"]
    for door in ("websocket", "wyoming"):
        row = report["rows"][door]
        assert row["n"] == 2 and row["failed"] == 0 and 0 < row["p50_ms"] <= row["p95_ms"], row
    assert report["p95_difference_ms"] is not None


def _raw_frame(sock: Any, pending: bytearray) -> tuple[int, bytes]:
    """One server frame (opcode, payload) read off a raw socket; server frames are unmasked."""
    import struct

    def need(n: int) -> None:
        while len(pending) < n:
            data = sock.recv(65536)
            if not data:
                raise EOFError("the server closed the connection")
            pending.extend(data)

    need(2)
    opcode, length, offset = pending[0] & 0x0F, pending[1] & 0x7F, 2
    if length == 126:
        need(4)
        length, offset = struct.unpack(">H", bytes(pending[2:4]))[0], 4
    elif length == 127:
        need(10)
        length, offset = struct.unpack(">Q", bytes(pending[2:10]))[0], 10
    need(offset + length)
    payload = bytes(pending[offset:offset + length])
    del pending[:offset + length]
    return opcode, payload


@pytest.mark.full
def test_the_server_waits_for_the_clients_close_frame(ws_server: Server) -> None:
    """After ``response.done`` the server sends Close 1000 and keeps the connection until the
    client's own Close frame (RFC 6455 5.5.1), so a browser sees ``wasClean``. It used to
    drop the connection about 1 ms after its Close (aiohttp's ``close`` from the speaking task
    while the reading task waited), in 4 of 4 raw runs. A raw socket, because client
    libraries answer the Close themselves."""
    import base64
    import os
    import socket
    import struct

    host, port = ws_server.http_url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=60) as sock:
        sock.sendall(
            (
                f"GET {ev.PATH} HTTP/1.1\r\nHost: {host}:{port}\r\nUpgrade: websocket\r\nConnection: Upgrade\r\n"
                f"Sec-WebSocket-Key: {base64.b64encode(os.urandom(16)).decode()}\r\nSec-WebSocket-Version: 13\r\n"
                f"Sec-WebSocket-Protocol: {ev.PROTOCOL}\r\nAuthorization: Bearer {KEY}\r\n\r\n"
            ).encode()
        )
        pending = bytearray()
        while b"\r\n\r\n" not in pending:
            pending.extend(sock.recv(4096))
        head, _, rest = bytes(pending).partition(b"\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 101"), head
        pending = bytearray(rest)

        def send(event: dict[str, Any] | bytes, opcode: int = 1) -> None:
            data = json.dumps(event).encode() if isinstance(event, dict) else event
            mask = os.urandom(4)
            assert len(data) < 126
            sock.sendall(bytes([0x80 | opcode, 0x80 | len(data)]) + mask + bytes(b ^ mask[i % 4] for i, b in enumerate(data)))

        for event in ({"type": "request.start", "voice": "clone"}, {"type": "input_text.append", "text": "Hi there."},
                      {"type": "input_text.end"}):
            send(event)
        texts = []
        while True:
            opcode, payload = _raw_frame(sock, pending)
            if opcode == 8:
                assert struct.unpack(">H", payload[:2])[0] == 1000
                break
            if opcode == 1:
                texts.append(json.loads(payload)["type"])
        assert texts[-1] == "response.done", texts
        sock.settimeout(2.0)  # the server waits for our Close (aiohttp: up to 10 s): nothing comes now
        with pytest.raises(socket.timeout):
            sock.recv(10)
        send(struct.pack(">H", 1000), opcode=8)  # our Close: now the server ends the connection
        sock.settimeout(30)
        assert sock.recv(10) == b""


@pytest.mark.parametrize(("key", "http_port", "warned"), [("s3cr3t/key=", True, True), ("0123abcd" * 8, True, False), ("s3cr3t/key=", False, False)])
def test_a_key_no_browser_can_offer_is_warned_of_at_start_up(
    key: str, http_port: bool, warned: bool, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """``check_args`` warns of an ``--api-key`` a browser cannot offer to this door (a
    base64 key's ``/`` and ``=``), once, and only while the HTTP port is on."""
    from wyoming_qwen3tts.__main__ import build_parser, check_args

    from .conftest import free_port

    args = build_parser().parse_args(
        ["--data-dir", str(tmp_path), "--uri", f"tcp://127.0.0.1:{free_port()}",
         "--http-host", "127.0.0.1", "--http-port", str(free_port() if http_port else 0), "--api-key", key]
    )
    with caplog.at_level("WARNING"):
        check_args(args)
    said = [r.getMessage() for r in caplog.records if "--api-key" in r.getMessage()]
    assert len(said) == int(warned), said
    assert not warned or "WebSocket" in said[0] and "openssl rand -hex 32" in said[0] and "!#$%&'*" in said[0]


@pytest.mark.full
async def test_a_voice_designed_from_instructions_is_configured_as_designed(ws_server: Server) -> None:
    """``request.start`` with ``instructions`` and no voice designs a one-off voice: the
    session's ``request.configured`` names it ``(designed)``, as the HTTP door's ``X-Voice``
    does, not the default voice that did not speak."""
    async with aiohttp.ClientSession(timeout=_GUARD) as http:
        session = await connect(http, ws_server)
        await speak(session, ["A calm hello."], instructions="A calm, low voice.")
        check_response(session, await session.rest())
    configured = next(e for e in session.events if e["type"] == "request.configured")
    assert configured["voice"] == DESIGNED_VOICE == "(designed)", configured


@pytest.mark.parametrize("key", ["ключ", "key\u00e9", " spaced", "spaced ", "tab\tkey", "new\nline"])
def test_a_key_no_http_client_can_send_is_refused_at_start_up(key: str, tmp_path: Path) -> None:
    """An ``--api-key`` outside printable ASCII, or with a space at an end, cannot travel in
    an ``Authorization`` header from the openai SDK (httpx refuses it) or a browser: start-up
    refuses it in one line, before any model loads. The SDK's own refusal of a non-ASCII key
    is checked too."""
    import httpx
    import openai

    from wyoming_qwen3tts.__main__ import build_parser, check_args

    from .conftest import free_port

    args = build_parser().parse_args(
        ["--data-dir", str(tmp_path), "--uri", f"tcp://127.0.0.1:{free_port()}", "--api-key", key]
    )
    with pytest.raises(SystemExit, match="--api-key must be printable ASCII"):
        check_args(args)
    if key.isascii():
        return  # spaces at an end never equal the header's stripped token; a line break splits it
    sdk = openai.OpenAI(base_url="http://127.0.0.1:9/v1", api_key=key, max_retries=0, timeout=5)
    with pytest.raises((UnicodeEncodeError, httpx.LocalProtocolError, openai.APIConnectionError)) as refused:
        sdk.models.list()
    assert not isinstance(refused.value, openai.APIConnectionError) or isinstance(
        refused.value.__cause__, (UnicodeEncodeError, httpx.LocalProtocolError)
    ), refused.value.__cause__
