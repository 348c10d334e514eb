"""Wyoming front door: one event handler per connection, on the ``wyoming`` package.

Handles ``describe`` -> ``info``; one-shot ``synthesize``; streamed text
(``synthesize-start`` / ``synthesize-chunk`` / ``synthesize-stop`` -> ``synthesize-stopped``).
Audio goes out as ``audio-start`` / ``audio-chunk`` / ``audio-stop`` in one format (24 kHz,
16-bit, mono) while the model generates; a text with nothing speakable (blank, or only
punctuation, emoji or markup) gets ``audio-start`` and ``audio-stop`` with no audio between,
as wyoming-piper answers it. Bad requests get an ``error`` event and the connection stays
usable, but for a refused ``synthesize`` (malformed or not): its ``error``, then the
connection ends (``Qwen3TtsEventHandler._refuse``). A refused ``synthesize-chunk`` (its
text over the limit, or malformed) refuses its whole text stream
(``Qwen3TtsEventHandler._refuse_stream``). Every refused text stream (its start or a
chunk refused) is answered alike: ``error``, then ``audio-stop`` only if its
``audio-start`` had been sent (earlier sentences spoken; a text stream's ``audio-start``
goes out with its first audio, a ``synthesize``'s as soon as it is accepted), then ``synthesize-stopped`` after its ``synthesize-stop``; never an
empty ``audio-start``/``audio-stop`` pair. Unknown event types are ignored.

Limits (``WyomingLimits``), all enforced here, so no client can hold the server:

* events are read strictly (``wire.read_event``): a malformed event gets an ``error``; one
  after which the stream cannot be resynchronised, or too many in a row, also closes the
  connection. Each is logged once, without a traceback. An event cut off by the client's
  EOF (``wire.EventCutOffError``) gets an ``error`` too, after the replies owed for the
  whole requests before it, then the connection closes: no connection is closed silently;
* a client that stops reading: a write that cannot drain within ``write_timeout`` seconds
  drops that connection's streams (their generation stops) and the connection;
* a connection idle for ``idle_timeout`` seconds (nothing read or written, no audio owed)
  is closed, and past ``max_connections`` the longest-idle one makes room for a new one
  (a new connection is refused with an ``error`` only when none is idle);
* ``Connections.shutdown`` ends every open stream with an ``error`` (code
  ``server-stopping``) and ``audio-stop``, then closes every connection.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Coroutine
from dataclasses import dataclass
from typing import Any

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.ping import Ping
from wyoming.server import AsyncEventHandler
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from ... import __version__
from ...common.audio import PCM_WIDTH, SAMPLE_RATE, to_pcm16
from ..limits import DEFAULT_IDLE_TIMEOUT, DEFAULT_WRITE_TIMEOUT, limit_send_buffer
from ...service.errors import EmptyTextError, GenerationError, OverloadedError, RequestError, ServerStoppingError
from ...service.speech import SpeechRequest, SpeechStream, TtsService
from ...common.vocabulary import ModelKind
from ...catalogue.voices import Voice, name_order
from .wire import MAX_EVENT_BYTES, EventCutOffError, MalformedEventError, read_event

_LOGGER = logging.getLogger(__name__)

#: Output format of every stream: 24 kHz, 16-bit (2 bytes), mono.
_FORMAT = {"rate": SAMPLE_RATE, "width": PCM_WIDTH, "channels": 1}

_ATTRIBUTION = {
    ModelKind.BASE: Attribution("Qwen3-TTS Base (voice cloning)", "https://github.com/QwenLM/Qwen3-TTS"),
    ModelKind.VOICE_DESIGN: Attribution("Qwen3-TTS VoiceDesign", "https://github.com/QwenLM/Qwen3-TTS"),
    ModelKind.CUSTOM_VOICE: Attribution("Qwen3-TTS CustomVoice", "https://github.com/QwenLM/Qwen3-TTS"),
}


def build_info(voices: list[Voice], backend: str) -> Info:
    """The ``info`` answer: one TTS program, described with the engines' real back end
    (``TtsService.backend``), listing every voice with its languages."""
    tts_voices = [
        TtsVoice(
            name=voice.name,
            description=voice.summary,
            attribution=_ATTRIBUTION[voice.kind],
            installed=True,
            version=None,
            languages=list(voice.languages),
        )
        for voice in sorted(voices, key=lambda v: name_order(v.name))
    ]
    program = TtsProgram(
        name="qwen3-tts",
        description=f"Qwen3-TTS on {backend}",
        attribution=Attribution("wyoming-qwen3tts", "https://github.com/QwenLM/Qwen3-TTS"),
        installed=True,
        version=__version__,
        voices=tts_voices,
        supports_synthesize_streaming=True,
    )
    return Info(tts=[program])


#: Wyoming connections kept open at once; past it the longest-idle one is closed.
DEFAULT_MAX_CONNECTIONS = 64
#: Malformed events in a row after which a connection is closed (junk is not a client).
MAX_MALFORMED_IN_A_ROW = 16
#: A refused connection is read (and what it sends discarded) for at most this long, in s,
#: or this many bytes, before it is closed (``Qwen3TtsEventHandler._close_refused``).
REFUSED_LINGER_S = 2.0
REFUSED_READ_BYTES = 1 << 20
#: A connection that has sent nothing yet is not closed to make room for a new one until it
#: is this old, in s: its request may be on its way, and closing it unread resets it.
UNSPOKEN_GRACE_S = 0.5
#: After a client ends its side with replies owed, a Wyoming ``ping`` is sent whenever nothing
#: was written for this long, in s: a client that closed altogether answers it with a reset,
#: and its work is dropped at the next one (``Qwen3TtsEventHandler._finish_owed``).
HALF_CLOSED_PROBE_S = 1.0


@dataclass(frozen=True)
class WyomingLimits:
    """Per-connection limits of the Wyoming door (see the module docstring).

    Attributes:
        write_timeout: seconds a write may wait for the client to read.
        idle_timeout: seconds without traffic before an idle connection is closed.
        max_connections: connections open at once.
        max_event_bytes: largest data or payload part of one event, in bytes.
    """

    write_timeout: float = DEFAULT_WRITE_TIMEOUT
    idle_timeout: float = DEFAULT_IDLE_TIMEOUT
    max_connections: int = DEFAULT_MAX_CONNECTIONS
    max_event_bytes: int = MAX_EVENT_BYTES


class Qwen3TtsEventHandler(AsyncEventHandler):
    """One client connection. Create through ``Connections`` (the server's handler factory).

    Args:
        connections: the registry of open connections (limits, shutdown).
        reader, writer: the connection (from ``wyoming.server.AsyncServer``).
    """

    def __init__(self, connections: Connections, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__(reader, writer)
        self._connections = connections
        self._service = connections.service
        self._limits = connections.limits
        self._stream: SpeechStream | None = None  # the open synthesize-start stream
        self._stream_refused = False  # its start or text was refused: drop its chunks quietly
        #: Refused streams whose ``error`` (text, code, log level) their audio task still owes.
        self._refusals: dict[SpeechStream, tuple[str, str, int]] = {}
        self._streams: set[SpeechStream] = set()  # all streams still producing audio
        self._tail: asyncio.Task[None] | None = None  # last audio task: replies stay in order
        self._write_lock = asyncio.Lock()
        self._closing = False
        self._dismissal: asyncio.Task[None] | None = None  # ``dismiss``: the error, then close
        self._malformed_seen = 0  # malformed events on this connection (only the first is logged at INFO)
        #: ``time.monotonic()`` of the last event read or write completed.
        self.last_active = time.monotonic()
        self._opened = self.last_active
        self._spoken = False  # an event has been read from the client

    def evictable(self, now: float) -> bool:
        """Whether this connection may be closed to make room for a new one: it owes no
        audio, and it has sent an event or is older than ``UNSPOKEN_GRACE_S``."""
        return not self.busy() and (self._spoken or now - self._opened > UNSPOKEN_GRACE_S)

    async def run(self) -> None:
        """Read events until EOF, a fatal malformed event, or ``close``. Never raises:
        whatever ends the connection is logged once."""
        limit_send_buffer(self.writer.get_extra_info("socket"))
        refusal = self._connections.admit(self)
        if refusal is not None:
            await self._error(refusal.args[0], refusal.code)
            self._service.count_error("wyoming", refusal)
            await self._close_refused()
            return
        malformed = 0
        try:
            while not self._closing:
                try:
                    event = await read_event(self.reader, self._limits.max_event_bytes)
                except MalformedEventError as err:
                    malformed += 1
                    if isinstance(err, EventCutOffError):  # at EOF: the whole requests are answered first
                        await self._finish_owed()
                    await self._refuse(err.event_type, err)
                    if not err.resync or self._closing:
                        break
                    if malformed >= MAX_MALFORMED_IN_A_ROW:
                        _LOGGER.info("Closing a Wyoming connection after %d malformed events in a row", malformed)
                        break
                    continue
                if event is None:
                    await self._finish_owed()
                    break
                malformed = 0
                self._spoken = True
                self.last_active = time.monotonic()
                await self.handle_event(event)
        except ConnectionError:
            pass
        except Exception:  # noqa: BLE001 - a bug of ours: log it, close this connection only
            _LOGGER.exception("Wyoming connection failed; closing it")
        finally:
            self._connections.remove(self)
            await self.disconnect()
            self.writer.close()

    async def _finish_owed(self) -> None:
        """At the client's EOF. A client may end its side after its last request and go on
        reading (``shutdown(SHUT_WR)``, ``nc -N``), as wyoming-piper allows: the replies owed
        for its whole requests are still sent, then the connection closes. A text stream left
        open (no ``synthesize-stop``) can never be completed: it is dropped now.

        EOF alone does not tell such a client from one that closed altogether; a write does
        (the closed side answers it with a reset, and the next write fails). So while the
        replies are owed and nothing is written for ``HALF_CLOSED_PROBE_S`` (a request
        waiting for its turn), a ``ping`` is written: a gone client's work is dropped within
        about two of them."""
        if self._stream is not None:
            self._stream.cancel()
            self._stream = None
        tail = self._tail
        if tail is None or tail.done():  # (not ``busy()``: a refused stream's synthesize-stopped is owed too)
            return
        _LOGGER.debug("Wyoming client ended its side: sending the replies it is owed")
        while not tail.done():
            await asyncio.wait([tail], timeout=HALF_CLOSED_PROBE_S)
            if tail.done() or time.monotonic() - self.last_active < HALF_CLOSED_PROBE_S:
                continue
            try:
                await self._write(Ping(text="half-closed").event())
            except ConnectionError:
                _LOGGER.debug("Wyoming client gone after ending its side: dropping its work")
                return  # ``run`` drops the work (``disconnect``)

    async def _close_refused(self) -> None:
        """Close a refused connection gracefully: end our side after the error (the client
        reads it, then EOF), read and discard what the client sends until its EOF (at most
        ``REFUSED_READ_BYTES`` / ``REFUSED_LINGER_S``), then close. Closing at once, with the
        client's request unread or still on its way, resets the connection: the client's
        write fails with a broken pipe, or its read with a reset, and the error is lost
        (at 40 req/s on the H200, 5 of 153 refusals)."""
        with contextlib.suppress(ConnectionError, OSError, RuntimeError, asyncio.TimeoutError):
            if self.writer.can_write_eof():
                self.writer.write_eof()
            deadline = asyncio.get_running_loop().time() + REFUSED_LINGER_S
            read = 0
            while read < REFUSED_READ_BYTES:
                left = deadline - asyncio.get_running_loop().time()
                data = await asyncio.wait_for(self.reader.read(64 << 10), max(left, 0.0))
                if not data:
                    break
                read += len(data)
        self.writer.close()

    def _malformed(self, err: MalformedEventError) -> Coroutine[Any, Any, None]:
        """Count a malformed event now; the ``error`` answering it, to send. The first of a
        connection is logged at INFO, later ones at DEBUG, so a client that keeps sending
        junk cannot fill the log (every one is still counted in ``tts_errors_total``)."""
        self._service.count_error("wyoming", err)
        self._malformed_seen += 1
        return self._error(str(err), err.code, logging.INFO if self._malformed_seen == 1 else logging.DEBUG)

    async def handle_event(self, event: Event) -> bool:
        """Dispatch one event; a refusal is answered by ``_refuse``. Always returns True (a
        refused ``synthesize`` ends the connection through ``close``)."""
        try:
            await self._dispatch(event)
        except RequestError as err:
            await self._refuse(event.type, err)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            detail = f"missing field {err}" if isinstance(err, KeyError) else str(err)
            await self._refuse(event.type, MalformedEventError(f"Malformed {event.type} event: {detail}", resync=True))
        return True

    async def _refuse(self, event_type: str | None, err: RequestError) -> None:
        """Answer a refused event (of ``event_type``, None where unknown) with ``error``.

        A refused ``synthesize``, malformed or not (an unknown voice, a text over the limit,
        ``voice`` not an object, no ``text``...), then ends the connection, as wyoming-piper
        does (its handler ends on an error): Home Assistant reads a ``synthesize`` reply up
        to ``audio-stop`` or EOF with no timeout and skips ``error`` there, so an error
        alone would leave it waiting for the idle timeout; a client that reads errors has
        the reason, and none is left reading an empty reply as the next request's. Audio
        still owed on the connection is sent first. Every other refusal (those of a text
        stream's events included, and of a malformed compatibility copy of its text: a
        ``synthesize`` while a stream is open) keeps the connection; a malformed
        ``synthesize-chunk`` also refuses its open text stream (``_refuse_stream``).
        """
        chunk = event_type is not None and SynthesizeChunk.is_type(event_type)
        if chunk and self._stream is not None and isinstance(err, MalformedEventError):
            # A malformed chunk lost part of the text: speaking the rest would say a reply
            # with a hole in it. Refused as a text over the limit is (``_refuse_stream``).
            await self._refuse_stream(err, f"{err}; the text stream is refused, since part of its text is lost")
            return
        in_stream = self._stream is not None or self._stream_refused
        ends = event_type is not None and Synthesize.is_type(event_type) and not in_stream
        if ends and self._tail is not None and not self._tail.done():
            await asyncio.wait([self._tail])  # the audio still owed goes out first
        if isinstance(err, MalformedEventError):
            reply = self._malformed(err)
        else:
            self._service.count_error("wyoming", err)
            reply = self._error(str(err), err.code)
        if event_type is not None and SynthesizeStart.is_type(event_type) and self._stream_refused:
            # A refused text stream's error goes in the stream's place among the replies, as
            # a refused chunk's does (``_refuse_stream``); no audio was started for it.
            self._chain(reply)
        else:
            await reply
        if ends:
            self.close()  # the read loop ends; the error is flushed before the close

    async def _refuse_stream(self, err: RequestError, text: str) -> None:
        """Refuse the open text stream after one of its chunks was refused (``err``: its
        text went over the limit, or the chunk was malformed): its generation stops, the
        stream's later chunks and compatibility copy are dropped quietly and its
        ``synthesize-stop`` gets ``synthesize-stopped``; the connection serves on. Logged
        once, by the request's summary line (the ``error`` itself at DEBUG).

        The client gets one ``error`` saying ``text``, in the stream's place among the
        replies, from its audio task (``_write_audio``): no audio after it, and
        ``audio-stop`` after it only if the stream's ``audio-start`` was sent (earlier
        sentences spoken), as for every refused text stream: ``error``, [``audio-stop``],
        ``synthesize-stopped``."""
        assert self._stream is not None
        stream, ended = self._stream, self._stream not in self._streams  # (its generation failed)
        if not ended:
            self._refusals[stream] = (text, err.code, logging.DEBUG)
        stream.refuse(err)
        self._stream, self._stream_refused = None, True
        self._service.count_error("wyoming", err)
        if ended:  # its audio task has closed its audio already: the error goes out now
            await self._error(text, err.code, logging.DEBUG)

    def busy(self) -> bool:
        """True while the server owes this client audio (text in, audio not all sent)."""
        return any(stream is not self._stream for stream in self._streams)

    def close(self, abort: bool = False) -> None:
        """End the connection: the read loop stops, queued work is dropped. ``abort`` drops
        unsent bytes too (a client that does not read)."""
        self._closing = True
        if abort and self.writer.transport is not None:
            self.writer.transport.abort()
        else:
            self.writer.close()
        with contextlib.suppress(AssertionError):  # already at EOF
            self.reader.feed_eof()

    def dismiss(self, code: str, text: str) -> None:
        """Close an idle connection (nothing owed) with a reason: an ``error`` event with
        ``code`` and ``text``, then EOF, as the WebSocket door's ``idle-timeout`` does; a
        client that is gone or does not read within ``write_timeout`` is closed anyway."""
        if self._closing:
            return
        self._closing = True  # the read loop ends at its next wake-up; ``close`` wakes it

        async def send_then_close() -> None:
            await self._error(text, code, level=logging.DEBUG, what="Closing a Wyoming connection")
            self.close()

        self._dismissal = asyncio.create_task(send_then_close())

    async def _dispatch(self, event: Event) -> None:
        if Describe.is_type(event.type):
            await self._service.catalog.refresh_async()
            # Only voices that can be spoken: not those of a model this GPU cannot hold.
            await self._write(build_info(self._service.speakable_voices(), self._service.backend).event())
        elif SynthesizeStart.is_type(event.type):
            await self._start_stream(event)
        elif SynthesizeChunk.is_type(event.type):
            if self._stream is None:
                if not self._stream_refused:
                    raise RequestError("synthesize-chunk without synthesize-start")
                return
            text = event.data["text"]
            if not isinstance(text, str):
                raise TypeError("text must be a string")
            try:
                self._stream.add_text(text)
            except RequestError as err:
                await self._refuse_stream(err, str(err))
                return
        elif SynthesizeStop.is_type(event.type):
            await self._stop_stream()
        elif Synthesize.is_type(event.type):
            if self._stream is not None or self._stream_refused:
                return  # the compatibility copy of a streamed text: already being spoken
            await self._synthesize(event, time.perf_counter())
        else:
            _LOGGER.debug("Ignoring event type %s", event.type)

    def _request(self, data: dict[str, Any]) -> SpeechRequest:
        voice = data.get("voice") or {}
        if not isinstance(voice, dict):
            raise TypeError("voice must be an object")
        # Read the raw dict: SynthesizeVoice drops language when name is set.
        name, language = voice.get("name"), voice.get("language")
        for key, value in (("name", name), ("language", language)):
            if value is not None and not isinstance(value, str):
                raise TypeError(f"voice.{key} must be a string")
        return SpeechRequest(voice=name or None, language=language or None)

    async def _synthesize(self, event: Event, arrived: float) -> None:
        """``synthesize``: speak its text; ``arrived``: ``time.perf_counter()`` when it was handled.

        A text with nothing speakable (only punctuation, emoji or markup: ``service.check_text``)
        is answered as the streamed text's is and as wyoming-piper answers it: ``audio-start``
        and ``audio-stop`` with no audio between, no ``error``. Home Assistant reads a
        ``synthesize`` reply up to ``audio-stop`` with no timeout and skips ``error`` events
        there, so an error alone would leave it waiting. A blank text (no text at all) is
        answered the same way.

        For the same reason a refused ``synthesize`` gets its ``error``, then the connection
        ends (``_refuse``).

        Raises:
            RequestError: the request is refused (answered by ``handle_event``).
            KeyError, TypeError: a field is missing or has the wrong type (answered as a
                malformed event).
        """
        await self._service.catalog.refresh_async()  # new clips read off the loop
        text = event.data["text"]
        if not isinstance(text, str):
            raise TypeError("text must be a string")
        request = self._request(event.data)
        try:
            stream = self._service.speak(request, text, arrived)
        except EmptyTextError:
            stream = self._service.open(request, streamed=False)  # the voice is still checked
            stream.add_text(text, arrived)  # (no segment: nothing is generated)
            stream.finish()
        self._speak(stream)

    async def _start_stream(self, event: Event) -> None:
        """``synthesize-start``. A refused start (unknown voice, a malformed ``voice``...)
        still opens the stream's place: its chunks are dropped quietly and its
        ``synthesize-stop`` gets ``synthesize-stopped``, so a client waiting for that is not
        left hanging and its chunks are not each answered with an error.

        Raises:
            RequestError: the start is refused (answered with ``error`` by ``handle_event``).
            TypeError: a field has the wrong type (answered as a malformed event).
        """
        if self._stream is not None:
            raise RequestError("synthesize-start while a stream is already open")
        self._stream_refused = False
        await self._service.catalog.refresh_async()  # new clips read off the loop
        try:
            self._stream = self._service.open(self._request(event.data))
        except (RequestError, TypeError, ValueError, AttributeError):
            self._stream_refused = True
            raise
        self._speak(self._stream, text_stream=True)

    async def _stop_stream(self) -> None:
        if self._stream is None and not self._stream_refused:
            raise RequestError("synthesize-stop without synthesize-start")
        if self._stream is not None:
            self._stream.finish()
        # After the stream's audio (or at once for a refused stream); always sent.
        self._chain(self._write_quietly(SynthesizeStopped().event()))
        self._stream, self._stream_refused = None, False

    def _speak(self, stream: SpeechStream, text_stream: bool = False) -> None:
        """Queue the task that writes this stream's audio after earlier replies; a
        ``synthesize-start`` text stream's (``text_stream``) ``audio-start`` waits for its
        first audio (``_write_audio``)."""
        self._streams.add(stream)
        self._chain(self._write_audio(stream, eager_start=not text_stream))

    def _chain(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` after the previous reply's task, whatever that one's outcome."""
        previous = self._tail

        async def after_previous() -> None:
            if previous is not None:
                await asyncio.wait([previous])  # never raises the previous task's error
            await work

        self._tail = asyncio.create_task(after_previous())
        # Cancelled before our turn (disconnect): ``work`` never started; close it quietly.
        self._tail.add_done_callback(lambda _task: work.close())

    async def _write_audio(self, stream: SpeechStream, eager_start: bool = True) -> None:
        """Write ``stream``'s reply: ``audio-start``, the audio, then ``audio-stop``.
        ``audio-start`` goes out at once for an accepted ``synthesize`` (``eager_start``: the
        client knows its request was taken, not refused as ``overloaded``), and with its first
        audio for a text stream, which a later chunk can still refuse. A text with nothing
        speakable gets ``audio-start`` and ``audio-stop`` alone; a failed or cut one gets
        ``audio-start`` (if not sent yet), ``error``, ``audio-stop``. A refused text stream
        (``_refuse_stream``) gets its ``error``, then ``audio-stop`` only if its
        ``audio-start`` was sent: an ``audio-stop`` closes a sent ``audio-start``, and none is
        sent empty for a refusal."""
        started = False

        async def start() -> None:
            nonlocal started
            if not started:
                await self._write(AudioStart(**_FORMAT).event())
                started = True

        try:
            if eager_start:
                await start()
            try:
                async for chunk in stream:
                    if stream in self._refusals:
                        break  # refused: none of its audio after the error
                    await start()
                    await self._write(AudioChunk(audio=to_pcm16(chunk), **_FORMAT).event())
                    stream.wrote()
            except GenerationError as err:
                await start()
                await self._error(f"Speech generation failed: {err}", "generation-failed")
            except ServerStoppingError as err:
                # Error first: a client that stops at audio-stop must not take the cut
                # audio for the whole. Then audio-stop closes the audio, then the connection.
                await start()
                await self._error(f"{err}; the audio is incomplete", err.code, what="Request cut")
                await self._write(AudioStop().event())
                self.close()
                return
            refusal = self._refusals.pop(stream, None)
            if refusal is not None:
                text, code, level = refusal
                await self._error(text, code, level)
            else:
                await start()
            if started:
                await self._write(AudioStop().event())
        except (ConnectionError, RuntimeError) as err:
            _LOGGER.debug("Client went away while receiving audio: %s", err)
            stream.cancel()
        except Exception:  # noqa: BLE001 - a bug of ours: log it, end this connection only
            _LOGGER.exception("Sending audio failed; closing the connection")
            stream.cancel()
            self.close(abort=True)
        finally:
            self._streams.discard(stream)
            self._refusals.pop(stream, None)

    async def _error(self, text: str, code: str, level: int = logging.INFO, what: str = "Refused request") -> None:
        """Send an ``error`` event (``code``: its machine-readable kind), logged as ``what``."""
        _LOGGER.log(level, "%s: %s", what, text)
        await self._write_quietly(Error(text=text, code=code).event())

    async def _write_quietly(self, event: Event) -> None:
        """Write, ignoring a client that is already gone."""
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._write(event)

    async def _write(self, event: Event) -> None:
        """Send one event; a client that does not take it within ``write_timeout`` is
        dropped (``_stalled``).

        Raises:
            ConnectionError: the connection is closed, or was dropped now.
        """
        async with self._write_lock:
            if self.writer.is_closing():
                raise ConnectionResetError("connection closed")
            try:
                await asyncio.wait_for(self.write_event(event), self._limits.write_timeout)
            except asyncio.TimeoutError:
                self._stalled()
                raise ConnectionResetError("client stopped reading") from None
        self.last_active = time.monotonic()

    def _stalled(self) -> None:
        streams = len(self._streams)
        _LOGGER.info(
            "Wyoming client stopped reading for %g s: dropping its connection and %d stream(s)",
            self._limits.write_timeout, streams,
        )
        for stream in list(self._streams):
            stream.cancel()
        self.close(abort=True)

    async def disconnect(self) -> None:
        """Drop this client's queued and running work (within one chunk)."""
        for stream in list(self._streams):
            stream.cancel()
        if self._tail is not None and not self._tail.done():
            self._tail.cancel()


