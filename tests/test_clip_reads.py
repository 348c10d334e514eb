"""New clone clips are read on a worker thread, never on the event loop.

A new-user trial copied 20 clips of 30 s into the voices folder while another client
streamed: the catalogue read them on the event loop (about 40 ms each), the loop stalled
1.64 s and that client's audio had a 1.9 s gap. Now the doors and the clip preparer await
``VoiceCatalog.refresh_async``, which reads new clips on a worker thread, and the lookup's
own ``refresh(wait=False)`` finds nothing left to read and never waits for another
thread's reads.

These tests record on which thread each clip is read (``voices.load_reference``, the catalogue's
one read of a clip), through the real catalogue, the real ``TtsService`` and the real
Wyoming and HTTP doors (the ``wyoming`` package's client; aiohttp's), on a stand-in engine.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
import soundfile as sf
from aiohttp.test_utils import TestClient, TestServer
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import Synthesize, SynthesizeVoice

from wyoming_qwen3tts.service.clips import ClipPreparer
from wyoming_qwen3tts.engine import Engine
from wyoming_qwen3tts.doors.wyoming.handler import Connections, WyomingLimits
from wyoming_qwen3tts.doors.http.api import create_app
from wyoming_qwen3tts.common.metrics import Metrics
from wyoming_qwen3tts.service.speech import TtsService
from wyoming_qwen3tts.common.vocabulary import ModelKind, Reference
from wyoming_qwen3tts.catalogue import voices as voices_module
from wyoming_qwen3tts.catalogue.voices import VoiceCatalog

from .stub_service import StubEngine


def _write_clip(folder: Path, name: str, freq: float = 190.0) -> None:
    """A 1 s voiced-looking tone and its transcript."""
    t = np.arange(24000) / 24000
    sf.write(folder / f"{name}.wav", (0.3 * np.sin(2 * np.pi * freq * t)).astype(np.float32), 24000)
    (folder / f"{name}.txt").write_text("Hello there, this is a clip.")


@pytest.fixture
def reads(monkeypatch: pytest.MonkeyPatch) -> Iterator[list[tuple[str, bool]]]:
    """Every clip read as (stem, whether on the main thread, where the tests' loop runs)."""
    seen: list[tuple[str, bool]] = []
    original = voices_module.load_reference

    def recording(path: Path, transcript: Path | None = None) -> Reference:
        seen.append((path.stem, threading.current_thread() is threading.main_thread()))
        return original(path, transcript)

    monkeypatch.setattr(voices_module, "load_reference", recording)
    yield seen


async def test_refresh_async_reads_new_clips_on_a_worker_thread(tmp_path: Path, reads: list[tuple[str, bool]]) -> None:
    """``stale`` sees a new or changed clip; ``refresh_async`` reads it off the loop's thread
    and only it; an unchanged folder reads nothing; ``refresh(wait=False)`` returns at once,
    reading nothing, while another refresh holds the catalogue."""
    _write_clip(tmp_path, "ann")
    catalog = VoiceCatalog(tmp_path, {ModelKind.BASE})
    assert reads == [("ann", True)]  # at start: the constructor, before any client
    reads.clear()
    assert not catalog.stale()
    await catalog.refresh_async()
    assert reads == []
    _write_clip(tmp_path, "bob")
    assert catalog.stale()
    await catalog.refresh_async()
    assert reads == [("bob", False)]
    assert not catalog.stale() and catalog.get("bob").reference is not None

    _write_clip(tmp_path, "cy")
    with catalog._lock:  # another thread's refresh under way
        catalog.refresh(wait=False)
    assert reads == [("bob", False)] and catalog.find("cy") is None
    catalog.refresh(wait=False)
    assert catalog.find("cy") is not None


async def test_a_file_the_folder_does_not_read_or_a_better_twin_is_seen_at_once_and_never_opened(
    tmp_path: Path, reads: list[tuple[str, bool]]
) -> None:
    """A MIDI file copied in was no file of the scan: the catalogue was not ``stale`` and the
    file never listed. Now it is seen by ``stale`` and listed in ``skipped`` by the next
    ``refresh_async``, without being opened (its format alone skips it); a WAV copied in
    beside ``ann.mp3`` takes over the voice ``ann`` (lossless before lossy) and is read off
    the loop's thread, once."""
    t = np.arange(int(1.5 * 24000)) / 24000
    sf.write(tmp_path / "ann.mp3", (0.3 * np.sin(2 * np.pi * 190 * t)).astype(np.float32), 24000, format="MP3")
    catalog = VoiceCatalog(tmp_path, {ModelKind.BASE})
    reads.clear()
    (tmp_path / "song.mid").write_bytes(b"MThd\0\0\0\6\0\0\0\1\0\x60")
    assert catalog.stale()
    await catalog.refresh_async()
    assert reads == [] and [clip.file for clip in catalog.skipped()] == ["song.mid"]
    _write_clip(tmp_path, "ann")
    await catalog.refresh_async()
    assert reads == [("ann", False)] and [clip.file for clip in catalog.skipped()] == ["ann.mp3", "song.mid"]
    reference = catalog.get("ann").reference
    assert reference is not None and reference.transcript == "Hello there, this is a clip."


async def test_a_lookup_during_another_threads_reads_waits_for_them_off_the_loop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """While the clip preparer's refresh reads a new clip on its thread, the catalogue stays
    ``stale``, so a door's ``refresh_async`` waits for those reads (on a worker thread) and
    then finds the clip, instead of answering from the catalogue as it was (unknown voice);
    the loop is free meanwhile."""
    _write_clip(tmp_path, "ann")
    catalog = VoiceCatalog(tmp_path, {ModelKind.BASE})
    started, release = threading.Event(), threading.Event()
    original = voices_module.load_reference

    def slow(path: Path, transcript: Path | None = None) -> Reference:
        started.set()
        assert release.wait(10)
        return original(path, transcript)

    monkeypatch.setattr(voices_module, "load_reference", slow)
    _write_clip(tmp_path, "newcomer")
    preparer = asyncio.create_task(catalog.refresh_async())
    assert await asyncio.to_thread(started.wait, 10)
    assert catalog.stale()  # the reads are under way
    door = asyncio.create_task(catalog.refresh_async())
    await asyncio.sleep(0.05)  # the loop runs on while both wait
    assert not door.done()
    catalog.refresh(wait=False)  # the lookup's own refresh: returns at once
    release.set()
    await asyncio.wait_for(asyncio.gather(preparer, door), 10)
    assert catalog.get("newcomer").reference is not None and not catalog.stale()


def _service(folder: Path) -> TtsService:
    engines: dict[ModelKind, Engine] = {ModelKind.BASE: StubEngine(ModelKind.BASE, frames=2)}
    for engine in engines.values():
        engine.ready.set()
    return TtsService(VoiceCatalog(folder, set(engines)), engines, "ann", Metrics())


async def test_the_wyoming_door_reads_a_new_clip_off_the_loop(tmp_path: Path, reads: list[tuple[str, bool]]) -> None:
    """A clip copied in after start, then asked for by ``synthesize`` over Wyoming: spoken,
    and read on a worker thread. ``describe`` lists the next one, read the same way."""
    _write_clip(tmp_path, "ann")
    service = _service(tmp_path)
    connections = Connections(service, WyomingLimits(write_timeout=5, idle_timeout=60))

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await connections(reader, writer).run()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reads.clear()
        _write_clip(tmp_path, "newcomer", freq=240.0)
        async with AsyncTcpClient("127.0.0.1", port) as client:
            await client.write_event(Synthesize("Hello.", voice=SynthesizeVoice(name="newcomer")).event())
            chunks = 0
            while True:
                event = await asyncio.wait_for(client.read_event(), 30)
                assert event is not None and not Error.is_type(event.type), event
                if AudioChunk.is_type(event.type):
                    chunks += 1
                if AudioStop.is_type(event.type):
                    break
            assert chunks > 0
            _write_clip(tmp_path, "later", freq=280.0)
            from wyoming.info import Describe, Info

            await client.write_event(Describe().event())
            info = Info.from_event(await asyncio.wait_for(client.read_event(), 30))  # type: ignore[arg-type]
            names = {voice.name for program in info.tts for voice in program.voices}
            assert {"ann", "newcomer", "later"} <= names
        assert reads == [("newcomer", False), ("later", False)]
    finally:
        server.close()
        await server.wait_closed()
        await asyncio.to_thread(service.stop, 5.0)


async def test_the_http_door_and_the_clip_preparer_read_new_clips_off_the_loop(
    tmp_path: Path, reads: list[tuple[str, bool]]
) -> None:
    """``POST /v1/audio/speech`` naming a clip copied in after start, ``GET /v1/audio/voices``
    after another, and the clip preparer's look after a third: each read on a worker
    thread."""
    _write_clip(tmp_path, "ann")
    service = _service(tmp_path)
    try:
        async with TestClient(TestServer(create_app(service))) as client:
            reads.clear()
            _write_clip(tmp_path, "newcomer", freq=240.0)
            resp = await client.post(
                "/v1/audio/speech",
                json={"input": "Hello.", "model": "qwen3-tts-clone", "voice": "newcomer", "response_format": "pcm"},
            )
            assert resp.status == 200, await resp.text()
            assert len(await resp.read()) > 0
            _write_clip(tmp_path, "later", freq=280.0)
            resp = await client.get("/v1/audio/voices")
            assert "later" in {v["id"] for v in (await resp.json())["voices"]}
        _write_clip(tmp_path, "third", freq=320.0)
        preparer = ClipPreparer(service._engines[ModelKind.BASE], [], service.catalog.refresh_async)
        await preparer.prepare_new()
        assert service.catalog.find("third") is not None
        assert reads == [("newcomer", False), ("later", False), ("third", False)]
    finally:
        await asyncio.to_thread(service.stop, 5.0)


async def test_a_too_short_clip_is_refused_over_wyoming_until_replaced_with_a_longer_one(
    tmp_path: Path, reads: list[tuple[str, bool]]
) -> None:
    """A 0.5 s clip copied in while the server runs (the studio refuses such an upload): not
    listed by ``describe``, and ``synthesize`` naming it gets an ``error`` saying how long it
    is and what a clip needs; the same file replaced by a 2 s clip (written aside, renamed
    over it) is listed and spoken on the next request, each read on a worker thread."""
    import os

    from wyoming.info import Describe, Info

    _write_clip(tmp_path, "ann")
    service = _service(tmp_path)
    connections = Connections(service, WyomingLimits(write_timeout=5, idle_timeout=60))

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await connections(reader, writer).run()

    def clip(path: Path, seconds: float) -> None:
        t = np.arange(int(seconds * 24000)) / 24000
        sf.write(path, (0.3 * np.sin(2 * np.pi * 230 * t)).astype(np.float32), 24000, format="WAV")

    async def ask(client: AsyncTcpClient) -> tuple[set[str], int, str | None]:
        """The voices ``describe`` lists, then the chunks of ``synthesize`` for kim, or its error."""
        await client.write_event(Describe().event())
        info = Info.from_event(await asyncio.wait_for(client.read_event(), 30))  # type: ignore[arg-type]
        names = {voice.name for program in info.tts for voice in program.voices}
        await client.write_event(Synthesize("Hello.", voice=SynthesizeVoice(name="kim")).event())
        chunks = 0
        while True:
            event = await asyncio.wait_for(client.read_event(), 30)
            assert event is not None
            if Error.is_type(event.type):
                return names, chunks, Error.from_event(event).text
            if AudioChunk.is_type(event.type):
                chunks += 1
            if AudioStop.is_type(event.type):
                return names, chunks, None

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    port = server.sockets[0].getsockname()[1]
    try:
        reads.clear()
        clip(tmp_path / "kim.wav", 0.5)
        (tmp_path / "kim.txt").write_text("Kim speaking.")
        async with AsyncTcpClient("127.0.0.1", port) as client:  # refused: then the connection ends
            names, chunks, error = await ask(client)
            assert "ann" in names and "kim" not in names and chunks == 0
            assert error is not None and "kim.wav: the clip is 0.50 s long, under the 1 s a clone clip needs" in error, error
        clip(tmp_path / ".kim.wav", 2.0)
        os.replace(tmp_path / ".kim.wav", tmp_path / "kim.wav")
        async with AsyncTcpClient("127.0.0.1", port) as client:
            names, chunks, error = await ask(client)
            assert "kim" in names and error is None and chunks > 0
        assert reads == [("kim", False), ("kim", False)]
    finally:
        server.close()
        await server.wait_closed()
        await asyncio.to_thread(service.stop, 5.0)
