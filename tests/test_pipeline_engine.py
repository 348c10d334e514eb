"""The pipeline engine (``--engine pipeline``, ``engine.cpu.pipeline``): codec frames generated
on one thread by our ggml graphs (``native.GgmlFrameSource``, Q8_0 GGUF converted from the
checkpoint), decoded on another by ONNX Runtime. Loaded through the real loader on the
``--size ggml`` checkpoints; in process, then over the server's doors (every voice kind). One
data folder a module holds the conversions and the codec's export (``pipeline_data_dir``)."""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest
import torch

from wyoming_qwen3tts.common.audio import SAMPLES_PER_FRAME
from wyoming_qwen3tts.common.vocabulary import ModelKind, Reference
from wyoming_qwen3tts.engine import Segment, Work, load_engine, loader
from wyoming_qwen3tts.engine.cpu.pipeline import PipelineEngine

from .conftest import CLONE_TRANSCRIPT, Server, chunk_times_at_once, start_server, stop_server
from .engine_driver import Collect, Source
from .test_quiet_start import NOISE

#: Largest sample difference allowed from the library's whole-sequence decode of the same codes.
TOLERANCE = 1e-4
TEXT = "Hello there, this is a streamed sentence."


@dataclass
class Timed(Collect):
    """A sink that also notes when each chunk came (``time.monotonic()``)."""

    times: list[float] = field(default_factory=list)

    def audio(self, chunk: np.ndarray) -> None:
        self.times.append(time.monotonic())
        super().audio(chunk)


@dataclass
class Served:
    """A running pipeline engine and the work source it serves."""

    engine: PipelineEngine
    source: Source


@pytest.fixture(scope="module")
def pipeline_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The module's data folder: GGUF conversions and the exported codec, made at the first load."""
    return tmp_path_factory.mktemp("pipeline-data")


@pytest.fixture(scope="module")
def checkpoints() -> Path:
    """The ``--size ggml`` checkpoints (the released codec's widths: the wheel extracts clone clips)."""
    from wyoming_qwen3tts.testing.checkpoint import build_all

    from .test_ggml import GGML_CHECKPOINTS

    build_all(GGML_CHECKPOINTS, "ggml")
    return GGML_CHECKPOINTS


@pytest.fixture(scope="module")
def engines(checkpoints: Path, pipeline_data_dir: Path) -> Iterator[dict[ModelKind, Served]]:
    """A served pipeline engine per model kind, 2 frames a chunk, warmed up."""
    torch.set_num_threads(1)
    served: dict[ModelKind, Served] = {}
    for kind in (ModelKind.CUSTOM_VOICE, ModelKind.BASE):
        engine = load_engine(kind, checkpoints / kind.value, "cpu", 2, engine="pipeline", data_dir=pipeline_data_dir,
                             ggml_icl=True)
        assert isinstance(engine, PipelineEngine)
        engine.warm(Segment("Warm.", "english", 2, seed=0, speaker="ryan" if kind is ModelKind.CUSTOM_VOICE else None,
                            reference=_clone(None) if kind is ModelKind.BASE else None))
        served[kind] = Served(engine, Source())
        engine.start(served[kind].source)
    yield served
    for item in served.values():
        item.source.stop.set()
        item.engine.join(10)


@pytest.fixture(scope="module")
def decoder(checkpoints: Path) -> torch.nn.Module:
    from qwen_tts import Qwen3TTSModel

    qwen = Qwen3TTSModel.from_pretrained(str(checkpoints / "base"), device_map="cpu", dtype=torch.float32)
    return qwen.model.speech_tokenizer.model.decoder