class Connections:
    """The open Wyoming connections, and the ``AsyncServer`` handler factory.

    Admits new connections within ``limits.max_connections`` (closing the longest-idle one
    to make room), closes connections idle for ``limits.idle_timeout``, and ends them all on
    shutdown.

    Args:
        service: the shared speech service.
        limits: the door's limits.
    """

    def __init__(self, service: TtsService, limits: WyomingLimits | None = None) -> None:
        self.service = service
        self.limits = limits or WyomingLimits()
        self._handlers: set[Qwen3TtsEventHandler] = set()
        self._accepting = True
        self._sweeper: asyncio.Task[None] | None = None

    def __call__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> Qwen3TtsEventHandler:
        return Qwen3TtsEventHandler(self, reader, writer)

    def __len__(self) -> int:
        return len(self._handlers)

    def admit(self, handler: Qwen3TtsEventHandler) -> RequestError | None:
        """Register a new connection; the refusal to send it, or None when admitted."""
        if not self._accepting:
            return ServerStoppingError("The server is shutting down")
        if len(self._handlers) >= self.limits.max_connections:
            now = time.monotonic()
            idle = [h for h in self._handlers if h.evictable(now)]
            if not idle:
                return OverloadedError(
                    f"Too many connections ({len(self._handlers)}, all busy); retry in a few seconds"
                )
            oldest = min(idle, key=lambda h: h.last_active)
            _LOGGER.info(
                "%d Wyoming connections open: closing the longest idle (%.0f s) for a new one",
                len(self._handlers), time.monotonic() - oldest.last_active,
            )
            self.remove(oldest)
            oldest.dismiss("evicted", f"Closed to make room for a new connection ({self.limits.max_connections} open, all others busy or idle less long)")
        self._handlers.add(handler)
        if self._sweeper is None:
            self._sweeper = asyncio.create_task(self._sweep(), name="wyoming idle sweeper")
        return None

    def remove(self, handler: Qwen3TtsEventHandler) -> None:
        """Forget a connection (it closed)."""
        self._handlers.discard(handler)

    async def _sweep(self) -> None:
        """Close connections idle for ``idle_timeout`` (checked every quarter of it)."""
        period = max(0.1, min(5.0, self.limits.idle_timeout / 4))
        while True:
            await asyncio.sleep(period)
            now = time.monotonic()
            for handler in list(self._handlers):
                if not handler.busy() and now - handler.last_active > self.limits.idle_timeout:
                    _LOGGER.debug("Closing a Wyoming connection idle for %.0f s", now - handler.last_active)
                    self.remove(handler)
                    handler.dismiss(
                        "idle-timeout", f"Closed after {self.limits.idle_timeout:g} s with no event and no audio owed"
                    )

    async def shutdown(self, timeout: float) -> None:
        """Refuse new connections, give the open ones up to ``timeout`` seconds to send
        their last events (call after ``TtsService.shutdown``), then close them all: one that
        owes nothing is told why first (``error`` ``server-stopping``, then EOF)."""
        self._accepting = False
        tails = [h._tail for h in self._handlers if h._tail is not None and not h._tail.done()]
        if tails:
            await asyncio.wait(tails, timeout=timeout)
        dismissals = []
        for handler in list(self._handlers):
            self.remove(handler)
            if handler._tail is not None and not handler._tail.done():
                handler.close(abort=True)  # a client that did not take its last events in time
            else:  # owes nothing (a cut reply has closed already): told why, as on the idle timeout
                handler.dismiss(ServerStoppingError.code, "The server is shutting down")
                if handler._dismissal is not None:
                    dismissals.append(handler._dismissal)
        if dismissals:
            await asyncio.wait(dismissals, timeout=max(0.5, min(timeout, self.limits.write_timeout)))
        if self._sweeper is not None:
            self._sweeper.cancel()
