"""Every serving engine's client served unchanged: the exact request each one sends, and
the response each one accepts, checked on the real server (conftest ``server``).

The engines' contracts are those of the public harness that measures them
(nari-labs/benchmarks, ``tts_bench``), recorded in ``contracts/tts_bench.json`` with their
source: the body each target's adapter builds, the headers its client sends, the content
types it accepts, whether it needs ``x-sample-rate``, and whether it reads raw PCM or a
streamed WAV. All of them send ``"stream": true``; only vLLM-Omni's adds
``"stream_format": "audio"``. ``stream`` is not OpenAI's field: the engines use it to mean
"stream the audio", so it must never turn the body into server-sent events (only OpenAI's
``"stream_format": "sse"`` does). Then OpenAI's SDK with either ``stream_format``, and the
README's streaming example as a user runs it (curl piped to a player), and docs/api.md's.

Random weights never emit EOS, so a response's length is known in advance
(``test_http.assert_frames``): every check decodes the bytes and counts the samples.
"""

from __future__ import annotations

import base64
import io
import json
import re
import shlex
import struct
from pathlib import Path
from typing import Any

import aiohttp
import numpy as np
import pytest
import soundfile as sf

from wyoming_qwen3tts.common.audio import SAMPLE_RATE, SAMPLES_PER_FRAME
from wyoming_qwen3tts.doors.http.shared import ApiError
from wyoming_qwen3tts.doors.http.request import loaded_model_names, model_kind
from wyoming_qwen3tts.common.vocabulary import ModelKind

from .conftest import ROOT, Server
from .test_http import TEXT, assert_frames, client_for

CONTRACTS = json.loads((Path(__file__).parent / "contracts" / "tts_bench.json").read_text())
#: A hang guard for whole requests, not a speed assertion.
_GUARD = aiohttp.ClientTimeout(total=300)
#: ``0xFFFFFFFF``: a streamed WAV's sizes, unknown when its header is sent.
_OPEN_ENDED = 0xFFFFFFFF


async def harness_post(server: Server, body: dict[str, Any]) -> tuple[int, dict[str, str], list[bytes]]:
    """POST ``body`` as tts_bench does: its session's and request's headers, the body as
    JSON; the response read chunk by chunk as it arrives (``iter_any``)."""
    session_headers = {"Accept-Encoding": CONTRACTS["headers"]["Accept-Encoding"]}
    request_headers = {k: v for k, v in CONTRACTS["headers"].items() if k != "Accept-Encoding"}
    async with (
        aiohttp.ClientSession(timeout=_GUARD, headers=session_headers) as session,
        session.post(f"{server.http_url}{CONTRACTS['url']}", data=json.dumps(body), headers=request_headers) as resp,
    ):
        chunks = [chunk async for chunk in resp.content.iter_any()]
        return resp.status, {k.lower(): v for k, v in resp.headers.items()}, chunks


def pcm16(data: bytes) -> np.ndarray:
    """Raw PCM as the engines' clients read it: signed 16-bit little-endian, mono, whole
    samples only (float32 [n] in [-1, 1])."""
    assert len(data) % 2 == 0, "a partial PCM sample frame"
    return np.frombuffer(data, "<i2").astype(np.float32) / 32768.0