def _clone(transcript: str | None) -> Reference:
    t = np.arange(2 * 24000) / 24000
    return Reference.from_audio((0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000, transcript)


def _serve(served: Served, *segments: Segment, timeout: float = 120) -> list[Timed]:
    """Give ``segments`` to the running engine at once; their sinks once all ended."""
    sinks = [Timed() for _ in segments]
    for segment, sink in zip(segments, sinks, strict=True):
        served.source.items.put(Work(segment, sink))
    _wait(sinks, timeout)
    return sinks


def _wait(sinks: list[Timed], timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not all(s.finished for s in sinks):
        assert time.monotonic() < deadline, "the engine did not finish"
        time.sleep(0.01)


def _codes(engine: PipelineEngine, segment: Segment) -> np.ndarray:
    """The codes the engine's source makes for ``segment`` (its sampling is a pure function of
    the seed): int64 [frames, 16]."""
    return np.stack(list(engine.source.frames(segment, lambda: False)))


def _decoded(decoder: torch.nn.Module, codes: np.ndarray) -> np.ndarray:
    """The library's whole-sequence decode of ``codes`` int64 [frames, 16]: float32 [frames * 1920]."""
    with torch.inference_mode():
        return decoder(torch.from_numpy(codes.T[None].copy()))[0, 0].numpy()


def test_a_stream_is_its_frames_decoded_in_chunks(engines: dict[ModelKind, Served], decoder: torch.nn.Module) -> None:
    """The audio is the source's codes for the segment decoded by the library's decoder, to
    float rounding, in chunks of 2 frames; ``done`` counts the frames."""
    served = engines[ModelKind.CUSTOM_VOICE]
    engine = served.engine
    segment = Segment(TEXT, "english", max_new_tokens=23, min_new_tokens=23, seed=11, speaker="ryan")
    (sink,) = _serve(served, segment)
    assert sink.error is None and sink.frames == 23
    assert [len(c) // SAMPLES_PER_FRAME for c in sink.chunks] == [2] * 11 + [1]
    whole = _decoded(decoder, _codes(engine, segment))
    assert sink.pcm.shape == whole.shape
    assert np.abs(sink.pcm - whole).max() < TOLERANCE < np.abs(whole).max()


@pytest.mark.full
def test_two_streams_are_heard_at_once_each_as_if_alone(engines: dict[ModelKind, Served]) -> None:
    """A second client arriving while a long reply streams hears its first audio long before
    that reply ends, within twice the first client's wait (issue 50 item 4); each stream's
    audio is what it is alone, byte for byte (its sampling depends on its seed only)."""
    served = engines[ModelKind.CUSTOM_VOICE]
    engine = served.engine
    long = Segment(TEXT, "english", max_new_tokens=150, min_new_tokens=150, seed=1, speaker="ryan")
    short = Segment("Welcome home.", "english", max_new_tokens=30, min_new_tokens=30, seed=2, speaker="serena")
    (alone_long,) = _serve(served, long)
    (alone_short,) = _serve(served, short)
    first, second = Timed(), Timed()
    asked = time.monotonic()
    served.source.items.put(Work(long, first))
    while len(first.chunks) < 2:
        time.sleep(0.005)
    second_asked = time.monotonic()
    served.source.items.put(Work(short, second))
    _wait([first, second])
    assert np.array_equal(first.pcm, alone_long.pcm) and np.array_equal(second.pcm, alone_short.pcm)
    assert second.times[0] < first.times[-1] and second.times[-1] < first.times[-1]
    waited, first_wait = second.times[0] - second_asked, first.times[0] - asked
    assert waited <= 2 * first_wait + 0.5, (waited, first_wait)


@pytest.mark.full
def test_a_client_that_leaves_stops_generation_within_a_frame(engines: dict[ModelKind, Served]) -> None:
    """Cancelled at its first chunk (by the sink, as the codec thread delivers it), a 400-frame
    segment makes at most one more frame than it had (the one in progress, and one the
    generation thread may have begun as the flag was set), its undecoded frames are dropped,
    ``done`` says what was delivered; the engine then serves the next request. (How far
    generation ran ahead of the codec by then depends on the machine's load: the codec's
    first frames at the released widths take longer than many tiny-talker frames.)"""
    served = engines[ModelKind.CUSTOM_VOICE]
    engine = served.engine
    made: list[int] = [0]
    frames = engine.source.frames

    def counted(segment: Segment, cancelled):  # type: ignore[no-untyped-def]
        for codes in frames(segment, cancelled):
            made[0] += 1
            yield codes

    engine.source.frames = counted  # type: ignore[method-assign]
    try:
        at_cancel: list[int] = []

        class Leaving(Timed):
            def audio(self, chunk: np.ndarray) -> None:
                super().audio(chunk)
                if not at_cancel:
                    at_cancel.append(made[0])
                    self.cancel = True

        sink = Leaving()
        served.source.items.put(Work(Segment(TEXT, "english", 400, 400, seed=3, speaker="ryan"), sink))
        _wait([sink])
        assert made[0] <= at_cancel[0] + 2 < 400, (at_cancel, made[0])
        assert sink.error is None and sink.frames == sum(len(c) for c in sink.chunks) // SAMPLES_PER_FRAME
        assert len(sink.chunks) == 1 and sink.frames == 2  # the frames generated after it were dropped
    finally:
        engine.source.frames = frames  # type: ignore[method-assign]
    (after,) = _serve(served, Segment("Next.", "english", 6, 6, seed=4, speaker="ryan"))
    assert after.frames == 6


@pytest.mark.full
def test_an_in_context_clone_decodes_after_its_reference_codes(
    engines: dict[ModelKind, Served], decoder: torch.nn.Module
) -> None:
    """A clone with a transcript (ICL): the codec's past is the clip's codes, as qwen_tts
    decodes them before the new frames; by x-vector: no past."""
    served = engines[ModelKind.BASE]
    engine = served.engine
    for transcript in (CLONE_TRANSCRIPT, None):
        reference = _clone(transcript)
        segment = Segment(TEXT, "english", 10, 10, seed=5, reference=reference)
        (sink,) = _serve(served, segment)
        context = engine.source.decoder_context(reference)
        assert (context is None) == (transcript is None)
        codes = _codes(engine, segment)
        whole = _decoded(decoder, codes if context is None else np.concatenate([context, codes]))
        assert sink.error is None and np.abs(sink.pcm - whole[-len(codes) * SAMPLES_PER_FRAME :]).max() < TOLERANCE


@pytest.mark.full
def test_a_request_the_model_refuses_fails_alone(engines: dict[ModelKind, Served]) -> None:
    """An unknown speaker fails that request with the model's reason; the engine serves on."""
    served = engines[ModelKind.CUSTOM_VOICE]
    engine = served.engine
    bad, good = _serve(served, Segment(TEXT, "english", 6, seed=1, speaker="nobody"),
                       Segment(TEXT, "english", 6, 6, seed=1, speaker="ryan"))
    assert bad.error is not None and "nobody" in str(bad.error) and not bad.chunks
    assert good.error is None and good.frames == 6


def _clear_picks() -> None:
    for cached in (loader._auto_engine, loader._pipeline_engine, loader._wheel_or_reference):
        cached.cache_clear()


@pytest.mark.parametrize("wheel, fallback", [(True, "ggml"), (False, "reference")])
def test_auto_picks_the_pipeline_engine_and_falls_back_saying_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, wheel: bool, fallback: str
) -> None:
    """``auto`` on the CPU (and ``--engine pipeline``) is the pipeline engine where the real
    check passes here; where it fails (the native api refused), the wheel's engine, else the
    reference, with one line saying why."""
    from wyoming_qwen3tts.engine.cpu import ggml, pipeline_load

    _clear_picks()
    try:
        assert pipeline_load.pipeline_support()[0]  # the real check: the wheel's ggml and ONNX Runtime here
        assert loader.pick_engine("auto", "cpu") == "pipeline"
        assert loader.pick_engine("pipeline", "cuda") == "pipeline"  # the CPU's, whatever the device
        _clear_picks()
        monkeypatch.setattr(pipeline_load, "pipeline_support", lambda: (False, "our ggml generation graphs cannot run: test"))
        monkeypatch.setattr(ggml, "native_support", lambda: (wheel, "qwentts.cpp test" if wheel else "no wheel here"))
        with caplog.at_level(logging.INFO, logger="wyoming_qwen3tts.engine.loader"):
            assert loader.pick_engine("pipeline", "cpu") == fallback
            assert loader.pick_engine("auto", "cpu") == fallback
        lines = [r.getMessage() for r in caplog.records if "pipeline engine cannot run" in r.getMessage()]
        assert lines == [f"The pipeline engine cannot run here (our ggml generation graphs cannot run: test): the CPU "
                         f"falls back to the {fallback} engine"]
    finally:
        _clear_picks()


def test_the_native_check_refusing_gives_its_reason(monkeypatch: pytest.MonkeyPatch) -> None:
    """``pipeline_support`` says why the wheel's ggml was refused (``native.api.GgmlApiError``)."""
    from wyoming_qwen3tts.engine.cpu import pipeline_load
    from wyoming_qwen3tts.engine.cpu.native import api

    def refuse() -> api.Ggml:
        raise api.GgmlApiError("libggml-base.so.0 lacks ggml_rope_multi")

    monkeypatch.setattr(api, "load", refuse)
    assert pipeline_load.pipeline_support() == (False, "our ggml generation graphs cannot run: libggml-base.so.0 lacks ggml_rope_multi")


# --- over the server's doors ------------------------------------------------------------


@pytest.fixture(scope="module")
def pipeline_server(checkpoints: Path, voices_dir: Path, pipeline_data_dir: Path, engines: dict[ModelKind, Served],
                tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The server with ``--engine auto`` (the pipeline engine here) on the ``--size ggml``
    checkpoints (every kind), clones in context, the module's data folder holding the GGUF
    conversions and the exported codec already (the in-process engines made them)."""
    folder = tmp_path_factory.mktemp("server-pipeline")
    srv = start_server(
        checkpoints, voices_dir, folder / "server.log", engine="auto",
        extra=["--no-zeroconf", "--anchors", "off", "--voice", "clone", "--ggml-icl",
               "--data-dir", str(pipeline_data_dir)],
    )
    yield srv
    stop_server(srv)


def test_both_doors_speak_a_seed_replays_and_a_client_may_leave(pipeline_server: Server) -> None:
    import openai
    from wyoming.audio import AudioChunk, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    start = pipeline_server.output()[: pipeline_server.output().index("Ready: Wyoming")]
    assert "Engine on the CPU: pipeline" in start
    assert re.search(r"CPU pipeline engine, custom_voice model: \d threads? generating, \d decoding audio \(\d+ cores?", start)
    assert "Exporting" not in start  # the module's codec export, found in the data folder (VoiceDesign is converted here)
    assert "import torch" not in start
    assert [noise for noise in NOISE if noise in start] == [], start[:3000]

    async def wyoming(voice: str) -> list[int]:
        sizes: list[int] = []
        async with AsyncTcpClient("127.0.0.1", pipeline_server.port) as client:
            await client.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice(name=voice)).event())
            while True:
                event = await asyncio.wait_for(client.read_event(), timeout=120)
                assert event is not None
                if AudioChunk.is_type(event.type):
                    sizes.append(len(AudioChunk.from_event(event).audio))
                if AudioStop.is_type(event.type):
                    return sizes

    for voice in ("ryan", "clone", "xvec"):
        sizes = asyncio.run(wyoming(voice))
        assert len(sizes) >= 2 and sum(sizes) > 0, voice
    client = openai.OpenAI(base_url=f"{pipeline_server.http_url}/v1", api_key="unused")

    def speak(seed: int) -> bytes:
        return client.audio.speech.create(
            model="tts-1", voice="ryan", input=TEXT, response_format="pcm", extra_body={"seed": seed}
        ).read()

    assert speak(5) == speak(5) != speak(6)
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="ryan", input=TEXT * 6, response_format="pcm"
    ) as response:
        next(response.iter_bytes(4096))
    deadline = time.monotonic() + 60
    while "request cancelled" not in pipeline_server.output() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "request cancelled" in pipeline_server.output()
    assert len(speak(5)) > 0 and pipeline_server.alive()


@pytest.mark.full
def test_two_clients_of_one_model_are_heard_at_once(pipeline_server: Server) -> None:
    """A Wyoming client and an OpenAI client ask the same model for one long sentence each,
    at once: each hears its first audio before the other's reply ends."""
    text = "Welcome home, the door is locked and the lights are off for the night"
    w, o = chunk_times_at_once(pipeline_server, text)
    assert len(w) >= 2 and len(o) >= 2
    assert w[0] < o[-1] and o[0] < w[-1], (w[0], w[-1], o[0], o[-1])


def _wyoming_pcm(server: Server, voice: str, text: str = TEXT) -> np.ndarray:
    """One Wyoming ``synthesize`` of ``text`` in ``voice``: its audio, int16 [n_samples] at 24 kHz."""
    from wyoming.audio import AudioChunk, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    async def run() -> bytes:
        audio = b""
        async with AsyncTcpClient("127.0.0.1", server.port) as client:
            await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=voice)).event())
            while True:
                event = await asyncio.wait_for(client.read_event(), timeout=120)
                assert event is not None and event.type != "error", event
                if AudioChunk.is_type(event.type):
                    audio += AudioChunk.from_event(event).audio
                if AudioStop.is_type(event.type):
                    return audio

    return np.frombuffer(asyncio.run(run()), dtype=np.int16)


