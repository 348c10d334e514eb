"""The WebSocket door: streamed text in, PCM out, at ``/v1/audio/speech/ws`` on the HTTP
port, speaking ``nari.speech.v1`` (the messages: ``ws_events``).

A voice agent sends its LLM's reply as it is written (``input_text.append`` deltas, split
anywhere); speech starts at the first clause and each later sentence starts generating
the moment it is complete. Behind the door is the same request type and streamed-text
front end as the Wyoming door's ``synthesize-start`` / ``-chunk`` / ``-stop``:
``TtsService.open`` then ``SpeechStream.add_text`` / ``finish``, and one async stream of
float32 chunks out. ``request.start`` is checked exactly as ``POST /v1/audio/speech``'s
body (``request.parse_speech`` and ``pick_voice``): the same voices, ``model`` names,
languages, ``speed``, ``seed``, ``instructions``; the API key is the HTTP door's (the
``Authorization`` header of the handshake, or from a browser the subprotocol
``ws_events.KEY_PROTOCOL_PREFIX`` + key); requests count against the same ``--max-queue``.

Behaviour:

* a client that disconnects has its stream cancelled: the running generation stops within
  a frame and its queued sentences are dropped;
* a client that sends nothing for ``idle_timeout`` seconds while its text is open (and
  gets no audio meanwhile) gets ``error`` ``idle-timeout`` and the WebSocket closes (1008);
  a client that does not read for ``write_timeout`` seconds is dropped;
* bad input gets an ``error`` event with a code and the session goes on, except where the
  request cannot: text over ``--max-chars`` (the request is cancelled; close 1009) and a
  text with nothing speakable at its end (close 1008);
* on shutdown every session gets ``error`` ``server-stopping`` and is closed (1001).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import WSCloseCode, WSMsgType, web

from ...common.audio import to_pcm16
from .shared import ApiError, error_param
from .request import parse_speech, pick_voice
from ..limits import DEFAULT_IDLE_TIMEOUT, DEFAULT_WRITE_TIMEOUT, limit_send_buffer
from ...service.errors import EmptyTextError, GenerationError, RequestError, ServerStoppingError, TextTooLongError
from ...service.speech import SpeechRequest, SpeechStream, TtsService, check_text
from .tempo import Tempo
from ...common.vocabulary import ModelKind
from . import ws_events as ev

_LOGGER = logging.getLogger(__name__)

#: The metrics' ``door`` label of this door's requests.
DOOR = "websocket"
#: ``request.start`` carries no text: this stands in for ``input`` so that its fields go
#: through ``parse_speech`` unchanged; the deltas' text is checked by the stream itself.
_NO_INPUT_YET = "Text follows."
#: Refused events in a row after which a session is closed (junk is not a client).
MAX_ERRORS_IN_A_ROW = 16


class SpeechSession:
    """One WebSocket connection: at most one request, its text in, its audio out.

    Args:
        sessions: the registry of open sessions (limits, shutdown).
        ws: the prepared WebSocket.
        transport: the connection's transport (aborted for a client that does not read).
    """

    def __init__(
        self, sessions: Sessions, ws: _SpeechWebSocket, transport: asyncio.Transport | None
    ) -> None:
        self._sessions = sessions
        self._service = sessions.service
        self._ws = ws
        self._transport = transport
        self.request_id: str | None = None
        self._stream: SpeechStream | None = None
        self._tempo = Tempo(1.0)
        self._speaker: asyncio.Task[None] | None = None
        self._sequence = 0  # the next append's or end's sequence
        self._text: list[str] = []  # the deltas so far (for the end's "anything speakable?")
        self._ended = False  # input_text.end accepted: the server owes the rest
        self._cancelled = False  # response.cancel
        self._started = False  # response.started sent
        self._samples_sent = 0  # samples in the binary messages so far (after the tempo change)
        self._finished = False  # the last event (response.done or a closing error) is sent or under way
        self._errors_in_a_row = 0
        self._ignored_logged = 0  # ignored events logged (the first at INFO)
        self._write_lock = asyncio.Lock()
        self._reader: asyncio.Task[Any] | None = None  # the task running ``run``: the one that reads
        self._close_wanted = asyncio.Event()  # another task asked the reader to close (``_close``)
        self._close_code: int = WSCloseCode.OK
        #: ``time.monotonic()`` of the last message read or written.
        self.last_active = time.monotonic()

    async def run(self) -> None:
        """Serve the session until the client or the server closes it. Never raises but
        ``CancelledError`` (the client went away: aiohttp cancels the handler)."""
        self._reader = asyncio.current_task()
        try:
            if self._ws.ws_protocol != ev.PROTOCOL:
                message = f"Offer the WebSocket subprotocol {ev.PROTOCOL!r} (Sec-WebSocket-Protocol)"
                await self._fail(
                    ev.ProtocolError("subprotocol-required", message), WSCloseCode.PROTOCOL_ERROR
                )
                return
            if not self._sessions.accepting:
                await self._fail(ServerStoppingError("The server is shutting down"), WSCloseCode.GOING_AWAY)
                return
            await self._send_json(ev.session_created())
            while True:
                message = await self._receive()
                if message is None or message.type in (
                    WSMsgType.CLOSE,
                    WSMsgType.CLOSING,
                    WSMsgType.CLOSED,
                    WSMsgType.ERROR,
                ):
                    break
                self.last_active = time.monotonic()
                if message.type is WSMsgType.TEXT:
                    await self._handle(message.data)
                elif message.type is WSMsgType.BINARY:
                    await self._refuse(
                        ev.ProtocolError(
                            "invalid-json", "Binary messages are the server's audio; send JSON text events"
                        )
                    )
        except (ConnectionError, RuntimeError) as err:
            _LOGGER.debug("WebSocket client went away: %s", err)
        except Exception:  # noqa: BLE001 - a bug of ours: log it, end this session only
            _LOGGER.exception("WebSocket session failed; closing it")
        finally:
            await self._end()

    async def _receive(self) -> Any:
        """The next message; None when the session went idle (it is then closed). While
        the text is open, ``idle_timeout`` seconds without a message read or written end it."""
        idle = self._sessions.idle_timeout
        while True:
            left = None
            if not (self._ended or self._finished):
                left = self.last_active + idle - time.monotonic()
                if left <= 0:
                    message = f"No message for {idle:g} s: closing the session" + (
                        " (send input_text.end when the text is complete)" if self._stream is not None else
                        " (send request.start, then the text)"
                    )
                    await self._fail(ev.ProtocolError("idle-timeout", message), WSCloseCode.POLICY_VIOLATION)
                    return None
            receiving = asyncio.ensure_future(self._ws.receive())
            closing = asyncio.ensure_future(self._close_wanted.wait())
            try:
                done, _pending = await asyncio.wait({receiving, closing}, timeout=left, return_when=asyncio.FIRST_COMPLETED)
            finally:
                for task in (receiving, closing):
                    if not task.done():
                        task.cancel()
                await asyncio.gather(receiving, closing, return_exceptions=True)
            if receiving in done:
                return receiving.result()  # (a close asked for meanwhile is done at the next call)
            if closing in done:
                await self._ws.close(code=self._close_code)
                return None

    async def _close(self, code: int) -> None:
        """Close the WebSocket with ``code``. The reading task closes it itself: aiohttp then
        waits for the client's own Close frame. Another task (the speaker's) asks the reading
        task to: a ``close`` while ``receive`` waits makes aiohttp drop the connection right
        after its Close frame, so a browser saw 1000 with ``wasClean`` false."""
        if asyncio.current_task() is self._reader or self._reader is None or self._reader.done():
            await self._ws.close(code=code)
        else:
            self._close_code = code
            self._close_wanted.set()

    async def _handle(self, data: str) -> None:
        request_id = None  # a request.start's: the id its request has, or would have had
        try:
            event = ev.parse_client_event(data)
            if event.type == ev.START:
                request_id = self.request_id or f"ws-{uuid.uuid4().hex}"
                await self._start(event.data, request_id)
            elif event.type == ev.APPEND:
                await self._append(event)
            elif event.type == ev.END:
                await self._end_input(event)
            else:
                await self._cancel()
            self._errors_in_a_row = 0
        except TextTooLongError as err:
            await self._fail(err, WSCloseCode.MESSAGE_TOO_BIG)
        except EmptyTextError as err:
            await self._fail(err, WSCloseCode.POLICY_VIOLATION)
        except RequestError as err:
            # A request.start that opened no request is refused, whatever the reason (a
            # missing field included); one after the session's request is an ignored event.
            await self._refuse(err, request_id, start=request_id is not None and self.request_id is None)

    async def message_too_big(self) -> None:
        """aiohttp read a message over ``max_msg_size`` and is about to close (1009): send
        ``error`` ``text-too-long`` first and cancel the request (``_fail`` without the close)."""
        if self._finished:
            return
        self._finished = True
        err = TextTooLongError(
            f"A message over {self._ws.max_msg_size} bytes: the text is limited to "
            f"{self._service.max_chars} characters (--max-chars)"
        )
        if self._stream is not None:
            self._stream.refuse(err)
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._error(err, ending=True)

    async def _start(self, data: dict[str, Any], request_id: str) -> None:
        """``request.start``: check it as ``POST /v1/audio/speech``'s body, open the stream
        as the request ``request_id``; its refusal carries that id too (the door's ``_handle``).

        Raises:
            RequestError: the start is refused (``ProtocolError``, ``ApiError``, the service's).
        """
        if self.request_id is not None:
            raise ev.ProtocolError(
                "already-configured", "This session has its request: open a new WebSocket for another"
            )
        if "input" in data:
            raise ev.ProtocolError(
                "invalid-event",
                "request.start carries no text: send it in input_text.append events "
                "(then input_text.end); 'input' is POST /v1/audio/speech's field",
                "input",
            )
        fmt = data.get("response_format")
        if fmt is not None and fmt != "pcm":
            raise ev.ProtocolError(
                "unsupported-format",
                f"This door sends raw PCM only ('response_format': 'pcm'); got {fmt!r}",
                "response_format",
            )
        fields = {
            k: v
            for k, v in data.items()
            if k not in ("type", "response_format", "stream", "stream_format")
        }
        params = parse_speech(
            {**fields, "input": _NO_INPUT_YET}, self._service.max_chars, self._sessions.model_names
        )
        if not self._service.is_ready():
            raise ApiError(
                503, "The models are still warming up; retry shortly", "not-ready", kind="server_error"
            )
        await self._service.catalog.refresh_async()  # new clips read off the loop
        name = pick_voice(self._service, params)
        request = SpeechRequest(name, params.language, params.instructions, params.seed, door=DOOR)
        self._stream = self._service.open(request)
        self._tempo = Tempo(params.speed)
        self.request_id = request_id
        self._speaker = asyncio.create_task(
            self._speak(self._stream), name=f"websocket speaker {self.request_id}"
        )
        await self._send_json(
            ev.request_configured(self.request_id, self._stream.voice_name, self._stream.language)
        )

    def _check_sequence(self, event: ev.ClientEvent) -> int:
        if self._stream is None or self.request_id is None:
            raise ev.ProtocolError("not-configured", f"{event.type} before request.start")
        if self._ended or self._cancelled:
            raise ev.ProtocolError(
                "input-ended",
                f"{event.type} after the text ended "
                f"({'cancelled' if self._cancelled else 'input_text.end'}); it is ignored",
            )
        if event.sequence is not None and event.sequence != self._sequence:
            raise ev.ProtocolError(
                "invalid-sequence",
                f"Expected sequence {self._sequence}, got {event.sequence}; the event is ignored",
                "sequence",
            )
        return self._sequence

    async def _append(self, event: ev.ClientEvent) -> None:
        sequence = self._check_sequence(event)
        assert self._stream is not None and self.request_id is not None
        try:
            self._stream.add_text(event.text)  # complete sentences start generating now
        except TextTooLongError as err:
            self._stream.refuse(err)
            raise
        self._text.append(event.text)
        self._sequence += 1
        await self._send_json(ev.ack(ev.APPEND, sequence, self.request_id))

    async def _end_input(self, event: ev.ClientEvent) -> None:
        """``input_text.end``: acknowledged as every text event is, then the text is
        complete; a text with nothing speakable is refused after the ack (``empty-text``).

        Raises:
            ProtocolError: out of sequence, before ``request.start`` or after the end.
            EmptyTextError: nothing speakable in the whole text (the request is refused).
        """
        sequence = self._check_sequence(event)
        assert self._stream is not None and self.request_id is not None
        self._ended = True
        self._sequence += 1
        try:
            check_text("".join(self._text), self._service.max_chars)  # the doors' one test of "speakable"
        except EmptyTextError as err:
            await self._send_json(ev.ack(ev.END, sequence, self.request_id))
            # Refused only now, with no await before ``_fail`` marks the session finished:
            # else the speaker would see its stream end and answer response.done.
            self._stream.refuse(err)
            raise
        self._stream.finish()
        await self._send_json(ev.ack(ev.END, sequence, self.request_id))

    async def _cancel(self) -> None:
        if self._stream is None:
            raise ev.ProtocolError("not-configured", "response.cancel before request.start")
        if not self._cancelled:
            self._cancelled = True
            self._stream.cancel()  # the speaker ends the response: response.done "cancelled"

    async def _speak(self, stream: SpeechStream) -> None:
        """Send the stream's audio as it comes, then ``response.done`` and close (1000)."""
        chunks = 0
        try:
            async for audio in stream:
                chunks += await self._send_audio(self._tempo.process(audio))
            if not self._cancelled:
                chunks += await self._send_audio(self._tempo.finish())
        except GenerationError as err:
            await self._fail(
                RequestError(f"Speech generation failed: {err}"),
                WSCloseCode.INTERNAL_ERROR,
                "generation-failed",
            )
            return
        except ServerStoppingError as err:
            await self._fail(ServerStoppingError(f"{err}; the audio is incomplete"), WSCloseCode.GOING_AWAY)
            return
        except (ConnectionError, RuntimeError) as err:
            _LOGGER.debug("WebSocket client went away while receiving audio: %s", err)
            stream.cancel()
            return
        if self._finished:
            return
        self._finished = True
        assert self.request_id is not None
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._begin_response()
            reason = "cancelled" if self._cancelled else "stop"
            await self._send_json(ev.response_done(self.request_id, reason, chunks, self._samples_sent))
            await self._close(WSCloseCode.OK)

    async def _send_audio(self, audio: Any) -> int:
        """One binary message of PCM (none for no samples); returns the messages sent."""
        if not len(audio):
            return 0
        await self._begin_response()
        await self._send(to_pcm16(audio))
        if self._stream is not None:
            self._stream.wrote()
        self._samples_sent += len(audio)
        return 1

    async def _begin_response(self) -> None:
        if not self._started:
            self._started = True
            assert self.request_id is not None
            await self._send_json(ev.response_started(self.request_id))

    async def _refuse(self, err: RequestError, request_id: str | None = None, start: bool = False) -> None:
        """An ``error`` event; the session goes on. After ``MAX_ERRORS_IN_A_ROW`` in a row it
        ends: ``error`` ``too-many-errors`` (the request refused with it), then close 1008.
        ``request_id``: a refused ``request.start``'s own id (else the session's request's);
        ``start``: ``err`` refused a ``request.start`` that opened no request (a refusal, never
        an ignored event)."""
        self._errors_in_a_row += 1
        await self._error(err, request_id=request_id, refused_start=start)
        if self._errors_in_a_row >= MAX_ERRORS_IN_A_ROW:
            why = f"Closing the WebSocket session after {self._errors_in_a_row} refused events in a row"
            await self._fail(ev.ProtocolError("too-many-errors", why), WSCloseCode.POLICY_VIOLATION)

    async def _fail(self, err: RequestError | None, close_code: int, code: str | None = None) -> None:
        """End the session: end its request (refused with ``err``, or cancelled where the
        server stops or ``err`` is None), send ``err`` (if any) and close. Once."""
        if self._finished:
            return
        self._finished = True
        if self._stream is not None:
            if err is None or isinstance(err, ServerStoppingError):
                self._stream.cancel()
            else:  # (a stream that failed has ended already: this does nothing)
                self._stream.refuse(err)
        with contextlib.suppress(ConnectionError, RuntimeError):
            if err is not None:
                await self._error(err, code, ending=True)
            await self._close(close_code)

    async def _error(
        self,
        err: RequestError,
        code: str | None = None,
        ending: bool = False,
        request_id: str | None = None,
        refused_start: bool = False,
    ) -> None:
        """Send ``err`` as an ``error`` event, log it and count it. The event and the log line
        name ``request_id`` (a refused ``request.start``'s, which the server gave it as it
        gives an accepted one its id), else the session's request's, else none.

        An error that ends the session (``ending``) or refuses a request (``request.start``'s
        unknown voice, format, language, a full queue) is logged at INFO once and counted in
        ``tts_requests_total`` as an error. The refusal of an open request (its text too long
        or with nothing speakable, an idle client) is logged by the request's own summary line
        (``SpeechStream.refuse``, with the code and reason), so here only at DEBUG. An event
        the protocol ignores (``ProtocolError``: not JSON, out of sequence, a second
        ``request.start``) is no request's outcome: logged as ignored, at INFO for the
        session's first only (a client may send junk without end), and not counted; a
        ``request.start`` that opened no request (``refused_start``) is refused, whatever the
        error."""
        code = code or err.code
        ignored = not ending and not refused_start and isinstance(err, ev.ProtocolError) and code != "unsupported-format"
        if ignored:
            self._ignored_logged += 1
            level = logging.INFO if self._ignored_logged == 1 else logging.DEBUG
            what = "ignored an event"
        else:
            self._service.count_error(DOOR, _Counted(code))
            what = {"server-stopping": "ended", "generation-failed": "failed"}.get(code, "refused")
            # The stream's refuse logged it (unless the request had ended: cancelled).
            refused_stream = ending and what == "refused" and self._stream is not None and not self._cancelled
            level = logging.DEBUG if refused_stream else logging.INFO
        request_id = request_id or self.request_id
        _LOGGER.log(level, "WebSocket %s %s: %s (%s)", request_id or "session", what, err, code)
        await self._send_json(ev.error(request_id, str(err), code, error_param(err)))

    async def _send_json(self, event: dict[str, Any]) -> None:
        await self._send(event)

    async def _send(self, data: bytes | dict[str, Any]) -> None:
        """Send one message; a client that does not take it within ``write_timeout`` is
        dropped (its request cancelled, the connection aborted).

        Raises:
            ConnectionResetError: the client is gone, or was dropped now.
        """
        timeout = self._sessions.write_timeout
        async with self._write_lock:
            if self._ws.closed:
                raise ConnectionResetError("WebSocket closed")
            try:
                if isinstance(data, bytes):
                    await asyncio.wait_for(self._ws.send_bytes(data), timeout)
                else:
                    await asyncio.wait_for(self._ws.send_json(data), timeout)
            except asyncio.TimeoutError:
                _LOGGER.info("WebSocket client stopped reading for %g s: dropping it", timeout)
                self._finished = True
                if self._stream is not None:
                    self._stream.cancel()
                if self._transport is not None:
                    self._transport.abort()
                raise ConnectionResetError("client stopped reading") from None
        self.last_active = time.monotonic()

    async def _end(self) -> None:
        """The connection ends: cancel what is still generating (the client is gone)."""
        self._sessions.remove(self)
        if self._stream is not None and not self._finished:
            self._stream.cancel()  # generation stops within a frame
        speaker = self._speaker
        if speaker is not None and not speaker.done():
            if self._finished:  # its last events are being written: let it end
                await asyncio.wait([speaker], timeout=self._sessions.write_timeout)
            speaker.cancel()
            await asyncio.gather(speaker, return_exceptions=True)
        if not self._ws.closed:
            with contextlib.suppress(ConnectionError, RuntimeError, asyncio.TimeoutError):
                await self._ws.close()

    async def shutdown(self) -> None:
        """The server stops: ``error`` ``server-stopping`` and close (1001), unless the
        session already ended (its stream's interruption may have done it)."""
        await self._fail(ServerStoppingError("The server is shutting down"), WSCloseCode.GOING_AWAY)


class _SpeechWebSocket(web.WebSocketResponse):
    """aiohttp's ``WebSocketResponse`` that calls ``on_too_big`` before aiohttp closes the
    connection (1009) over a message longer than ``max_msg_size`` bytes: aiohttp's reader
    refuses such a message before the session sees it, then closes from ``receive``.

    Args:
        max_msg_size: the longest message read, in bytes.
        **kwargs: ``WebSocketResponse``'s other arguments.
    """

    def __init__(self, max_msg_size: int, **kwargs: Any) -> None:
        super().__init__(max_msg_size=max_msg_size, **kwargs)
        self.max_msg_size = max_msg_size
        self.on_too_big: Callable[[], Awaitable[None]] | None = None
        #: A message was over ``max_msg_size``: the transport is left open (``linger``).
        self.too_big = False

    async def close(
        self, *, code: int = WSCloseCode.OK, message: bytes = b"", drain: bool = True
    ) -> bool:
        """``WebSocketResponse.close``, after ``on_too_big`` (once) when ``code`` is 1009."""
        hook, self.on_too_big = self.on_too_big, None
        if code == WSCloseCode.MESSAGE_TOO_BIG and hook is not None and not self.closed:
            self.too_big = True
            await hook()
        return await super().close(code=code, message=message, drain=drain)

    def _close_transport(self) -> None:
        # aiohttp closes the transport right after its close frame; a client still sending
        # its over-size message would get a reset, losing the error event on its way.
        if not self.too_big:
            super()._close_transport()

    async def linger(self, transport: asyncio.BaseTransport | None, timeout: float) -> None:
        """After an over-size message: let the client finish sending it (aiohttp discards
        it) and close, for at most ``timeout`` seconds, then close the transport."""
        if not self.too_big or transport is None:
            return
        deadline = time.monotonic() + timeout
        while not transport.is_closing() and time.monotonic() < deadline:
            await asyncio.sleep(0.05)
        transport.close()


class _Counted(RequestError):
    """A code to count in ``tts_errors_total`` (``TtsService.count_error`` takes an error)."""

    def __init__(self, code: str) -> None:
        super().__init__(code)
        self.code = code


class Sessions:
    """The open WebSocket sessions and their limits.

    Args:
        service: the shared speech service.
        write_timeout: seconds a write may wait for the client to read.
        idle_timeout: seconds without a message before a session with open text is closed.
        model_names: the loaded models' own names, which ``model`` may name (as on
            ``/v1/audio/speech``: ``request.loaded_model_names``).
    """

    def __init__(
        self,
        service: TtsService,
        write_timeout: float = DEFAULT_WRITE_TIMEOUT,
        idle_timeout: float = DEFAULT_IDLE_TIMEOUT,
        model_names: Mapping[str, ModelKind] | None = None,
    ) -> None:
        self.service = service
        self.model_names = dict(model_names or {})
        self.write_timeout = write_timeout
        self.idle_timeout = idle_timeout
        self.accepting = True
        self._open: set[SpeechSession] = set()

    def __len__(self) -> int:
        return len(self._open)

    def add(self, session: SpeechSession) -> None:
        self._open.add(session)

    def remove(self, session: SpeechSession) -> None:
        self._open.discard(session)

    async def shutdown(self, _app: web.Application | None = None) -> None:
        """End every session with ``error`` ``server-stopping`` (aiohttp's ``on_shutdown``)."""
        self.accepting = False
        sessions = list(self._open)
        if sessions:
            _LOGGER.info("Ending %d WebSocket session(s)", len(sessions))
            await asyncio.gather(*(s.shutdown() for s in sessions), return_exceptions=True)


_SESSIONS_KEY = web.AppKey("websocket_sessions", Sessions)


async def speech_ws(request: web.Request) -> web.StreamResponse:
    """``GET /v1/audio/speech/ws``: the WebSocket handshake, then one ``SpeechSession``.

    Raises:
        ApiError: 400 ``websocket-required`` for a plain HTTP request; 400
            ``subprotocol-required`` for a handshake that offers subprotocols, none of them
            ``ws_events.PROTOCOL`` (one offering none is answered by an ``error`` event).
    """
    sessions = request.app[_SESSIONS_KEY]
    ws = _SpeechWebSocket(
        protocols=(ev.PROTOCOL,),
        max_msg_size=max(1 << 20, 8 * sessions.service.max_chars + (64 << 10)),  # as the HTTP body limit
        compress=False,
    )
    offered = ev.offered_subprotocols(request.headers.getall("Sec-WebSocket-Protocol", []))
    if offered and ev.PROTOCOL not in offered and request.headers.get("Upgrade", "").lower() == "websocket":
        # Refused at the handshake: a browser fails a handshake whose answer selects none of
        # the subprotocols it offered, so it would never read the error event (and aiohttp
        # would log the offered ones, an API key among them, in ``can_prepare`` below).
        raise ApiError(
            400,
            f"Offer the WebSocket subprotocol {ev.PROTOCOL!r} (Sec-WebSocket-Protocol) beside any other",
            "subprotocol-required",
        )
    if not ws.can_prepare(request).ok:
        raise ApiError(
            400,
            f"{ev.PATH} is a WebSocket endpoint (subprotocol {ev.PROTOCOL}); see the README",
            "websocket-required",
        )
    await ws.prepare(request)
    limit_send_buffer(request.get_extra_info("socket"))
    session = SpeechSession(sessions, ws, request.transport)
    ws.on_too_big = session.message_too_big
    sessions.add(session)
    await session.run()
    await ws.linger(request.transport, sessions.write_timeout)
    return ws


def add_route(
    app: web.Application,
    service: TtsService,
    write_timeout: float,
    idle_timeout: float,
    model_names: Mapping[str, ModelKind] | None = None,
) -> Sessions:
    """Serve the WebSocket door on ``app`` at ``ws_events.PATH``; its sessions end on the
    application's shutdown. Returns the session registry (``Sessions``' arguments)."""
    sessions = Sessions(service, write_timeout, idle_timeout, model_names)
    app[_SESSIONS_KEY] = sessions
    app.router.add_get(ev.PATH, speech_ws)
    app.on_shutdown.append(sessions.shutdown)
    return sessions