def streamed_wav(data: bytes) -> np.ndarray:
    """A streamed WAV as tts_bench's parser reads it: RIFF/WAVE, a ``fmt `` chunk of integer
    PCM, mono, 16 bits at 24 kHz (consistent byte rate and alignment), then a ``data`` chunk
    of open-ended or exact size. Returns the samples (float32 [n])."""
    riff, _size, wave = struct.unpack("<4sI4s", data[:12])
    assert (riff, wave) == (b"RIFF", b"WAVE")
    pos, fmt_seen = 12, False
    while pos + 8 <= len(data):
        chunk, size = struct.unpack("<4sI", data[pos : pos + 8])
        if chunk == b"data":
            payload = data[pos + 8 :] if size == _OPEN_ENDED else data[pos + 8 : pos + 8 + size]
            assert size == _OPEN_ENDED or len(payload) == size, "data ended before its declared size"
            assert fmt_seen, "no fmt chunk before the data"
            return pcm16(payload)
        if chunk == b"fmt ":
            codec, channels, rate, byte_rate, align, bits = struct.unpack("<HHIIHH", data[pos + 8 : pos + 24])
            assert (codec, channels, bits, rate) == (1, 1, 16, CONTRACTS["sample_rate_hz"])
            assert align == channels * bits // 8 and byte_rate == rate * align
            fmt_seen = True
        pos += 8 + size + size % 2
    raise AssertionError("no data chunk")


def check_speech(audio: np.ndarray) -> None:
    """The text's whole audio: its frame budget in samples, and not silence."""
    assert_frames(len(audio))
    assert np.abs(audio).max() > 0.001


def sse_audio(body: bytes) -> bytes:
    """The audio bytes of a server-sent-event body (``speech.audio.delta`` events, then
    ``speech.audio.done``)."""
    events = [json.loads(line[len("data: ") :]) for line in body.decode().splitlines() if line.startswith("data: ")]
    assert [e["type"] for e in events] == ["speech.audio.delta"] * (len(events) - 1) + ["speech.audio.done"]
    return b"".join(base64.b64decode(e["audio"]) for e in events[:-1])


# --- the engines' clients, byte for byte ----------------------------------------------------


@pytest.mark.full
@pytest.mark.parametrize("target", sorted(CONTRACTS["targets"]))
async def test_each_engine_client_gets_the_audio_it_reads(server: Server, target: str) -> None:
    """The target's exact body and headers; the response passes its client's checks (status,
    content type, sample-rate header) and its bytes decode as that client decodes them."""
    contract = CONTRACTS["targets"][target]
    body = {k: (TEXT if v == "<prompt>" else v) for k, v in contract["body"].items()}
    assert body["stream"] is True and "seed" not in body  # as sent: no extension of ours
    status, headers, chunks = await harness_post(server, body)
    data = b"".join(chunks)
    assert status == 200, data[:500]
    content_type = headers["content-type"].split(";", 1)[0].strip().lower()
    assert content_type in contract["content_types"], content_type
    if contract["sample_rate_header"] is not None:
        assert int(headers[contract["sample_rate_header"]]) == CONTRACTS["sample_rate_hz"]
    assert headers.get("transfer-encoding") == "chunked"  # streamed as generated, not buffered
    if contract["stream_kind"] == "wav":
        audio = streamed_wav(data)
        assert len(audio) == len(sf.read(io.BytesIO(data), dtype="float32")[0])  # libsndfile agrees
    else:
        audio = pcm16(data)
    check_speech(audio)


@pytest.mark.full
async def test_stream_true_never_selects_server_sent_events(server: Server) -> None:
    """``stream: true`` with any ``response_format`` is that format's raw bytes; only
    ``stream_format: sse`` is SSE, with the same audio inside; a non-boolean ``stream`` is a
    400 naming it."""
    base = {"model": "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", "input": TEXT, "voice": "ryan", "response_format": "pcm", "seed": 3}
    status, headers, chunks = await harness_post(server, {**base, "stream": True})
    raw = b"".join(chunks)
    assert status == 200 and headers["content-type"] == "audio/pcm"
    status, headers, chunks = await harness_post(server, {**base, "stream": True, "stream_format": "sse"})
    assert status == 200 and headers["content-type"].startswith("text/event-stream")
    assert sse_audio(b"".join(chunks)) == raw  # same seed: the same samples either way
    status, headers, chunks = await harness_post(server, {**base, "response_format": "mp3", "stream": True})
    assert status == 200 and headers["content-type"] == "audio/mpeg"
    assert b"".join(chunks)[:3] in (b"ID3", b"\xff\xfb", b"\xff\xf3", b"\xff\xe3")  # an MP3 stream, not events
    status, _, chunks = await harness_post(server, {**base, "stream": "yes"})
    error = json.loads(b"".join(chunks))["error"]
    assert status == 400 and error["param"] == "stream" and error["code"] == "invalid-type"


