"""The OpenAI-compatible HTTP door: the real server process (conftest ``server``), the
official ``openai`` client and raw aiohttp requests; plus in-process tests of the encoders,
the tempo filter, and failures a real model cannot be made to produce on demand.

Random weights never emit EOS, so every segment runs to its frame budget and the audio
length of a request is known in advance (see ``expected_samples``).
"""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import json
import logging
import re
import threading
import time
import urllib.request
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import av
import numpy as np
import openai
import pytest
import soundfile as sf
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer, unused_port
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.tts import Synthesize, SynthesizeVoice

from wyoming_qwen3tts.doors.http.encoders import FORMATS, open_encoder
from wyoming_qwen3tts.common.audio import SAMPLE_RATE, SAMPLES_PER_FRAME
from wyoming_qwen3tts.engine import Engine, Segment
from wyoming_qwen3tts.engine.serial import SerialEngine
from wyoming_qwen3tts.doors.http.api import _SERVICE_KEY, create_app, start_http
from wyoming_qwen3tts.common.metrics import Metrics
from wyoming_qwen3tts.service.speech import TtsService
from wyoming_qwen3tts.doors.http.tempo import Tempo, stage_factors
from wyoming_qwen3tts.text.segmenter import Segmenter, frame_budget
from wyoming_qwen3tts.common.vocabulary import ModelKind
from wyoming_qwen3tts.catalogue.voices import VoiceCatalog

from .conftest import Server, start_server, stop_server

#: Short text: one segment, a second or two of CPU time per request.
TEXT = "Hi"
#: A hang guard for whole requests, not a speed assertion.
_GUARD = aiohttp.ClientTimeout(total=300)
API_KEY = "test-key-123"
#: Samples a lossy codec may add (encoder delay and last-frame padding: mp3 ~1350, aac ~1550).
_CODEC_SLACK = 2 * 1152 + 1024


def _segments(text: str) -> list[str]:
    segmenter = Segmenter()
    return segmenter.add(text) + segmenter.finish()


def expected_samples(text: str) -> int:
    """Most samples generated for ``text`` at 24 kHz: each segment runs to its frame budget."""
    return sum(frame_budget(s) for s in _segments(text)) * SAMPLES_PER_FRAME


def assert_frames(samples: int, text: str = TEXT) -> None:
    """``samples`` is a whole number of codec frames: the text's frame budget, or up to one
    frame per segment less (the CPU reference engine stops one short of ``max_new_tokens``)."""
    most = expected_samples(text)
    assert samples % SAMPLES_PER_FRAME == 0, samples
    assert most - len(_segments(text)) * SAMPLES_PER_FRAME <= samples <= most, (samples, most)


def decode(data: bytes, fmt: str) -> tuple[np.ndarray, int]:
    """Decode a whole response body: float32 [n] mono and its sample rate.

    soundfile (libsndfile) reads pcm, wav and flac; PyAV (FFmpeg) reads mp3, opus and aac.
    A FLAC is a whole file with its length in STREAMINFO, so libsndfile opens it
    (``test_flac_is_a_complete_file`` also reads it with FFmpeg).
    """
    if fmt == "pcm":
        audio, rate = sf.read(
            io.BytesIO(data),
            format="RAW",
            subtype="PCM_16",
            samplerate=SAMPLE_RATE,
            channels=1,
            endian="LITTLE",
            dtype="float32",
        )
        return audio, rate
    if fmt in ("wav", "flac"):
        audio, rate = sf.read(io.BytesIO(data), dtype="float32")
        return audio, rate
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        frames = [f.to_ndarray().reshape(-1) for f in container.decode(stream)]
        return np.concatenate(frames).astype(np.float32), stream.codec_context.sample_rate


def check_decoded(data: bytes, fmt: str, samples_24k: int) -> None:
    """``data`` decodes to mono audio as long as ``samples_24k`` at 24 kHz (exactly for
    lossless formats; plus codec padding for lossy ones; Opus decodes at 48 kHz)."""
    audio, rate = decode(data, fmt)
    assert audio.ndim == 1
    if fmt == "opus":
        assert rate == 48000
        assert abs(len(audio) / rate - samples_24k / SAMPLE_RATE) <= _CODEC_SLACK / SAMPLE_RATE
    elif fmt in ("mp3", "aac"):
        assert rate == SAMPLE_RATE
        assert samples_24k <= len(audio) <= samples_24k + _CODEC_SLACK
    else:
        assert rate == SAMPLE_RATE
        assert len(audio) == samples_24k
    assert np.abs(audio).max() > 0.001  # noise, not silence


def client_for(server: Server, key: str = "unused") -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{server.http_url}/v1", api_key=key, max_retries=0, timeout=300)


async def post(
    server: Server, body: Any, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """POST /v1/audio/speech (``body`` as JSON, or bytes sent as they are)."""
    async with aiohttp.ClientSession(timeout=_GUARD) as session:
        kwargs: dict[str, Any] = {"data": body} if isinstance(body, bytes) else {"json": body}
        async with session.post(
            f"{server.http_url}/v1/audio/speech", headers=headers, **kwargs
        ) as resp:
            return resp.status, dict(resp.headers), await resp.read()


async def get(
    server: Server, path: str, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], bytes]:
    """GET ``path``: status, headers, body."""
    async with (
        aiohttp.ClientSession(timeout=_GUARD) as session,
        session.get(f"{server.http_url}{path}", headers=headers) as resp,
    ):
        return resp.status, dict(resp.headers), await resp.read()


def metric(exposition: str, name: str, **labels: str) -> float:
    """One sample of a Prometheus text exposition (0 when absent)."""
    want = ",".join(f'{k}="{v}"' for k, v in sorted(labels.items()))
    for line in exposition.splitlines():
        match = re.match(r"^(\w+)\{([^}]*)\} (\S+)$", line)
        if match and match[1] == name and ",".join(sorted(match[2].split(","))) == want:
            return float(match[3])
    return 0.0


async def scrape(server: Server) -> str:
    return (await get(server, "/metrics"))[2].decode()


@pytest.fixture(scope="module")
def pcm_samples(server: Server) -> int:
    """Length of TEXT's audio on this server (from a pcm request): the reference."""
    data = (
        client_for(server)
        .audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="pcm")
        .read()
    )
    samples = len(data) // 2
    assert_frames(samples)
    return samples


@pytest.fixture(scope="module")
def keyed_server(
    checkpoints: Path, voices_dir: Path, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Server]:
    """A second server that requires ``API_KEY`` (CPU)."""
    folder = tmp_path_factory.mktemp("server-keyed")
    srv = start_server(
        checkpoints,
        voices_dir,
        folder / "server.log",
        extra=["--no-zeroconf", "--api-key", API_KEY],
    )
    yield srv
    stop_server(srv)


# --- the openai client, every format ----------------------------------------------------


@pytest.mark.full
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_openai_create_every_format(server: Server, pcm_samples: int, fmt: str) -> None:
    response = client_for(server).audio.speech.create(
        model="tts-1", voice="alloy", input=TEXT, response_format=fmt
    )
    assert response.response.headers["content-type"] == FORMATS[fmt].content_type
    assert response.response.headers["x-sample-rate"] == "24000"
    check_decoded(response.read(), fmt, pcm_samples)


@pytest.mark.full
@pytest.mark.parametrize("fmt", list(FORMATS))
def test_openai_streaming_response_every_format(server: Server, pcm_samples: int, fmt: str) -> None:
    """Every format streams (chunked) but FLAC, a whole file with its Content-Length."""
    with client_for(server).audio.speech.with_streaming_response.create(
        model="gpt-4o-mini-tts", voice="alloy", input=TEXT, response_format=fmt
    ) as response:
        if fmt == "flac":
            assert response.headers.get("transfer-encoding") is None
            length = int(response.headers["content-length"])
        else:
            assert response.headers.get("transfer-encoding") == "chunked"
        data = b"".join(response.iter_bytes())
    if fmt == "flac":
        assert len(data) == length
    check_decoded(data, fmt, pcm_samples)


