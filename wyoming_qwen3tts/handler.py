"""Wyoming front door: one event handler per connection, on the ``wyoming`` package.

Handles ``describe`` -> ``info``; one-shot ``synthesize``; streamed text
(``synthesize-start`` / ``synthesize-chunk`` / ``synthesize-stop`` -> ``synthesize-stopped``).
Audio goes out as ``audio-start`` / ``audio-chunk`` / ``audio-stop`` in one format (24 kHz,
16-bit, mono) while the model generates. Bad requests get an ``error`` event and the
connection stays usable; unknown event types are ignored.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from collections.abc import Callable, Coroutine
from typing import Any

from wyoming.audio import AudioChunk, AudioStart, AudioStop
from wyoming.error import Error
from wyoming.event import Event, async_read_event
from wyoming.info import Attribution, Describe, Info, TtsProgram, TtsVoice
from wyoming.server import AsyncEventHandler
from wyoming.tts import Synthesize, SynthesizeChunk, SynthesizeStart, SynthesizeStop, SynthesizeStopped

from . import __version__
from .audio import PCM_WIDTH, SAMPLE_RATE, to_pcm16
from .service import GenerationError, RequestError, SpeechRequest, SpeechStream, TtsService
from .voices import ModelKind, Voice

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
        for voice in sorted(voices, key=lambda v: v.name)
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


#: Largest data or payload part a client may announce, in bytes. A TTS request is text:
#: 10,000 characters of JSON stay far below this.
MAX_EVENT_BYTES = 1 << 20


class MalformedEventError(RequestError):
    """Not a usable Wyoming event."""

    code = "malformed-event"


def _oversize(line: bytes) -> str | None:
    """"data_length"/"payload_length" when a header announces more than MAX_EVENT_BYTES."""
    try:
        header = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if isinstance(header, dict):
        for key in ("data_length", "payload_length"):
            size = header.get(key)
            if isinstance(size, int) and size > MAX_EVENT_BYTES:
                return key
    return None


class _ReplayReader:
    """A reader whose first line is one already read: lets ``async_read_event`` parse it."""

    def __init__(self, line: bytes, reader: asyncio.StreamReader) -> None:
        self._line: bytes | None = line
        self._reader = reader

    async def readline(self) -> bytes:
        line, self._line = self._line, None
        return line if line is not None else await self._reader.readline()

    async def readexactly(self, n: int) -> bytes:
        return await self._reader.readexactly(n)


class Qwen3TtsEventHandler(AsyncEventHandler):
    """One client connection.

    Args:
        service: the shared speech service.
        reader, writer: the connection (from ``wyoming.server.AsyncServer``).
    """

    def __init__(self, service: TtsService, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        super().__init__(reader, writer)
        self._service = service
        self._stream: SpeechStream | None = None  # the open synthesize-start stream
        self._stream_refused = False  # its start or text was refused: drop its chunks quietly
        self._streams: set[SpeechStream] = set()  # all streams still producing audio
        self._tail: asyncio.Task[None] | None = None  # last audio task: replies stay in order
        self._write_lock = asyncio.Lock()

    async def run(self) -> None:
        """Read events until EOF. A line that is not an event gets an ``error`` reply; an
        event announcing more than ``MAX_EVENT_BYTES`` of data or payload, or a header line
        over the reader's limit, gets one and the connection is closed (the rest of the
        stream cannot be parsed)."""
        try:
            while True:
                try:
                    line = await self.reader.readline()
                except ValueError:  # line over the reader's limit
                    await self._malformed("Event header line is too long; closing")
                    break
                if not line:
                    break
                too_big = _oversize(line)
                if too_big:
                    await self._malformed(f"Event {too_big} is over {MAX_EVENT_BYTES} bytes; closing")
                    break
                try:
                    event = await async_read_event(_ReplayReader(line, self.reader))  # type: ignore[arg-type]
                except (KeyError, TypeError, AttributeError, json.JSONDecodeError, UnicodeDecodeError):
                    event = None
                if event is None:
                    if self.reader.at_eof() and not line.endswith(b"\n"):
                        break
                    await self._malformed("Malformed event: not a Wyoming event header")
                    continue
                if not await self.handle_event(event):
                    break
        except (ConnectionError, asyncio.IncompleteReadError):
            pass
        finally:
            await self.disconnect()
            self.writer.close()

    async def _malformed(self, text: str) -> None:
        self._service.count_error("wyoming", MalformedEventError(text))
        await self._error(text, MalformedEventError.code)

    async def handle_event(self, event: Event) -> bool:
        """Dispatch one event; always keeps the connection (returns True)."""
        try:
            await self._dispatch(event)
        except RequestError as err:
            self._service.count_error("wyoming", err)
            await self._error(str(err), err.code)
        except (KeyError, TypeError, ValueError, AttributeError) as err:
            detail = f"missing field {err}" if isinstance(err, KeyError) else str(err)
            await self._malformed(f"Malformed {event.type} event: {detail}")
        return True

    async def _dispatch(self, event: Event) -> None:
        if Describe.is_type(event.type):
            self._service.catalog.refresh()
            await self._write(build_info(self._service.catalog.voices(), self._service.backend).event())
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
            except RequestError:
                self._stream.cancel()
                self._stream, self._stream_refused = None, True
                raise
        elif SynthesizeStop.is_type(event.type):
            await self._stop_stream()
        elif Synthesize.is_type(event.type):
            if self._stream is not None or self._stream_refused:
                return  # the compatibility copy of a streamed text: already being spoken
            await self._synthesize(event)
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

    async def _synthesize(self, event: Event) -> None:
        text = event.data["text"]
        if not isinstance(text, str):
            raise TypeError("text must be a string")
        self._speak(self._service.speak(self._request(event.data), text))

    async def _start_stream(self, event: Event) -> None:
        if self._stream is not None:
            raise RequestError("synthesize-start while a stream is already open")
        self._stream_refused = False
        try:
            self._stream = self._service.open(self._request(event.data))
        except RequestError:
            self._stream_refused = True
            raise
        self._speak(self._stream)

    async def _stop_stream(self) -> None:
        if self._stream is None and not self._stream_refused:
            raise RequestError("synthesize-stop without synthesize-start")
        if self._stream is not None:
            self._stream.finish()
        # After the stream's audio (or at once for a refused stream); always sent.
        self._chain(self._write_quietly(SynthesizeStopped().event()))
        self._stream, self._stream_refused = None, False

    def _speak(self, stream: SpeechStream) -> None:
        """Queue the task that writes this stream's audio after earlier replies."""
        self._streams.add(stream)
        self._chain(self._write_audio(stream))

    def _chain(self, work: Coroutine[Any, Any, None]) -> None:
        """Run ``work`` after the previous reply's task, whatever that one's outcome."""
        previous = self._tail

        async def after_previous() -> None:
            try:
                if previous is not None:
                    await asyncio.wait([previous])  # never raises the previous task's error
            except asyncio.CancelledError:
                work.close()  # disconnected before our turn: never started
                raise
            await work

        self._tail = asyncio.create_task(after_previous())

    async def _write_audio(self, stream: SpeechStream) -> None:
        try:
            await self._write(AudioStart(**_FORMAT).event())
            try:
                async for chunk in stream:
                    await self._write(AudioChunk(audio=to_pcm16(chunk), **_FORMAT).event())
            except GenerationError as err:
                await self._error(f"Speech generation failed: {err}", "generation-failed")
            await self._write(AudioStop().event())
        except (ConnectionError, RuntimeError) as err:
            _LOGGER.debug("Client went away while receiving audio: %s", err)
            stream.cancel()
        finally:
            self._streams.discard(stream)

    async def _error(self, text: str, code: str) -> None:
        _LOGGER.info("Refused request: %s", text)
        await self._write_quietly(Error(text=text, code=code).event())

    async def _write_quietly(self, event: Event) -> None:
        """Write, ignoring a client that is already gone."""
        with contextlib.suppress(ConnectionError, RuntimeError):
            await self._write(event)

    async def _write(self, event: Event) -> None:
        async with self._write_lock:
            await self.write_event(event)

    async def disconnect(self) -> None:
        """Drop this client's queued and running work (within one chunk)."""
        for stream in list(self._streams):
            stream.cancel()
        if self._tail is not None and not self._tail.done():
            self._tail.cancel()


def handler_factory(service: TtsService) -> Callable[[asyncio.StreamReader, asyncio.StreamWriter], Qwen3TtsEventHandler]:
    """The ``AsyncServer.run`` argument: a new handler per connection."""
    return lambda reader, writer: Qwen3TtsEventHandler(service, reader, writer)