# --- the model's name: the hub id or the folder the server loaded ----------------------------

#: A voice of each kind on the test server, and the kind's hub id (the harness's --model).
KIND_VOICES = {
    ModelKind.BASE: ("clone", "Qwen/Qwen3-TTS-12Hz-1.7B-Base", "base"),
    ModelKind.VOICE_DESIGN: ("alloy", "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign", "voice_design"),
    ModelKind.CUSTOM_VOICE: ("Ryan", "Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", "custom_voice"),
}


@pytest.mark.full
@pytest.mark.parametrize("kind", list(KIND_VOICES), ids=lambda k: k.value)
async def test_the_hub_id_and_the_folder_of_each_loaded_model_select_it(
    server: Server, checkpoints: Path, kind: ModelKind
) -> None:
    """vLLM-Omni's body with ``model`` as the harness's ``--model`` sets it: the hub id, the
    folder the server loaded (conftest: ``--custom-voice-model <checkpoints>/custom_voice``),
    or that folder's name. Each selects its model (raw PCM of the text's length), and
    ``/v1/models`` lists the folder's name; another kind's voice is refused as a mismatch."""
    voice, hub_id, folder = KIND_VOICES[kind]
    body = {**CONTRACTS["targets"]["vllm-omni"]["body"], "input": TEXT, "voice": voice}
    for model in (hub_id, folder, str(checkpoints / folder), f"{checkpoints / folder}/"):
        status, headers, chunks = await harness_post(server, {**body, "model": model})
        assert status == 200, (model, b"".join(chunks)[:300])
        assert headers["content-type"] == "audio/pcm"
        check_speech(pcm16(b"".join(chunks)))
    other = next(v for k, (v, _, _) in KIND_VOICES.items() if k is not kind)
    status, _, chunks = await harness_post(server, {**body, "model": folder, "voice": other})
    assert status == 400 and json.loads(b"".join(chunks))["error"]["code"] == "voice-model-mismatch"
    listed = [m.id for m in client_for(server).models.list()]
    assert folder in listed and client_for(server).models.retrieve(folder).id == folder


def test_loaded_model_names(tmp_path: Path) -> None:
    """A hub id is its own name; a folder is named by its last part (a path ending in it
    selects it too); a folder name two loaded models share selects neither."""
    for folder in ("ft", "a/model", "b/model"):
        (tmp_path / folder).mkdir(parents=True)
    names = loaded_model_names({ModelKind.BASE: "Qwen/Qwen3-TTS-12Hz-0.6B-Base", ModelKind.CUSTOM_VOICE: f"{tmp_path}/ft/"})
    assert names == {"Qwen/Qwen3-TTS-12Hz-0.6B-Base": ModelKind.BASE, "ft": ModelKind.CUSTOM_VOICE}
    assert model_kind("/somewhere/else/FT", names) is ModelKind.CUSTOM_VOICE
    assert model_kind("qwen/qwen3-tts-12hz-0.6b-base", names) is ModelKind.BASE
    shared = {ModelKind.BASE: str(tmp_path / "a" / "model"), ModelKind.VOICE_DESIGN: str(tmp_path / "b" / "model")}
    assert loaded_model_names(shared) == {}
    with pytest.raises(ApiError) as unknown:
        model_kind("model", loaded_model_names(shared))
    assert unknown.value.status == 404 and unknown.value.code == "model_not_found"


# --- OpenAI's SDK ---------------------------------------------------------------------------