@pytest.mark.full
@pytest.mark.parametrize(
    "extra",
    [
        {"voice": "alloy"},
        {"voice": "clone", "input": "Good morning. How are you today?"},
        {"voice": "ryan", "stream_format": "sse"},
        {"voice": "alloy", "speed": 1.5},
    ],
    ids=["design", "clone-two-sentences", "custom-sse", "speed"],
)
async def test_flac_is_a_complete_file(server: Server, extra: dict[str, Any]) -> None:
    """libsndfile (soundfile) and FFmpeg (PyAV) both open every FLAC response, and its
    length is exactly that of the same request as pcm (same seed: the frames generated)."""
    body = {"input": TEXT, "seed": 5, **extra}
    status, _, pcm = await post(server, {**body, "response_format": "pcm", "stream_format": None})
    assert status == 200
    status, headers, data = await post(server, {**body, "response_format": "flac"})
    assert status == 200, data
    if extra.get("stream_format") == "sse":
        events = [json.loads(line[6:]) for line in data.decode().splitlines() if line.startswith("data: ")]
        assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.done"]
        data = base64.b64decode(events[0]["audio"])
    else:
        assert headers["Content-Type"] == "audio/flac"
    info = sf.info(io.BytesIO(data))
    assert (info.format, info.samplerate, info.channels) == ("FLAC", SAMPLE_RATE, 1)
    audio, rate = sf.read(io.BytesIO(data), dtype="int16")
    assert rate == SAMPLE_RATE and info.frames == len(audio) == len(pcm) // 2
    if "speed" not in extra:
        assert len(pcm) // 2 % SAMPLES_PER_FRAME == 0
        # Lossless: the same samples (FFmpeg rounds to 16 bits, the pcm path truncates).
        reference = np.frombuffer(pcm, "<i2").astype(np.int32)
        assert np.abs(audio.astype(np.int32) - reference).max() <= 1
    with av.open(io.BytesIO(data)) as container:
        stream = container.streams.audio[0]
        assert sum(frame.samples for frame in container.decode(stream)) == len(audio)


# --- drop-in for the serving engines' clients (vLLM-Omni, sglang-omni, nari-qwen3-tts) ----