def _heard(pcm: np.ndarray) -> bool:
    """Audio decoded, not silence: a second or more, most samples non-zero."""
    return len(pcm) >= 24000 and np.count_nonzero(pcm) > len(pcm) // 2


@pytest.mark.full
def test_a_designed_voice_speaks_over_both_doors(pipeline_server: Server) -> None:
    """The VoiceDesign model on the pipeline engine: a preset over Wyoming (designed live, the
    server runs ``--anchors off``) and ``instructions`` with no voice over HTTP (``X-Voice:
    (designed)``) both come back as decoded audio, not silence."""
    import json
    import urllib.request

    preset = _wyoming_pcm(pipeline_server, "aria")
    assert _heard(preset), (len(preset), np.count_nonzero(preset))
    body = {"model": "qwen3-tts-voice-design", "input": TEXT, "instructions": "A child's bright voice.",
            "response_format": "pcm", "seed": 3}
    request = urllib.request.Request(f"{pipeline_server.http_url}/v1/audio/speech", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        assert response.headers["X-Voice"] == "(designed)"
        designed = np.frombuffer(response.read(), dtype=np.int16)
    assert _heard(designed), (len(designed), np.count_nonzero(designed))
    assert pipeline_server.alive()


@pytest.mark.full
def test_a_wyoming_client_that_leaves_mid_stream_is_cancelled_and_the_next_is_served(pipeline_server: Server) -> None:
    """A Wyoming client that disconnects after its first audio chunk of a long reply: its
    request ends ``cancelled`` (the door's metric and its line), and the next client is
    served in full. (That the engine stops within a frame:
    ``test_a_client_that_leaves_stops_generation_within_a_frame``.)"""
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    from .test_wyoming import wyoming_metric

    cancelled = wyoming_metric(pipeline_server, "tts_requests_total", "cancelled")
    stopped = pipeline_server.output().count("wyoming request cancelled: voice ryan")

    async def leave() -> None:
        client = AsyncTcpClient("127.0.0.1", pipeline_server.port)
        await client.connect()
        await client.write_event(Synthesize(text=TEXT * 6, voice=SynthesizeVoice(name="ryan")).event())
        while True:
            event = await asyncio.wait_for(client.read_event(), timeout=120)
            assert event is not None and event.type != "audio-stop", event
            if event.type == "audio-chunk":
                break
        await client.disconnect()

    asyncio.run(leave())
    deadline = time.monotonic() + 60
    while (wyoming_metric(pipeline_server, "tts_requests_total", "cancelled") == cancelled
           or pipeline_server.output().count("wyoming request cancelled: voice ryan") == stopped) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert wyoming_metric(pipeline_server, "tts_requests_total", "cancelled") == cancelled + 1
    assert pipeline_server.output().count("wyoming request cancelled: voice ryan") == stopped + 1, pipeline_server.output()[-3000:]
    assert _heard(_wyoming_pcm(pipeline_server, "ryan")) and pipeline_server.alive()