@pytest.mark.full
@pytest.mark.parametrize("fmt", ["pcm", "wav"])
def test_openai_sdk_stream_format_audio_is_raw(server: Server, fmt: str) -> None:
    with client_for(server).audio.speech.with_streaming_response.create(
        model="Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", voice="Ryan", input=TEXT, response_format=fmt,
        stream_format="audio",
    ) as response:
        assert response.headers["content-type"] == f"audio/{fmt}"
        assert response.headers["x-sample-rate"] == str(SAMPLE_RATE)
        data = b"".join(response.iter_bytes())
    check_speech(pcm16(data) if fmt == "pcm" else streamed_wav(data))


@pytest.mark.full
def test_openai_sdk_stream_format_sse_is_events(server: Server) -> None:
    with client_for(server).audio.speech.with_streaming_response.create(
        model="Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", voice="Ryan", input=TEXT, response_format="pcm",
        stream_format="sse",
    ) as response:
        assert response.headers["content-type"].startswith("text/event-stream")
        body = b"".join(response.iter_bytes())
    check_speech(pcm16(sse_audio(body)))
    done = json.loads(body.decode().strip().splitlines()[-1][len("data: ") :])
    assert done["usage"]["output_tokens"] == len(sse_audio(body)) // 2 // SAMPLES_PER_FRAME


@pytest.mark.full
def test_openai_sdk_as_the_engines_document_it_is_raw(server: Server) -> None:
    """The SDK with the engines' ``stream: true`` in ``extra_body`` (their docs' example):
    raw PCM, not events."""
    with client_for(server).audio.speech.with_streaming_response.create(
        model="Qwen/Qwen3-TTS-12Hz-1.7B-CustomVoice", voice="Ryan", input=TEXT, response_format="pcm",
        extra_body={"stream": True, "language": "English"},
    ) as response:
        assert response.headers["content-type"] == "audio/pcm"
        data = b"".join(response.iter_bytes())
    check_speech(pcm16(data))


# --- the README's and docs/api.md's streaming examples --------------------------------------


def readme_players() -> list[tuple[list[str], list[str]]]:
    """Each command of the README and the docs/ pages that pipes ``curl`` into a player:
    (curl's arguments, the player's), continued lines joined and comments left out."""
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    found = []
    for block in (b for page in pages for b in re.findall(r"```sh\n(.*?)```", page.read_text(), re.S)):
        lines = [line for line in block.replace("\\\n", " ").splitlines() if not line.lstrip().startswith("#")]
        for command in lines:
            if command.lstrip().startswith("curl") and "|" in command:
                fetch, player = command.split("|", 1)
                found.append((shlex.split(fetch), shlex.split(player)))
    return found


@pytest.mark.full
async def test_the_readme_streams_raw_audio_to_its_player(server: Server) -> None:
    """The README's and docs/api.md's ``curl ... | ffplay -f s16le -ar 24000 -ch_layout mono``,
    each's body and headers as written: the bytes are in exactly the format it tells the player."""
    examples = readme_players()
    assert len(examples) >= 2, "a streaming example in the README and one in docs/api.md"
    for curl, player in examples:
        assert player[0] == "ffplay" and player[player.index("-f") + 1] == "s16le"
        assert int(player[player.index("-ar") + 1]) == SAMPLE_RATE and player[player.index("-ch_layout") + 1] == "mono"
        body = json.loads(curl[curl.index("-d") + 1])
        headers = dict(curl[i + 1].split(": ", 1) for i, arg in enumerate(curl) if arg == "-H")
        async with (
            aiohttp.ClientSession(timeout=_GUARD) as session,
            session.post(f"{server.http_url}/v1/audio/speech", data=json.dumps(body), headers=headers) as resp,
        ):
            assert resp.status == 200 and resp.headers["Content-Type"] == "audio/pcm"
            data = await resp.read()
        assert_frames(len(pcm16(data)), body["input"])