@pytest.mark.full
@pytest.mark.parametrize(
    ("model", "voice"),
    [
        ("Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", "ryan"),
        ("qwen3-tts-12hz-0.6b-customvoice", "Ryan"),
        ("Qwen3-TTS-12Hz-1.7B-Base", "clone"),
        ("/models/Qwen3-TTS-12Hz-1.7B-VoiceDesign", "alloy"),
        ("models--Qwen--Qwen3-TTS-12Hz-1.7B-Base", "clone"),
    ],
)
def test_hub_ids_and_folder_names_are_model_names(server: Server, pcm_samples: int, model: str, voice: str) -> None:
    """The openai SDK as vLLM-Omni's docs use it: the checkpoint's hub id as ``model``;
    raw PCM streamed, with its rate in ``x-sample-rate``."""
    with client_for(server).audio.speech.with_streaming_response.create(
        model=model, voice=voice, input=TEXT, response_format="pcm",
        extra_body={"stream": False, "non_streaming_mode": True},
    ) as response:
        assert response.headers["x-sample-rate"] == "24000"
        assert response.headers["content-type"] == FORMATS["pcm"].content_type
        data = b"".join(response.iter_bytes())
    assert_frames(len(data) // 2)


@pytest.mark.full
def test_hub_id_of_the_wrong_kind_is_refused(server: Server) -> None:
    with pytest.raises(openai.BadRequestError) as wrong:
        client_for(server).audio.speech.create(
            model="Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", voice="clone", input=TEXT, response_format="pcm"
        )
    assert wrong.value.code == "voice-model-mismatch"
    assert "not 'Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice'" in wrong.value.message  # the model as the client named it
    with pytest.raises(openai.BadRequestError) as alias:
        client_for(server).audio.speech.create(
            model="qwen3-tts-custom-voice", voice="nova", input=TEXT, response_format="pcm"
        )
    assert alias.value.code == "voice-model-mismatch"
    assert "Voice 'nova' (aria) is spoken by" in alias.value.message  # the voice as the client named it
    with pytest.raises(openai.NotFoundError) as unknown:
        client_for(server).audio.speech.create(model="Qwen/Qwen3-TTS-12Hz-1.7B-Talker", voice="ryan", input=TEXT)
    assert unknown.value.code == "model_not_found"
    assert client_for(server).models.retrieve("Qwen/Qwen3-TTS-12Hz-1.7B-Base").id == "Qwen/Qwen3-TTS-12Hz-1.7B-Base"


@pytest.mark.full
async def test_serving_engine_fields_are_checked(server: Server) -> None:
    """The serving engines' ``stream`` and ``non_streaming_mode`` must be booleans (400 naming
    the field). What ``stream`` selects (raw audio: never server-sent events) is
    tests/test_contracts.py's, with each engine's exact request."""
    body = {"input": TEXT, "voice": "ryan", "response_format": "pcm", "seed": 3}
    for field, value in (("stream", "yes"), ("non_streaming_mode", 1)):
        status, _, error = await post(server, {**body, field: value})
        assert status == 400, error
        assert json.loads(error)["error"]["param"] == field


@pytest.mark.full
@pytest.mark.parametrize("model", ["", "  "], ids=["empty", "spaces"])
async def test_a_blank_model_is_the_default_model(server: Server, pcm_samples: int, model: str) -> None:
    """``"model": ""`` (clients send the field as the user left it) or only spaces is taken
    as absent: the server's default voice, its audio (it was 404 model_not_found)."""
    body = {"input": TEXT, "response_format": "wav", "seed": 5}
    status, headers, data = await post(server, {**body, "model": model})
    assert status == 200, data
    assert headers["Content-Type"] == FORMATS["wav"].content_type
    check_decoded(data, "wav", pcm_samples)
    status, absent, _ = await post(server, body)
    assert status == 200 and headers["X-Voice"] == absent["X-Voice"]


@pytest.mark.full
@pytest.mark.parametrize("fmt", ["pcm", "mp3"])
def test_sse_events_carry_the_audio(server: Server, pcm_samples: int, fmt: str) -> None:
    with client_for(server).audio.speech.with_streaming_response.create(
        model="tts-1", voice="alloy", input=TEXT, response_format=fmt, stream_format="sse"
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [
            json.loads(line[len("data: ") :])
            for line in response.iter_lines()
            if line.startswith("data: ")
        ]
    assert [e["type"] for e in events[:-1]] == ["speech.audio.delta"] * (len(events) - 1)
    assert len(events) >= 2
    done = events[-1]
    assert done["type"] == "speech.audio.done"
    assert done["usage"]["output_tokens"] == pcm_samples // SAMPLES_PER_FRAME
    assert (
        done["usage"]["input_tokens"] + done["usage"]["output_tokens"]
        == done["usage"]["total_tokens"]
    )
    data = b"".join(base64.b64decode(e["audio"]) for e in events[:-1])
    if fmt == "pcm":
        assert len(data) == 2 * pcm_samples
    check_decoded(data, fmt, pcm_samples)


@pytest.mark.full
@pytest.mark.parametrize("speed", [2.0, 0.5, 4.0])
def test_speed_changes_duration(server: Server, pcm_samples: int, speed: float) -> None:
    data = (
        client_for(server)
        .audio.speech.create(
            model="tts-1", voice="alloy", input=TEXT, response_format="wav", speed=speed
        )
        .read()
    )
    audio, rate = decode(data, "wav")
    assert rate == SAMPLE_RATE
    # 5% for the tempo filter, plus one codec frame: random weights sometimes stop a frame early.
    assert abs(len(audio) * speed - pcm_samples) <= 0.05 * pcm_samples + SAMPLES_PER_FRAME


# --- voices, models, extensions ---------------------------------------------------------


@pytest.mark.full
@pytest.mark.parametrize(
    ("extra", "voice"),
    [
        ({"voice": "ryan", "model": "qwen3-tts-custom-voice", "language": "en"}, "ryan"),
        ({"model": "qwen3-tts-custom-voice"}, None),  # the model's first speaker
        ({"voice": "nova", "instructions": "A deep, slow voice.", "seed": 7}, "aria"),
        ({"model": "qwen3-tts-voice-design", "instructions": "A child's bright voice."}, None),
        ({"voice": "alloy", "reference_voice": "clone", "model": "qwen3-tts-clone"}, "clone"),
        ({"voice": {"id": "xvec"}}, "xvec"),
    ],
)
async def test_voice_selection(
    server: Server, pcm_samples: int, extra: dict[str, Any], voice: str | None
) -> None:
    status, headers, data = await post(server, {"input": TEXT, "response_format": "pcm", **extra})
    assert status == 200, data
    if voice is not None:
        assert headers["X-Voice"] == voice
    assert len(data) == 2 * pcm_samples


@pytest.mark.full
async def test_instructions_without_a_voice_are_spoken_by_a_designed_voice(server: Server, pcm_samples: int) -> None:
    """``instructions`` and no ``voice`` design a voice for that request alone: ``X-Voice``
    and the log say ``(designed)`` (they said the default voice, ``aria``, which did not
    speak); with a voice named, or without instructions, they name the voice."""
    cases = [
        ({"instructions": "A calm, low voice."}, "(designed)"),
        ({"model": "qwen3-tts-voice-design", "instructions": "A child's bright voice."}, "(designed)"),
        ({"voice": "nova", "instructions": "A deep, slow voice."}, "aria"),
        ({}, "aria"),
    ]
    for extra, voice in cases:
        before = server.output().count("http request ok: voice (designed), ")
        status, headers, data = await post(server, {"input": TEXT, "response_format": "pcm", "seed": 5, **extra})
        assert status == 200, data
        assert headers["X-Voice"] == voice, extra
        assert len(data) == 2 * pcm_samples
        for _ in range(50):  # the log line follows the last chunk
            if server.output().count("http request ok: voice (designed), ") > before or voice != "(designed)":
                break
            await asyncio.sleep(0.1)
        assert server.output().count("http request ok: voice (designed), ") == before + (voice == "(designed)"), extra


@pytest.mark.full
async def test_catalogue_models_and_probes(server: Server) -> None:
    status, _, body = await get(server, "/v1/audio/voices")
    assert status == 200
    voices = {v["name"]: v for v in json.loads(body)["voices"]}
    assert {"aria", "clone", "xvec", "ryan"} <= set(voices)
    assert "broken" not in voices
    assert voices["aria"]["kind"] == "voice_design" and "alloy" in voices["aria"]["aliases"]
    assert voices["clone"]["kind"] == "base" and voices["ryan"]["kind"] == "custom_voice"
    for v in voices.values():
        assert isinstance(v["summary"], str) and isinstance(v["languages"], list)

    status, _, body = await get(server, "/v1/models")
    listed = json.loads(body)
    assert status == 200 and listed["object"] == "list"
    ids = {m["id"] for m in listed["data"]}
    assert {
        "tts-1",
        "tts-1-hd",
        "gpt-4o-mini-tts",
        "qwen3-tts-base",
        "qwen3-tts-clone",
        "qwen3-tts-voice-design",
        "qwen3-tts-custom-voice",
    } <= ids
    assert all(m["object"] == "model" for m in listed["data"])
    assert {m.id for m in client_for(server).models.list()} == ids
    assert client_for(server).models.retrieve("tts-1").id == "tts-1"
    assert client_for(server).models.retrieve("TTS-1").id == "tts-1"  # as the speech route reads it
    with pytest.raises(openai.NotFoundError) as missing:
        client_for(server).models.retrieve("whisper-1")
    assert missing.value.code == "model_not_found"

    assert (await get(server, "/health"))[0] == 200
    status, _, body = await get(server, "/ready")
    assert status == 200 and json.loads(body)["models"] == {
        "base": "ready",
        "voice_design": "ready",
        "custom_voice": "ready",
    }
    status, headers, body = await get(server, "/metrics")
    assert status == 200 and headers["Content-Type"].startswith("text/plain")
    assert b"tts_requests_total" in body
    assert b'tts_prefill_eager_rows_total{model="base"} 0.0' in body  # no prompt over the buckets


@pytest.mark.gpu
def test_a_model_this_gpu_cannot_hold_is_not_listed(checkpoints: Path, voices_dir: Path, tmp_path: Path) -> None:
    """A card with room for the Base model but not for the VoiceDesign model even alone (here
    ``--gpu-memory`` between their needs, the VoiceDesign checkpoint wider than the tiny Base
    one; on a real card, the 1.7B VoiceDesign model beside another program's memory): start-up
    says so, and that model's requests are refused at once. ``GET /v1/models`` still listed it
    (by its generic name and its folder's), so a client that picked a model from the list had
    every request refused. Now it lists, and retrieves, only models that speak."""
    import torch

    from wyoming_qwen3tts.engine.loader import checkpoint_params, checkpoint_slot_bytes
    from wyoming_qwen3tts.engine.gpu.sizing import GB, MIN_STREAMS, ModelNeed, slot_positions
    from wyoming_qwen3tts.testing.checkpoint import build_checkpoint

    from .conftest import CHECKPOINTS

    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    design = build_checkpoint(CHECKPOINTS.parent / "ggml" / "voice_design", "voice_design", "ggml")  # test_ggml's folder

    def need(checkpoint: Path) -> int:  # bytes, as start-up's plan counts them (bfloat16)
        return ModelNeed("", checkpoint_params(checkpoint) * 2, checkpoint_slot_bytes(checkpoint, slot_positions(), 2)).footprint(MIN_STREAMS)

    base_need, design_need = need(checkpoints / "base"), need(design)
    assert base_need < design_need
    extra = ["--no-zeroconf", "--anchors", "off", "--design-model", str(design), "--custom-voice-model", "none",
             "--dtype", "bfloat16", "--weight-quant", "none", "--gpu-memory", f"{(base_need + design_need) / 2 / GB:.3f}"]
    srv = start_server(checkpoints, voices_dir, tmp_path / "server.log", device="cuda", extra=extra)
    try:
        assert "Not served with this GPU memory: the voice_design model does not fit" in srv.output(), srv.output()[-3000:]
        client = client_for(srv)
        ids = {m.id for m in client.models.list()}
        assert {"tts-1", "qwen3-tts-clone", "qwen3-tts-base", "base"} <= ids, ids
        assert not {"qwen3-tts-voice-design", "voice_design"} & ids, ids
        with pytest.raises(openai.NotFoundError):
            client.models.retrieve("qwen3-tts-voice-design")
        for model in sorted(ids):  # every model listed speaks
            assert client.audio.speech.create(model=model, voice="clone", input=TEXT, response_format="pcm").read(), model
        for model in ("qwen3-tts-voice-design", "tts-1"):  # the one left out, and its presets: refused, saying why
            with pytest.raises(openai.NotFoundError) as refused:
                client.audio.speech.create(model=model, voice="aria", input=TEXT, response_format="pcm")
            assert "cannot be served on this GPU" in str(refused.value), refused.value
        with urllib.request.urlopen(f"{srv.http_url}/v1/audio/voices", timeout=60) as resp:
            listing = json.loads(resp.read())
        assert listing["default"] == "clone", listing["default"]  # not aria: a voice that can be spoken
        request = urllib.request.Request(f"{srv.http_url}/v1/audio/speech", data=json.dumps(
            {"input": TEXT, "response_format": "pcm"}).encode(), headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=300) as resp:  # no voice, as Home Assistant asks
            assert resp.headers["X-Voice"] == "clone" and resp.read()
        assert srv.alive()
    finally:
        stop_server(srv)


# --- errors -----------------------------------------------------------------------------


@pytest.mark.full
@pytest.mark.parametrize(
    ("body", "status", "param", "code"),
    [
        (b"{not json", 400, None, "invalid-json"),
        ([TEXT], 400, None, "invalid-json"),
        ({"voice": "alloy"}, 400, "input", "missing-field"),
        ({"input": ""}, 400, "input", "empty-text"),
        ({"input": "  \n "}, 400, "input", "empty-text"),
        ({"input": "🎉🎉"}, 400, "input", "empty-text"),
        ({"input": "..."}, 400, "input", "empty-text"),
        ({"input": "?! -- **"}, 400, "input", "empty-text"),
        ({"input": 42}, 400, "input", "invalid-type"),
        ({"input": "x" * 10_001}, 413, "input", "text-too-long"),
        ({"input": TEXT, "response_format": "ogg"}, 400, "response_format", "invalid-value"),
        ({"input": TEXT, "stream_format": "chunks"}, 400, "stream_format", "invalid-value"),
        ({"input": TEXT, "speed": 0.1}, 400, "speed", "invalid-value"),
        ({"input": TEXT, "speed": 4.5}, 400, "speed", "invalid-value"),
        ({"input": TEXT, "speed": "fast"}, 400, "speed", "invalid-type"),
        ({"input": TEXT, "speed": True}, 400, "speed", "invalid-type"),
        ({"input": TEXT, "seed": -1}, 400, "seed", "invalid-value"),
        ({"input": TEXT, "seed": 1.5}, 400, "seed", "invalid-type"),
        ({"input": TEXT, "voice": 3}, 400, "voice", "invalid-type"),
        ({"input": TEXT, "instructions": ["calm"]}, 400, "instructions", "invalid-type"),
        ({"input": TEXT, "language": "klingon"}, 400, "language", "unsupported-language"),
        ({"input": TEXT, "voice": "nobody"}, 404, "voice", "unknown-voice"),
        (
            {"input": TEXT, "reference_voice": "/etc/passwd"},
            404,
            "reference_voice",
            "unknown-voice",
        ),
        (
            {"input": TEXT, "reference_voice": "../voices/clone.wav"},
            404,
            "reference_voice",
            "unknown-voice",
        ),
        ({"input": TEXT, "reference_voice": "aria"}, 400, "reference_voice", "invalid-value"),
        ({"input": TEXT, "model": "whisper-1"}, 404, "model", "model_not_found"),
        (
            {"input": TEXT, "model": "qwen3-tts-custom-voice", "voice": "alloy"},
            400,
            "voice",
            "voice-model-mismatch",
        ),
    ],
)
async def test_bad_requests_get_openai_errors(
    server: Server, body: Any, status: int, param: str | None, code: str
) -> None:
    got, headers, data = await post(server, body)
    assert got == status, data
    assert headers["Content-Type"].startswith("application/json")
    error = json.loads(data)["error"]
    assert set(error) == {"message", "type", "param", "code"}
    assert (error["param"], error["code"]) == (param, code)
    assert error["type"] == "invalid_request_error" and error["message"]
    if code == "empty-text":
        assert "nothing speakable" in error["message"]


@pytest.mark.full
async def test_errors_are_counted_and_unknown_routes_are_json(server: Server) -> None:
    mark = len(server.output())
    before = metric(await scrape(server), "tts_errors_total", door="http", code="empty-text")
    assert (await post(server, {"input": ""}))[0] == 400
    assert (
        metric(await scrape(server), "tts_errors_total", door="http", code="empty-text")
        == before + 1
    )
    status, _, data = await get(server, "/v1/nothing")
    assert status == 404 and json.loads(data)["error"]["code"] == "not-found"
    status, _, data = await get(server, "/v1/audio/speech")
    assert status == 405 and "error" in json.loads(data)
    # Refusals aiohttp makes (wrong method, a body over the limit) are counted too.
    exposition = await scrape(server)
    assert metric(exposition, "tts_errors_total", door="http", code="method-not-allowed") >= 1
    too_big = metric(exposition, "tts_errors_total", door="http", code="body-too-large")
    status, _, data = await post(server, b"x" * (200 << 20 >> 4))  # 12.5 MiB
    error = json.loads(data)["error"]
    assert status == 413 and error["code"] == "body-too-large" and "limit of" in error["message"]
    assert metric(await scrape(server), "tts_errors_total", door="http", code="body-too-large") == too_big + 1
    # ... and logged as every refusal is (the new-user trial: counted, never logged).
    log = server.output()[mark:]
    for line in ("GET /v1/nothing refused (404 not-found)", "GET /v1/audio/speech refused (405 method-not-allowed)",
                 "POST /v1/audio/speech refused (413 body-too-large)"):
        assert line in log, log


@pytest.mark.full
def test_openai_client_raises_typed_errors(server: Server) -> None:
    client = client_for(server)
    with pytest.raises(openai.NotFoundError) as err:
        client.audio.speech.create(model="tts-1", voice="nobody", input=TEXT)
    assert err.value.code == "unknown-voice"
    with pytest.raises(openai.BadRequestError) as bad:
        client.audio.speech.create(model="tts-1", voice="alloy", input=TEXT, speed=9.0)
    assert bad.value.param == "speed"


# --- auth -------------------------------------------------------------------------------


@pytest.mark.full
async def test_api_key_required_when_set(keyed_server: Server) -> None:
    for headers in ({}, {"Authorization": "Bearer wrong"}, {"Authorization": API_KEY}):
        status, _, data = await post(keyed_server, {"input": TEXT}, headers)
        assert status == 401, headers
        assert json.loads(data)["error"]["code"] == "invalid_api_key"
        assert "WebSocket" not in json.loads(data)["error"]["message"]  # that hint is the WebSocket door's
    assert (await get(keyed_server, "/v1/models"))[0] == 401
    for path in ("/nonexistent", "/favicon.ico"):  # no such route: 404, key or not (a browser asks for the icon)
        status, _, data = await get(keyed_server, path)
        assert status == 404, (path, data)
    for path in ("/health", "/ready", "/metrics"):  # probes and scrapers need no key
        assert (await get(keyed_server, path))[0] == 200
    assert (await get(keyed_server, "/v1/models", {"Authorization": f"Bearer {API_KEY}"}))[0] == 200
    assert (await get(keyed_server, "/v1/models", {"Authorization": f"bearer  {API_KEY}"}))[0] == 200
    assert (await get(keyed_server, "/v1/models", {"Authorization": f"Basic {API_KEY}"}))[0] == 401
    with pytest.raises(openai.AuthenticationError):
        client_for(keyed_server, "wrong").audio.speech.create(
            model="tts-1", voice="alloy", input=TEXT
        )
    data = (
        client_for(keyed_server, API_KEY)
        .audio.speech.create(model="tts-1", voice="alloy", input=TEXT, response_format="pcm")
        .read()
    )
    assert_frames(len(data) // 2)
    assert "has no --api-key" not in keyed_server.output()  # loopback + key: no warning


@pytest.mark.full
async def test_no_key_server_ignores_authorization(server: Server) -> None:
    status, _, _ = await get(server, "/v1/models", {"Authorization": "Bearer anything"})
    assert status == 200
    assert (await get(server, "/v1/models"))[0] == 200


# --- streaming behaviour ----------------------------------------------------------------


@pytest.mark.full
async def test_disconnect_mid_stream_cancels_and_server_serves_on(
    server: Server, pcm_samples: int
) -> None:
    text = "Hello there, my friend. This second sentence is queued. And a third one waits too."
    assert expected_samples(text) > 3 * pcm_samples  # several segments
    before = metric(await scrape(server), "tts_requests_total", door="http", outcome="cancelled")
    async with aiohttp.ClientSession(timeout=_GUARD) as session:
        resp = await session.post(
            f"{server.http_url}/v1/audio/speech",
            json={"input": text, "response_format": "pcm", "voice": "alloy"},
        )
        assert resp.status == 200
        first = await resp.content.readany()
        assert first
        resp.close()  # drop the connection mid-stream
    deadline = time.monotonic() + 120  # a hang guard while the cancellation propagates
    while (
        metric(await scrape(server), "tts_requests_total", door="http", outcome="cancelled")
        <= before
    ):
        assert time.monotonic() < deadline, "disconnect did not cancel the stream"
        await asyncio.sleep(0.2)
    status, _, data = await post(
        server, {"input": TEXT, "response_format": "pcm", "voice": "alloy"}
    )
    assert status == 200 and len(data) == 2 * pcm_samples
    assert server.alive()


@pytest.mark.full
async def test_wyoming_and_http_at_the_same_time(server: Server, pcm_samples: int) -> None:
    async def wyoming() -> int:
        async with AsyncTcpClient("127.0.0.1", server.port) as client:
            await client.write_event(
                Synthesize(text=TEXT, voice=SynthesizeVoice(name="aria")).event()
            )
            samples = 0
            while True:
                event = await asyncio.wait_for(client.read_event(), 300)
                assert event is not None and not Error.is_type(event.type), event
                if AudioChunk.is_type(event.type):
                    samples += len(AudioChunk.from_event(event).audio) // 2
                elif AudioStop.is_type(event.type):
                    return samples

    async def http(fmt: str) -> bytes:
        status, _, data = await post(
            server, {"input": TEXT, "voice": "alloy", "response_format": fmt}
        )
        assert status == 200, data
        return data

    wy, pcm, mp3 = await asyncio.gather(wyoming(), http("pcm"), http("mp3"))
    assert wy == pcm_samples and len(pcm) == 2 * pcm_samples
    check_decoded(mp3, "mp3", pcm_samples)


@pytest.mark.gpu
@pytest.mark.parametrize("server", ["cuda"], indirect=True)  # the CUDA server only
async def test_first_bytes_arrive_while_generation_runs(server: Server) -> None:
    """Time to first byte on the CUDA engine, shown causally rather than by a stopwatch:
    when the first audio bytes reach the client, the server has not yet counted the
    request as finished (``tts_requests_total{outcome="ok"}`` unchanged); it is counted
    once the body is complete. A server that generated everything before sending would
    fail the first check. The measured times are printed, never asserted."""
    if server.device != "cuda":
        pytest.skip("CUDA engine only")
    text = " ".join(
        f"This is sentence number {i} of a longer answer, spoken in several parts."
        for i in range(6)
    )
    before = metric(await scrape(server), "tts_requests_total", door="http", outcome="ok")
    async with aiohttp.ClientSession(timeout=_GUARD) as session:
        start = time.monotonic()
        async with session.post(
            f"{server.http_url}/v1/audio/speech",
            json={"input": text, "voice": "alloy", "response_format": "pcm"},
        ) as resp:
            assert resp.status == 200
            first = await resp.content.readany()
            ttfb = time.monotonic() - start
            assert first
            assert (
                metric(await scrape(server), "tts_requests_total", door="http", outcome="ok")
                == before
            )
            rest = await resp.read()
            total = time.monotonic() - start
    assert_frames((len(first) + len(rest)) // 2, text)
    assert (
        metric(await scrape(server), "tts_requests_total", door="http", outcome="ok") == before + 1
    )
    print(f"time to first byte {ttfb * 1000:.0f} ms, whole response {total * 1000:.0f} ms")


# --- in process: encoders, tempo, failures ----------------------------------------------


def _noise(n: int, seed: int = 0) -> np.ndarray:
    return (0.1 * np.random.default_rng(seed).standard_normal(n)).astype(np.float32)


@pytest.mark.parametrize("fmt", [f for f in FORMATS if not FORMATS[f].whole_file])
def test_encoders_emit_bytes_per_chunk(fmt: str) -> None:
    """Every streamed format hands out bytes from the first chunk on, before the end."""
    encoder = open_encoder(fmt)
    pieces = [encoder.encode(_noise(2 * SAMPLES_PER_FRAME, i)) for i in range(10)]
    assert all(pieces[:1]) and sum(1 for p in pieces if p) >= 8
    data = b"".join(pieces) + encoder.finish()
    check_decoded(data, fmt, 20 * SAMPLES_PER_FRAME)


def test_flac_encoder_writes_the_total_length() -> None:
    """FLAC comes whole from ``finish``, its STREAMINFO holding the total samples."""
    assert [f for f in FORMATS if FORMATS[f].whole_file] == ["flac"]
    encoder = open_encoder("flac")
    assert all(encoder.encode(_noise(2 * SAMPLES_PER_FRAME, i)) == b"" for i in range(10))
    data = encoder.finish()
    assert data[:4] == b"fLaC"
    total = int.from_bytes(data[8 + 10 : 8 + 18], "big") & ((1 << 36) - 1)  # STREAMINFO
    assert total == 20 * SAMPLES_PER_FRAME == sf.info(io.BytesIO(data)).frames
    check_decoded(data, "flac", 20 * SAMPLES_PER_FRAME)


def test_wav_header_streams_with_unknown_size() -> None:
    head = open_encoder("wav").encode(_noise(100))[:44]
    assert (
        head[:4] == b"RIFF"
        and head[4:8] == b"\xff\xff\xff\xff"
        and head[36:44] == b"data\xff\xff\xff\xff"
    )


@pytest.mark.parametrize("speed", [0.25, 0.5, 0.8, 1.0, 1.5, 2.0, 3.0, 4.0])
def test_tempo_keeps_pitch(speed: float) -> None:
    factors = stage_factors(speed)
    assert all(0.5 <= f <= 2.0 for f in factors) and np.prod(factors or [1.0]) == pytest.approx(
        speed
    )
    tone = (0.3 * np.sin(2 * np.pi * 440 * np.arange(SAMPLE_RATE * 2) / SAMPLE_RATE)).astype(
        np.float32
    )
    tempo = Tempo(speed)
    out = np.concatenate([tempo.process(c) for c in np.split(tone, 25)] + [tempo.finish()])
    assert len(out) == pytest.approx(len(tone) / speed, rel=0.03)
    middle = out[len(out) // 4 : 3 * len(out) // 4]
    peak = (
        np.argmax(np.abs(np.fft.rfft(middle * np.hanning(len(middle))))) * SAMPLE_RATE / len(middle)
    )
    assert peak == pytest.approx(440, abs=10)


def test_tempo_rejects_out_of_range() -> None:
    for speed in (0.2, 4.01):
        with pytest.raises(ValueError):
            Tempo(speed)


class _ScriptedEngine(SerialEngine):
    """Stands in for a Qwen3-TTS model: 4 chunks of noise per segment, each after
    ``pace_s`` seconds; a segment whose text contains FAIL raises after ``fail_after``
    chunks. With a ``hold`` event, the chunks after a segment's first wait until it is set."""

    def __init__(self, kind: ModelKind, fail_after: int, pace_s: float, hold: threading.Event | None = None) -> None:
        Engine.__init__(self, kind, chunk_frames=2, capacity=1)
        self.fail_after, self.pace_s, self.hold = fail_after, pace_s, hold

    def speakers(self) -> list[str]:
        return []

    def stream(self, segment: Segment) -> Iterator[np.ndarray]:
        for i in range(4):
            time.sleep(self.pace_s)
            if i > 0 and self.hold is not None:
                assert self.hold.wait(120), "the test never released the held segment"
            if "FAIL" in segment.text and i == self.fail_after:
                raise RuntimeError("scripted failure")
            yield _noise(self.chunk_frames * SAMPLES_PER_FRAME, i)


@contextlib.asynccontextmanager
async def scripted_service(
    fail_after: int = 4, pace_s: float = 0.0, hold: threading.Event | None = None
) -> AsyncIterator[TtsService]:
    """A real ``TtsService`` (VoiceDesign presets only) on a ``_ScriptedEngine``."""
    engine = _ScriptedEngine(ModelKind.VOICE_DESIGN, fail_after, pace_s)
    await asyncio.to_thread(engine.warm, Segment("warm", "auto", 2))
    service = TtsService(
        VoiceCatalog(None, {ModelKind.VOICE_DESIGN}), {ModelKind.VOICE_DESIGN: engine}, "aria", Metrics()
    )
    try:
        engine.hold = hold  # after the warm-up
        yield service
    finally:
        if hold is not None:
            hold.set()
        await asyncio.to_thread(service.stop)


@contextlib.asynccontextmanager
async def scripted_client(
    fail_after: int = 4, pace_s: float = 0.0, hold: threading.Event | None = None
) -> AsyncIterator[TestClient]:
    """A client of ``create_app`` on a scripted service (aiohttp's test server)."""
    async with (
        scripted_service(fail_after, pace_s, hold) as service,
        TestClient(TestServer(create_app(service))) as client,
    ):
        yield client


#: Bytes of one scripted segment as pcm: 4 chunks of 2 frames, 2 bytes a sample.
_SCRIPTED_PCM = 4 * 2 * SAMPLES_PER_FRAME * 2


async def test_failure_before_audio_is_a_json_500() -> None:
    async with scripted_client(fail_after=0) as client:
        resp = await client.post("/v1/audio/speech", json={"input": "Please FAIL now."})
        assert resp.status == 500
        error = (await resp.json())["error"]
        assert (error["type"], error["code"]) == ("server_error", "generation-failed")
        resp = await client.post(
            "/v1/audio/speech", json={"input": "Fine.", "response_format": "pcm"}
        )
        assert resp.status == 200 and len(await resp.read()) == _SCRIPTED_PCM


async def test_failure_mid_stream_ends_the_body_incomplete() -> None:
    async with scripted_client(fail_after=2) as client:
        resp = await client.post(
            "/v1/audio/speech", json={"input": "Please FAIL now.", "response_format": "wav"}
        )
        assert resp.status == 200
        with pytest.raises(aiohttp.ClientPayloadError):
            await resp.read()
        resp = await client.post(
            "/v1/audio/speech", json={"input": "Fine.", "response_format": "pcm"}
        )
        assert resp.status == 200 and len(await resp.read()) == _SCRIPTED_PCM


async def test_failure_mid_stream_sse_sends_an_error_event() -> None:
    async with scripted_client(fail_after=2) as client:
        resp = await client.post(
            "/v1/audio/speech",
            json={"input": "Please FAIL now.", "response_format": "pcm", "stream_format": "sse"},
        )
        assert resp.status == 200
        events = [
            json.loads(line[6:])
            for line in (await resp.text()).splitlines()
            if line.startswith("data: ")
        ]
    assert [e["type"] for e in events] == ["speech.audio.delta", "speech.audio.delta", "error"]
    assert events[-1]["error"]["code"] == "generation-failed"


async def test_client_gone_between_writes_cancels_quietly(caplog: pytest.LogCaptureFixture) -> None:
    """Without handler cancellation (``start_http`` enables it; this runner does not), the
    next write to a gone client fails: that too must cancel the generation, quietly."""
    caplog.set_level(logging.INFO)
    text = "The first sentence is here. The second sentence follows it. The third one ends it."
    # The audio after the first chunk is held until the client has gone: on a loaded machine
    # all of it (0.55 s of pacing) could otherwise be generated and written before the close,
    # and the request then rightly ended ok.
    hold = threading.Event()
    async with scripted_service(pace_s=0.05, hold=hold) as service:
        runner = web.AppRunner(create_app(service), handler_cancellation=False)
        await runner.setup()
        port = unused_port()
        await web.TCPSite(runner, "127.0.0.1", port).start()
        try:
            async with aiohttp.ClientSession(timeout=_GUARD) as session:
                resp = await session.post(
                    f"http://127.0.0.1:{port}/v1/audio/speech",
                    json={"input": text, "response_format": "pcm"},
                )
                assert resp.status == 200 and await resp.content.readany()
                resp.close()
            hold.set()
            deadline = time.monotonic() + 60  # a hang guard, not a speed assertion
            exposition = ""
            while metric(exposition, "tts_requests_total", door="http", outcome="cancelled") < 1:
                assert time.monotonic() < deadline, "the write failure did not cancel the stream"
                await asyncio.sleep(0.05)
                exposition = service.metrics.exposition().decode()
            assert metric(exposition, "tts_requests_total", door="http", outcome="ok") == 0
        finally:
            await runner.cleanup()
    assert "HTTP client left after" in caplog.text
    assert "Error handling request" not in caplog.text


async def test_not_ready_is_503(monkeypatch: pytest.MonkeyPatch) -> None:
    async with scripted_client(fail_after=4) as client:
        engine = next(iter(client.app[_SERVICE_KEY]._engines.values()))
        monkeypatch.setattr(engine, "warm_error", RuntimeError("warm-up failed"))
        resp = await client.post("/v1/audio/speech", json={"input": "Hello."})
        assert resp.status == 503 and (await resp.json())["error"]["code"] == "not-ready"
        assert (await client.get("/ready")).status == 503
        assert (await client.get("/health")).status == 200


async def test_warns_without_key_on_a_public_address(caplog: pytest.LogCaptureFixture) -> None:
    async with scripted_service() as service:
        for host, key, warned in (
            ("127.0.0.1", None, False),
            ("0.0.0.0", "k", False),
            ("0.0.0.0", None, True),
        ):
            caplog.clear()
            runner = await start_http(service, host, 0, key)
            await runner.cleanup()
            assert ("has no --api-key" in caplog.text) is warned, (host, key)


@pytest.mark.full
async def test_concurrent_clients_get_exactly_their_own_audio(server: Server) -> None:
    """Same seed, distinct two-sentence texts: each client's audio when four run at once (their
    sentences interleaved on the one model) equals what it gets alone. On the serial engines
    byte for byte. The batched engine computes a stream alone at batch size 1 and together
    at batch size 4, and matrix kernels of other shapes round differently: the codes (and so
    the speech) are the same, the PCM within a few 16-bit steps (row isolation at one batch
    size is byte-exact: tests/test_engine.py)."""
    texts = ["Red apples. Green pears.", "Blue skies. Grey clouds.", "One two. Three four.", "Cats nap. Dogs run."]

    async def speak(text: str) -> bytes:
        body = {"input": text, "voice": "aria", "response_format": "pcm", "seed": 99}
        status, _headers, data = await post(server, body)
        assert status == 200
        return data

    alone = [await speak(t) for t in texts]
    again = await speak(texts[0])
    together = await asyncio.gather(*(speak(t) for t in texts))
    assert again == alone[0], "the same request twice is not reproducible"
    for text, mine, solo in zip(texts, together, alone, strict=True):
        assert len(mine) == len(solo), text
        if server.engine != "batched" and server.device != "cuda":
            assert mine == solo, f"{text!r}: audio differs from the single-client run"
            continue
        diff = np.abs(np.frombuffer(mine, "<i2").astype(np.int32) - np.frombuffer(solo, "<i2"))
        assert diff.max() <= 8, f"{text!r}: audio differs from the single-client run by {diff.max()}"


async def test_ready_says_why_no_new_work_is_taken() -> None:
    """/ready (a load balancer's health check): 503 with reason ``busy`` while
    ``max_queue`` requests are open, ``draining`` once a shutdown began (requests are
    still served meanwhile); 200 again when the queue empties."""
    # The open request's segment is held after its first chunk until /ready was asked: a
    # loaded machine that let the rest of it be generated and written first (0.15 s of
    # pacing) had ended the request, and /ready then rightly said 200.
    hold = threading.Event()
    async with scripted_client(pace_s=0.05, hold=hold) as client:
        service = client.app[_SERVICE_KEY]
        body = await (await client.get("/ready")).json()
        assert body["status"] == "ready" and "reason" not in body
        assert (body["open_requests"], body["max_queue"]) == (0, service.max_queue)
        service.max_queue = 1
        resp = await client.post("/v1/audio/speech", json={"input": "Hello there.", "response_format": "pcm"})
        assert resp.status == 200
        await resp.content.readany()  # the request is open
        busy = await client.get("/ready")
        assert busy.status == 503 and (await busy.json())["reason"] == "busy"
        hold.set()
        await resp.read()
        resp.release()
        deadline = time.monotonic() + 60  # a hang guard: the stream ends once its audio is read
        while (await client.get("/ready")).status != 200:
            assert time.monotonic() < deadline, "/ready stayed 503 after the request ended"
            await asyncio.sleep(0.01)
        service.drain()
        draining = await client.get("/ready")
        assert draining.status == 503 and (await draining.json())["reason"] == "draining"
        assert (await client.post("/v1/audio/speech", json={"input": "Still served.", "response_format": "pcm"})).status == 200


async def _clone_service(folder: Path, design: Engine | None = None) -> TtsService:
    """A real ``TtsService`` on warmed scripted Base and VoiceDesign engines (or ``design``
    for the VoiceDesign model), its clone library ``folder`` (stop it with ``service.stop``)."""
    engines: dict[ModelKind, Engine] = {
        kind: _ScriptedEngine(kind, fail_after=4, pace_s=0.0) for kind in (ModelKind.BASE, ModelKind.VOICE_DESIGN)
    }
    if design is not None:
        engines[ModelKind.VOICE_DESIGN] = design
    for engine in engines.values():
        await asyncio.to_thread(engine.warm, Segment("warm", "auto", 2))
    return TtsService(VoiceCatalog(folder, set(engines)), engines, "aria", Metrics())


async def test_a_clone_model_without_clone_voices_says_how_to_add_one(tmp_path: Path) -> None:
    """The Base model loaded but the clone library empty: the 400 says what to add, and where."""
    service = await _clone_service(tmp_path)
    try:
        async with TestClient(TestServer(create_app(service))) as client:
            resp = await client.post("/v1/audio/speech", json={"input": "Hi.", "model": "qwen3-tts-clone"})
            error = (await resp.json())["error"]
            assert resp.status == 400 and error["param"] == "voice", error
            assert "has no voices: add a clone voice (<id>.wav and its transcript <id>.txt)" in error["message"]
    finally:
        await asyncio.to_thread(service.stop)


# --- stalled request bodies, and the clone-only reference_voice -------------------------


@contextlib.asynccontextmanager
async def clone_server(
    folder: Path, idle_timeout: float = 120.0, design: Engine | None = None
) -> AsyncIterator[tuple[TtsService, int]]:
    """``start_http`` (the server's own runner: its keep-alive and idle timeouts) on
    127.0.0.1, on a real ``TtsService`` of scripted Base and VoiceDesign engines (or
    ``design``) whose clone library is ``folder``: (service, port)."""
    service = await _clone_service(folder, design)
    try:
        runner = await start_http(service, "127.0.0.1", 0, None, idle_timeout=idle_timeout)
        try:
            yield service, int(runner.addresses[0][1])
        finally:
            await runner.cleanup()
    finally:
        await asyncio.to_thread(service.stop)


def _unservable_design(why: str) -> Engine:
    """The VoiceDesign engine start-up builds for a model the card cannot hold even alone: an
    ``OnDemandEngine`` flagged with ``why``, never loaded (as ``startup.load_engines`` flags it
    from the memory plan)."""
    from wyoming_qwen3tts.engine.gpu.on_demand import OnDemandEngine

    def never(_shrink: float) -> Engine:
        raise AssertionError("a model this GPU cannot hold is never loaded")

    return OnDemandEngine(ModelKind.VOICE_DESIGN, 2, never, lambda _e: Segment("warm", "auto", 2), unservable=why)


@contextlib.asynccontextmanager
async def wyoming_door(service: TtsService) -> AsyncIterator[int]:
    """The Wyoming door (the server's ``Connections``) on 127.0.0.1 for ``service``: its port."""
    from wyoming_qwen3tts.doors.wyoming.handler import Connections, WyomingLimits

    connections = Connections(service, WyomingLimits(write_timeout=5, idle_timeout=60))

    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await connections(reader, writer).run()

    listener = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield int(listener.sockets[0].getsockname()[1])
    finally:
        listener.close()
        await connections.shutdown(1.0)


#: What the start-up plan says of a VoiceDesign model the card cannot hold even alone.
_TOO_BIG = "the voice_design model does not fit in this GPU's 3.5 GB even alone"


async def test_the_model_list_leaves_out_a_model_the_gpu_cannot_hold(tmp_path: Path) -> None:
    """The side of ``test_a_model_this_gpu_cannot_hold_is_not_listed`` (a GPU test) that runs
    without a GPU: the VoiceDesign engine start-up builds for a model the card cannot hold even
    alone (an ``OnDemandEngine`` with its reason, never loaded) is left out of the list the
    openai SDK reads, and cannot be retrieved. Its requests were queued, then failed with 500
    ``generation-failed``: now each is refused before it is queued with 404 ``model_not_found``
    (as a model the server has not loaded), the same reason, and the field at fault (``model``
    when it was named, else ``voice``). The voice listing marks its presets ``unservable``."""
    design = _unservable_design(_TOO_BIG)
    await asyncio.to_thread(design.warm, Segment("warm", "auto", 2))
    async with clone_server(tmp_path, design=design) as (service, port):
        client = openai.AsyncOpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0, timeout=60)
        ids = {m.id async for m in client.models.list()}
        assert "qwen3-tts-clone" in ids and "qwen3-tts-voice-design" not in ids, ids
        with pytest.raises(openai.NotFoundError):
            await client.models.retrieve("qwen3-tts-voice-design")
        reason = f"The voice_design model cannot be served on this GPU: {_TOO_BIG}"
        for model, param in (("qwen3-tts-voice-design", "model"), ("tts-1", "voice")):
            with pytest.raises(openai.NotFoundError) as refused:
                await client.audio.speech.create(model=model, voice="aria", input=TEXT, response_format="pcm")
            error = refused.value.body
            assert isinstance(error, dict) and (error["code"], error["param"]) == ("model_not_found", param), error
            assert error["message"].startswith(reason), error
        await client.close()
        async with aiohttp.ClientSession(timeout=_GUARD) as session:
            async with session.get(f"http://127.0.0.1:{port}/v1/audio/voices") as resp:
                listed = {v["name"]: v for v in (await resp.json())["voices"]}
            # The WebSocket door reads the same body: the same refusal, the field at fault ``model``.
            async with session.ws_connect(f"http://127.0.0.1:{port}/v1/audio/speech/ws", protocols=("nari.speech.v1",)) as ws:
                await ws.send_json({"type": "request.start", "model": "qwen3-tts-voice-design", "voice": "aria"})
                while (event := await ws.receive_json(timeout=30))["type"] != "error":
                    assert event["type"] == "session.created", event
                refusal = event["error"]
        assert listed["aria"]["unservable"] == reason and listed["lena"]["unservable"] == reason, listed["aria"]
        assert (refusal["code"], refusal["param"]) == ("model_not_found", "model") and refusal["message"].startswith(reason), refusal


async def test_a_voice_the_gpu_cannot_speak_is_neither_the_default_nor_announced(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """A card that cannot hold the VoiceDesign model even alone: the automatic default voice
    was still ``aria`` (a preset, taken first when there is one), so every request naming no
    voice (Home Assistant names none) failed, and Wyoming's ``info`` announced every preset.
    Now the default is a voice that can be spoken (the clone ``kim``, said in the log),
    ``info`` announces only those, and a preset asked for over Wyoming gets an ``error`` with
    code ``model_not_found`` and the reason, before anything is queued. A default pinned with
    --voice is kept, and the log says (once, at ERROR) that it cannot be spoken and what to do."""
    caplog.set_level(logging.INFO, logger="wyoming_qwen3tts")
    sf.write(tmp_path / "kim.wav", np.frombuffer(_wav(2.0)[44:], "<i2").astype(np.float32) / 32768, SAMPLE_RATE)
    (tmp_path / "kim.txt").write_text("Words.")
    design = _unservable_design(_TOO_BIG)
    await asyncio.to_thread(design.warm, Segment("warm", "auto", 2))
    async with clone_server(tmp_path, design=design) as (service, port):
        async with aiohttp.ClientSession(timeout=_GUARD) as session:
            async with session.post(f"http://127.0.0.1:{port}/v1/audio/speech", json={"input": TEXT, "response_format": "pcm"}) as resp:
                assert resp.status == 200 and resp.headers["X-Voice"] == "kim", await resp.text()
            async with session.get(f"http://127.0.0.1:{port}/v1/audio/voices") as resp:
                assert (await resp.json())["default"] == "kim"
        said = [r.getMessage() for r in caplog.records if r.getMessage().startswith("Default voice: kim")]
        assert said and "aria" in said[0] and "cannot be served on this GPU" in said[0], said
        async with wyoming_door(service) as wyoming, AsyncTcpClient("127.0.0.1", wyoming) as client:
            from wyoming.info import Describe, Info

            await client.write_event(Describe().event())
            info = Info.from_event(await _read_one(client))
            assert {v.name for v in info.tts[0].voices} == {"kim"}, info
            await client.write_event(Synthesize(text=TEXT).event())  # no voice: the default
            assert AudioChunk.is_type((await _read_one(client, "audio-chunk")).type)
        async with wyoming_door(service) as wyoming, AsyncTcpClient("127.0.0.1", wyoming) as client:
            await client.write_event(Synthesize(text=TEXT, voice=SynthesizeVoice(name="aria")).event())
            error = Error.from_event(await _read_one(client))
            assert error.code == "model_not_found" and _TOO_BIG in error.text, error
    pinned = TtsService(service.catalog, {ModelKind.VOICE_DESIGN: _unservable_design(_TOO_BIG)}, "aria", Metrics(),
                        default_explicit=True)
    try:
        caplog.clear()
        for _ in range(2):
            assert pinned.default_voice == "aria"
        errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
        assert len(errors) == 1 and errors[0].startswith("The default voice aria (--voice aria) cannot be spoken"), errors
        assert _TOO_BIG in errors[0] and "--voice" in errors[0], errors
    finally:
        await asyncio.to_thread(pinned.stop, 1.0)


async def _read_one(client: AsyncTcpClient, wanted: str | None = None) -> Any:
    """The next event (of type ``wanted``, skipping others), within a hang guard."""
    while True:
        event = await asyncio.wait_for(client.read_event(), 60)
        assert event is not None, "the server closed the connection"
        if wanted is None or event.type == wanted:
            return event


def _wav(seconds: float) -> bytes:
    """A 24 kHz 16-bit WAV of a voiced-looking tone."""
    t = np.arange(int(seconds * SAMPLE_RATE)) / SAMPLE_RATE
    out = io.BytesIO()
    sf.write(out, 0.3 * np.sin(2 * np.pi * 190 * t) * (1 + 0.3 * np.sin(2 * np.pi * 3 * t)), SAMPLE_RATE, format="WAV", subtype="PCM_16")
    return out.getvalue()


_BOUNDARY = "stalltestboundary"


def _form(name: str, data: bytes) -> bytes:
    """A multipart/form-data body with the fields ``name`` and ``file`` (boundary ``_BOUNDARY``)."""
    return (
        f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="name"\r\n\r\n{name}\r\n'
        f'--{_BOUNDARY}\r\nContent-Disposition: form-data; name="file"; filename="clip.wav"\r\n'
        "Content-Type: application/octet-stream\r\n\r\n"
    ).encode() + data + f"\r\n--{_BOUNDARY}--\r\n".encode()


def _stalled_request(route: str) -> bytes:
    """The head of a request to ``route`` and the first part of its body, the rest never sent."""
    if route == "speech":  # the fresh-user trial's: Content-Length, 5 of 100 bytes sent
        head = "POST /v1/audio/speech HTTP/1.1\r\nContent-Type: application/json\r\nContent-Length: 100\r\n"
        body = b'{"inp'
    elif route == "rename":  # chunked: a chunk announced, half of it sent
        head = "PATCH /v1/audio/voices/mine HTTP/1.1\r\nContent-Type: application/json\r\nTransfer-Encoding: chunked\r\n"
        body = b'14\r\n{"name": "'
    else:  # the studio's upload, cut in the middle of its file
        form = _form("stalled", _wav(2.0))
        head = (
            "POST /v1/audio/voices HTTP/1.1\r\n"
            f"Content-Type: multipart/form-data; boundary={_BOUNDARY}\r\nContent-Length: {len(form)}\r\n"
        )
        body = form[: len(form) // 2]
    return f"{head}Host: x\r\n\r\n".encode() + body


@pytest.mark.parametrize("route", ["speech", "rename", "upload"])
async def test_a_stalled_request_body_gets_408_and_the_connection_closes(
    tmp_path: Path, caplog: pytest.LogCaptureFixture, route: str
) -> None:
    """A body that stops part-way is answered 408 ``idle-timeout`` (OpenAI's error shape,
    ``Connection: close``) after ``idle_timeout`` seconds without a byte, then the
    connection is closed; it is logged once at INFO, and other clients are served meanwhile."""
    caplog.set_level(logging.INFO)
    sf.write(tmp_path / "mine.wav", np.frombuffer(_wav(2.0)[44:], "<i2").astype(np.float32) / 32768, SAMPLE_RATE)
    (tmp_path / "mine.txt").write_text("Words.")
    async with clone_server(tmp_path, idle_timeout=1.5) as (_service, port):
        reader, writer = await asyncio.open_connection("127.0.0.1", port)
        try:
            writer.write(_stalled_request(route))
            await writer.drain()
            async with aiohttp.ClientSession(timeout=_GUARD) as session:  # another client, served meanwhile
                resp = await session.post(
                    f"http://127.0.0.1:{port}/v1/audio/speech", json={"input": "Fine.", "response_format": "pcm"}
                )
                assert resp.status == 200 and len(await resp.read()) == _SCRIPTED_PCM
            # 15 s: a hang guard on a loaded machine, ten times the timeout, not a speed assertion
            data = await asyncio.wait_for(reader.read(), 15)
        finally:
            writer.close()
    head, _, body = data.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408 "), data
    assert b"connection: close" in head.lower()
    error = json.loads(body)["error"]
    assert (error["code"], error["type"], error["param"]) == ("idle-timeout", "invalid_request_error", None), error
    assert "1.5 s" in error["message"] and "--idle-timeout" in error["message"]
    logged = [r for r in caplog.records if "408 idle-timeout" in r.getMessage()]
    assert len(logged) == 1 and logged[0].levelno == logging.INFO, [r.getMessage() for r in logged]
    assert not [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]  # no traceback


async def test_a_slow_upload_that_keeps_coming_is_not_cut(tmp_path: Path) -> None:
    """The timeout is on progress, not on the total: a clip uploaded in pieces, the whole
    taking more than twice ``idle_timeout``, each piece well within it, is taken."""
    form = _form("slow", _wav(2.0))
    pieces = 20

    async def dribble() -> AsyncIterator[bytes]:
        step = -(-len(form) // pieces)
        for start in range(0, len(form), step):
            yield form[start : start + step]
            await asyncio.sleep(0.25)  # 20 x 0.25 s = 5 s in all, against an idle timeout of 2 s

    async with clone_server(tmp_path, idle_timeout=2.0) as (service, port), aiohttp.ClientSession(timeout=_GUARD) as session:
        headers = {"Content-Type": f"multipart/form-data; boundary={_BOUNDARY}"}
        async with session.post(f"http://127.0.0.1:{port}/v1/audio/voices", data=dribble(), headers=headers) as resp:
            assert resp.status == 201, await resp.text()
            assert (await resp.json())["name"] == "slow"
        assert service.resolve_voice("slow").kind is ModelKind.BASE


@pytest.mark.parametrize("clones", [["mine", "yours"], []])
async def test_an_unknown_reference_voice_lists_only_the_clone_voices(tmp_path: Path, clones: list[str]) -> None:
    """``reference_voice`` takes only clone voices: its unknown-voice error names those (or
    says there are none), never the presets and built-in speakers."""
    for name in clones:
        sf.write(tmp_path / f"{name}.wav", np.frombuffer(_wav(2.0)[44:], "<i2").astype(np.float32) / 32768, SAMPLE_RATE)
        (tmp_path / f"{name}.txt").write_text("Words.")
    listed = "; clone voices: mine, yours" if clones else "; there are no clone voices: add a clone voice (<id>.wav"
    async with clone_server(tmp_path) as (_service, port), aiohttp.ClientSession(timeout=_GUARD) as session:
        for name in ("../../etc/passwd", "x; available: aria"):  # the second: the list is not cut out of the name
            body = {"input": "Hi.", "reference_voice": name}
            async with session.post(f"http://127.0.0.1:{port}/v1/audio/speech", json=body) as resp:
                assert resp.status == 404
                error = (await resp.json())["error"]
            assert (error["code"], error["param"]) == ("unknown-voice", "reference_voice"), error
            message = error["message"]
            assert message.startswith(f"Unknown voice {name!r}{listed}"), message
            assert "alina" not in message and "available: a" not in message.replace(repr(name), ""), message


async def test_a_default_voice_skipped_for_its_transcript_is_refused_naming_the_transcript(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The --voice default ``lat``, whose clip is fine but whose transcript was saved as
    Windows-1252: a request naming no voice was refused with "its clip is skipped ...
    Replace the clip", and the log said "its clip lat.wav is skipped" and to put the clip
    back. The fault is the transcript's: now both name it and say to save it again as UTF-8."""
    caplog.set_level(logging.INFO, logger="wyoming_qwen3tts")
    clip = np.frombuffer(_wav(2.0)[44:], "<i2").astype(np.float32) / 32768
    for name in ("kim", "lat"):
        sf.write(tmp_path / f"{name}.wav", clip, SAMPLE_RATE)
    (tmp_path / "kim.txt").write_text("Words.")
    (tmp_path / "lat.txt").write_bytes("Caf\u00e9 au lait.".encode("cp1252"))
    engines: dict[ModelKind, Engine] = {ModelKind.BASE: _ScriptedEngine(ModelKind.BASE, fail_after=4, pace_s=0.0)}
    await asyncio.to_thread(engines[ModelKind.BASE].warm, Segment("warm", "auto", 2))
    service = TtsService(VoiceCatalog(tmp_path, set(engines)), engines, "lat", Metrics(), default_explicit=True)
    try:
        async with TestClient(TestServer(create_app(service))) as client:
            resp = await client.post("/v1/audio/speech", json={"input": TEXT, "response_format": "pcm"})
            error = (await resp.json())["error"]
        assert resp.status == 404 and (error["code"], error["param"]) == ("default-voice-gone", "voice"), error
        assert error["message"] == ("The default voice 'lat' (--voice) cannot be used: its transcript lat.txt could not "
                                    "be used (see the server log). Save it again as UTF-8, or choose another default "
                                    "voice"), error
        warned = [r.getMessage() for r in caplog.records if "is no longer served" in r.getMessage()]
        assert len(warned) == 1 and warned[0].startswith(
            "The default voice lat (--voice lat) is no longer served: its transcript lat.txt could not be used, so its "
            "clip lat.wav is skipped (its transcript lat.txt is not UTF-8 text"), warned
        assert "until you save its transcript lat.txt again as UTF-8, or choose another default voice" in warned[0]
        assert "put its clip back" not in warned[0] and "available: kim" in warned[0], warned
    finally:
        await asyncio.to_thread(service.stop)
