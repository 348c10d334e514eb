"""The voice studio's API end to end: the real server process on tiny checkpoints (CPU),
aiohttp as the client, the wyoming client for ``info`` and speech.

One server (Base + VoiceDesign, ``--anchors used``, an API key) serves the module; the
anchor tests start a second process on the same folders with the Base model off. Random
weights never emit EOS, so every generation runs to its frame cap: an anchor or a
candidate is exactly as long as its cap, a sentence as its ``frame_budget``.
"""

from __future__ import annotations

import asyncio
import codecs
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import aiohttp
import av
import jsonschema
import numpy as np
import openai
import pytest
import soundfile as sf
from wyoming.audio import AudioChunk, AudioStop
from wyoming.client import AsyncTcpClient
from wyoming.error import Error
from wyoming.info import Describe, Info
from wyoming.tts import Synthesize, SynthesizeVoice

from wyoming_qwen3tts.service.anchors import ANCHOR_MAX_FRAMES, ANCHOR_TEXTS
from wyoming_qwen3tts.common.audio import SAMPLE_RATE, SAMPLES_PER_FRAME
from wyoming_qwen3tts.catalogue.library import LOCK_FILE, MAX_UPLOAD_BYTES
from wyoming_qwen3tts.text.segmenter import frame_budget

from .conftest import CLONE_TRANSCRIPT, Server, start_server, stop_server

KEY = "studio-key"
AUTH = {"Authorization": f"Bearer {KEY}"}
#: A hang guard for whole requests, not a speed assertion.
_GUARD = aiohttp.ClientTimeout(total=300)
TEXT = "Hi"


def tone(seconds: float, rate: int = 24000, freq: float = 190.0, level: float = 0.3) -> np.ndarray:
    """A voiced-looking test clip: float32 [n] (a tone with a slow wobble and a little noise)."""
    t = np.arange(int(seconds * rate)) / rate
    wobble = 1 + 0.3 * np.sin(2 * np.pi * 3 * t)
    noise = 0.03 * level * np.random.default_rng(int(freq)).standard_normal(len(t))
    return (level * np.sin(2 * np.pi * freq * t) * wobble + noise).astype(np.float32)


def encoded(audio: np.ndarray, fmt: str, rate: int = 24000) -> bytes:
    """``audio`` as a file: wav / flac through soundfile, ogg (Opus) / mp3 through PyAV."""
    out = io.BytesIO()
    if fmt in ("wav", "flac"):
        sf.write(out, audio, rate, format=fmt.upper())
        return out.getvalue()
    codec = {"ogg": "libopus", "mp3": "mp3"}[fmt]
    with av.open(out, mode="w", format=fmt) as container:
        stream = container.add_stream(codec, rate=48000 if fmt == "ogg" else rate, layout="mono")
        frame = av.AudioFrame.from_ndarray(audio.reshape(1, -1), format="flt", layout="mono")
        frame.sample_rate = rate
        resampler = av.AudioResampler(format=stream.format.name, layout="mono", rate=stream.rate)
        for piece in resampler.resample(frame) + resampler.resample(None):
            for packet in stream.encode(piece):
                container.mux(packet)
        for packet in stream.encode(None):
            container.mux(packet)
    return out.getvalue()


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(voices folder with one clone voice, server folder whose data/ holds the anchors)."""
    root = tmp_path_factory.mktemp("studio")
    voices = root / "voices"
    voices.mkdir()
    sf.write(voices / "clone.wav", tone(2.0), 24000)
    (voices / "clone.txt").write_text(CLONE_TRANSCRIPT)
    (root / "server").mkdir()
    return voices, root / "server"


@pytest.fixture(scope="module")
def studio(checkpoints: Path, folders: tuple[Path, Path]) -> Iterator[Server]:
    """Base + VoiceDesign, anchors for the voices in use, an API key."""
    voices, home = folders
    srv = start_server(
        checkpoints, voices, home / "server.log",
        extra=["--no-zeroconf", "--custom-voice-model", "none", "--anchors", "used", "--api-key", KEY],
    )
    yield srv
    stop_server(srv)


async def call(
    server: Server, method: str, path: str, *, auth: bool = True, **kwargs: Any
) -> tuple[int, bytes]:
    """One HTTP request to the server: status and body."""
    headers = dict(kwargs.pop("headers", {}))
    if auth:
        headers.update(AUTH)
    async with (
        aiohttp.ClientSession(timeout=_GUARD) as session,
        session.request(method, server.http_url + path, headers=headers, **kwargs) as resp,
    ):
        return resp.status, await resp.read()


def upload(name: str | None, data: bytes | None, transcript: str | None = None, filename: str = "clip.wav") -> aiohttp.FormData:
    form = aiohttp.FormData(default_to_multipart=True)
    if name is not None:
        form.add_field("name", name)
    if transcript is not None:
        form.add_field("transcript", transcript)
    if data is not None:
        form.add_field("file", data, filename=filename, content_type="application/octet-stream")
    return form


async def voices_of(server: Server) -> dict[str, dict[str, Any]]:
    status, body = await call(server, "GET", "/v1/audio/voices")
    assert status == 200, body
    return {v["name"]: v for v in json.loads(body)["voices"]}


async def wyoming_voices(server: Server) -> set[str]:
    async with AsyncTcpClient("127.0.0.1", server.port) as client:
        await client.write_event(Describe().event())
        while True:
            event = await asyncio.wait_for(client.read_event(), 60)
            assert event is not None
            if Info.is_type(event.type):
                return {v.name for v in Info.from_event(event).tts[0].voices}


async def wyoming_samples(server: Server, voice: str, text: str = TEXT) -> int:
    """Samples of one Wyoming ``synthesize`` with ``voice``."""
    async with AsyncTcpClient("127.0.0.1", server.port) as client:
        await client.write_event(Synthesize(text=text, voice=SynthesizeVoice(name=voice)).event())
        samples = 0
        while True:
            event = await asyncio.wait_for(client.read_event(), 300)
            assert event is not None and not Error.is_type(event.type), event
            if AudioChunk.is_type(event.type):
                samples += len(AudioChunk.from_event(event).audio) // 2
            elif AudioStop.is_type(event.type):
                return samples


async def speech(server: Server, voice: str, text: str = TEXT, **extra: Any) -> bytes:
    status, body = await call(
        server, "POST", "/v1/audio/speech", json={"input": text, "voice": voice, "response_format": "pcm", **extra}
    )
    assert status == 200, body
    return body


def frames_ok(samples: int, text: str = TEXT) -> bool:
    """A whole sentence's audio: its frame budget, or one frame less (the CPU path)."""
    most = frame_budget(text) * SAMPLES_PER_FRAME
    return most - SAMPLES_PER_FRAME <= samples <= most and samples % SAMPLES_PER_FRAME == 0


def snapshot(folder: Path) -> dict[str, bytes]:
    """Every file of the voices folder and its content."""
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir()) if p.is_file()}


# --- keys and the page ----------------------------------------------------------------------


@pytest.mark.full
async def test_page_is_open_and_the_api_needs_the_key(studio: Server) -> None:
    status, body = await call(studio, "GET", "/", auth=False)
    assert status == 200 and b"Voice studio" in body and b'src="studio/studio.js"' in body
    assert b"<base" not in body
    status, body = await call(studio, "GET", "/studio/studio.js", auth=False)
    assert status == 200 and b"v1/audio/voices" in body
    for method, path in [("GET", "/v1/audio/voices/clone/sample"), ("POST", "/v1/audio/designs"), ("DELETE", "/v1/audio/voices/clone")]:
        status, body = await call(studio, method, path, auth=False)
        assert status == 401 and json.loads(body)["error"]["code"] == "invalid_api_key", (method, path)
    # The ingress header alone (not from the trusted ingress proxy) opens nothing.
    status, _ = await call(studio, "GET", "/v1/audio/voices", auth=False, headers={"X-Ingress-Path": "/api/hassio_ingress/x"})
    assert status == 401
    status, body = await call(studio, "GET", "/", auth=False, headers={"X-Ingress-Path": "/api/hassio_ingress/abc"})
    assert b'<base href="/api/hassio_ingress/abc/">' in body
    status, body = await call(studio, "GET", "/", auth=False, headers={"X-Ingress-Path": '/x"><script>'})
    assert b"<base" not in body


# --- clone voices ---------------------------------------------------------------------------


@pytest.mark.full
@pytest.mark.parametrize("fmt", ["flac", "ogg"])  # ogg: Opus, through PyAV
async def test_upload_creates_a_voice_spoken_at_once_over_both_doors(studio: Server, folders: tuple[Path, Path], fmt: str) -> None:
    voices_dir = folders[0]
    name = f"upload {fmt}"
    # With a transcript a clip is at most the 20 s used (test_voices: ..._the_transcript_says)
    clip = encoded(tone(12.0, rate=44100), fmt, rate=44100)
    status, body = await call(studio, "POST", "/v1/audio/voices", data=upload(name, clip, "Hello there, this is me.", f"me.{fmt}"))
    assert status == 201, body
    created = json.loads(body)
    assert created["name"] == name and created["kind"] == "base" and created["source"] == "clone"
    stored, rate = sf.read(voices_dir / f"{name}.wav", dtype="float32")
    assert rate == SAMPLE_RATE and abs(len(stored) - 12 * SAMPLE_RATE) <= 2048  # resampled
    assert (voices_dir / f"{name}.txt").read_text().strip() == "Hello there, this is me."
    assert name in await voices_of(studio)
    assert name in await wyoming_voices(studio)
    assert frames_ok(await wyoming_samples(studio, name))
    assert frames_ok(len(await speech(studio, name)) // 2)
    status, sample = await call(studio, "GET", f"/v1/audio/voices/{name}/sample")
    audio, rate = sf.read(io.BytesIO(sample), dtype="float32")
    assert status == 200 and rate == SAMPLE_RATE and np.allclose(audio, stored, atol=1 / 16384)


@pytest.mark.full
@pytest.mark.parametrize(
    ("form", "status", "code"),
    [
        (upload("notaudio", b"this is a text file, not a recording" * 10), 400, "not-audio"),
        (upload("picture", b"\x89PNG\r\n\x1a\n" + bytes(2000)), 400, "not-audio"),
        (upload("short", encoded(tone(0.6), "wav")), 400, "clip-too-short"),
        (upload("cutoff", encoded(tone(3.0), "wav")[:2000]), 400, "clip-too-short"),  # cut off: said so, same code
        (upload("silent", encoded(np.zeros(48000, np.float32), "wav")), 400, "clip-silent"),
        (upload("hum", encoded(tone(3.0, level=0.002), "wav")), 400, "clip-silent"),
        (upload("", encoded(tone(2.0), "wav")), 400, "invalid-name"),
        (upload("x" * 49, encoded(tone(2.0), "wav")), 400, "invalid-name"),
        (upload("../escape", encoded(tone(2.0), "wav")), 400, "invalid-name"),
        (upload("a/b", encoded(tone(2.0), "wav")), 400, "invalid-name"),
        (upload("a\\b", encoded(tone(2.0), "wav")), 400, "invalid-name"),
        (upload("Con", encoded(tone(2.0), "wav")), 400, "invalid-name"),
        (upload("lpt1.old", encoded(tone(2.0), "wav")), 400, "invalid-name"),
        (upload("..", encoded(tone(2.0), "wav")), 400, "invalid-name"),
        (upload(".hidden", encoded(tone(2.0), "wav")), 400, "invalid-name"),
        (upload("clone", encoded(tone(2.0), "wav")), 409, "name-taken"),
        (upload("CLONE", encoded(tone(2.0), "wav")), 409, "name-taken"),
        (upload("alloy", encoded(tone(2.0), "wav")), 409, "name-taken"),  # an alias of aria
        (upload("aria", encoded(tone(2.0), "wav")), 409, "name-taken"),  # a shipped preset
        (upload(None, encoded(tone(2.0), "wav")), 400, "missing-field"),
        (upload("nofile", None), 400, "missing-field"),
    ],
)
async def test_bad_uploads_are_refused_and_change_nothing(
    studio: Server, folders: tuple[Path, Path], form: aiohttp.FormData, status: int, code: str
) -> None:
    before, listed = snapshot(folders[0]), await voices_of(studio)
    got, body = await call(studio, "POST", "/v1/audio/voices", data=form)
    error = json.loads(body)["error"]
    assert (got, error["code"]) == (status, code), error
    assert error["message"]
    assert snapshot(folders[0]) == before and await voices_of(studio) == listed
    assert studio.alive()


@pytest.mark.full
@pytest.mark.parametrize(
    ("content_type", "body"),
    [
        ("multipart/form-data", b"no boundary"),
        ("multipart/form-data; boundary=x", b"no parts at all"),
        ("multipart/form-data; boundary=x", b'--x\r\nContent-Disposition: form-data; name="name"\r\n\r\ncut off'),
        ("application/json", b'{"name": "x"}'),
    ],
)
async def test_malformed_forms_are_refused(studio: Server, folders: tuple[Path, Path], content_type: str, body: bytes) -> None:
    before = snapshot(folders[0])
    status, data = await call(studio, "POST", "/v1/audio/voices", data=body, headers={"Content-Type": content_type})
    assert status == 400 and json.loads(data)["error"]["code"] == "invalid-body", data
    assert snapshot(folders[0]) == before and studio.alive()


@pytest.mark.full
async def test_oversized_upload_is_refused_while_streaming(studio: Server, folders: tuple[Path, Path]) -> None:
    before = snapshot(folders[0])

    async def body() -> Any:  # no Content-Length: the server must count as it reads
        yield b"--b\r\nContent-Disposition: form-data; name=\"name\"\r\n\r\nhuge\r\n"
        yield b"--b\r\nContent-Disposition: form-data; name=\"file\"; filename=\"x.wav\"\r\n\r\n"
        for _ in range(MAX_UPLOAD_BYTES // (1 << 20) + 2):
            yield bytes(1 << 20)
        yield b"\r\n--b--\r\n"

    headers = {"Content-Type": "multipart/form-data; boundary=b"}
    status, data = await call(studio, "POST", "/v1/audio/voices", data=body(), headers=headers)
    assert status == 413 and json.loads(data)["error"]["code"] == "clip-too-large"
    assert json.loads(data)["error"]["message"].startswith("The clip is over the 20 MB limit")
    # Announced: refused before reading, so whether it is a form is not known: the message
    # speaks of the body (this one is no form at all), not of a clip.
    headers["Content-Length"] = str(MAX_UPLOAD_BYTES + (1 << 20))
    status, data = await call(studio, "POST", "/v1/audio/voices", data=bytes(MAX_UPLOAD_BYTES + (1 << 20)), headers=headers)
    message = json.loads(data)["error"]["message"]
    assert status == 413 and message.startswith("The request body is over the 20 MB limit (21,"), message
    assert "a clip upload must be under 20 MB" in message, message
    # A multipart type with no boundary is known to be no form before any byte is read: 400.
    headers["Content-Type"] = "multipart/form-data"
    status, data = await call(studio, "POST", "/v1/audio/voices", data=bytes(MAX_UPLOAD_BYTES + (1 << 20)), headers=headers)
    error = json.loads(data)["error"]
    assert status == 400 and error["code"] == "invalid-body" and "no usable multipart boundary" in error["message"], error
    # A form whose first line never ends (1 MB with no line break: longer than the multipart
    # reader reads a line, aiohttp's LineTooLong) is a malformed body, 400, not a 500.
    headers = {"Content-Type": "multipart/form-data; boundary=b"}
    status, data = await call(studio, "POST", "/v1/audio/voices", data=b"x" * (1 << 20), headers=headers)
    error = json.loads(data)["error"]
    assert status == 400 and error["code"] == "invalid-body" and error["message"].startswith("The request body is malformed"), error
    assert snapshot(folders[0]) == before and studio.alive()


@pytest.mark.full
async def test_two_uploads_of_one_name_at_once(studio: Server, folders: tuple[Path, Path]) -> None:
    clips = [encoded(tone(4.0, freq=f), "wav") for f in (150.0, 260.0)]
    results = await asyncio.gather(*(call(studio, "POST", "/v1/audio/voices", data=upload("twin", c)) for c in clips))
    statuses = sorted(status for status, _ in results)
    assert statuses == [201, 409], results
    refused = json.loads(next(body for status, body in results if status == 409))["error"]
    assert refused["code"] in ("name-busy", "name-taken") and "twin" in refused["message"]
    winner = next(i for i, (status, _) in enumerate(results) if status == 201)
    stored, _ = sf.read(folders[0] / "twin.wav", dtype="float32")
    expected, _ = sf.read(io.BytesIO(clips[winner]), dtype="float32")
    assert np.allclose(stored, expected, atol=1 / 16384)  # one clip whole, not a mixture
    assert not [p for p in folders[0].iterdir() if p.name.startswith(".") and p.name != LOCK_FILE]  # no temporary files left


@pytest.mark.full
async def test_an_edit_waiting_for_another_servers_lock_holds_up_no_other_request(
    studio: Server, folders: tuple[Path, Path]
) -> None:
    """Another server (here the test) holds the voices folder's lock: a rename waits for it on
    a worker thread, and meanwhile the server answers the voice list and a Wyoming describe
    (the edit ran on the event loop: every request and every stream's audio waited up to the
    lock's 10 s timeout). Once the lock is let go, the rename goes through."""
    import filelock

    status, body = await call(studio, "POST", "/v1/audio/voices", data=upload("waiter", encoded(tone(2.0), "wav"), "Words."))
    assert status == 201, body
    lock = filelock.FileLock(folders[0] / LOCK_FILE)
    lock.acquire()
    try:
        rename = asyncio.create_task(call(studio, "PATCH", "/v1/audio/voices/waiter", json={"name": "waited"}))
        await asyncio.sleep(1.0)  # the rename reaches the lock and waits there
        status, listed = await call(studio, "GET", "/v1/audio/voices")
        assert status == 200 and "waiter" in {v["name"] for v in json.loads(listed)["voices"]}
        assert "waiter" in await wyoming_voices(studio)
        assert not rename.done()  # both answered while the rename still waited for the lock
    finally:
        lock.release()
    status, body = await rename
    assert status == 200 and json.loads(body)["name"] == "waited", body
    assert "waited" in await wyoming_voices(studio)
    status, _ = await call(studio, "DELETE", "/v1/audio/voices/waited")
    assert status == 200 and studio.alive()


@pytest.mark.full
async def test_rename_and_delete(studio: Server, folders: tuple[Path, Path]) -> None:
    status, body = await call(studio, "POST", "/v1/audio/voices", data=upload("tobe", encoded(tone(2.0), "wav"), "Words."))
    assert status == 201, body
    status, body = await call(studio, "PATCH", "/v1/audio/voices/tobe", json={"name": "renamed voice"})
    assert status == 200 and json.loads(body)["name"] == "renamed voice"
    assert (folders[0] / "renamed voice.wav").is_file() and (folders[0] / "renamed voice.txt").read_text().strip() == "Words."
    assert not (folders[0] / "tobe.wav").exists()
    assert {"renamed voice"} <= await wyoming_voices(studio) and "tobe" not in await wyoming_voices(studio)
    assert frames_ok(len(await speech(studio, "renamed voice")) // 2)
    status, _ = await call(studio, "GET", "/v1/audio/voices/tobe/sample")
    assert status == 404

    for path, body, status_code, code in [
        ("/v1/audio/voices/renamed%20voice", {"name": "clone"}, 409, "name-taken"),
        ("/v1/audio/voices/renamed%20voice", {"name": "a/b"}, 400, "invalid-name"),
        ("/v1/audio/voices/renamed%20voice", {}, 400, "missing-field"),
        ("/v1/audio/voices/aria", {"name": "other"}, 403, "shipped-preset"),
        ("/v1/audio/voices/nobody", {"name": "other"}, 404, "unknown-voice"),
    ]:
        before = snapshot(folders[0])
        status, data = await call(studio, "PATCH", path, json=body)
        assert (status, json.loads(data)["error"]["code"]) == (status_code, code), (path, body)
        assert snapshot(folders[0]) == before
    for name, status_code, code in [("james", 403, "shipped-preset"), ("nobody", 404, "unknown-voice")]:
        status, data = await call(studio, "DELETE", f"/v1/audio/voices/{name}")
        assert (status, json.loads(data)["error"]["code"]) == (status_code, code), name

    # A change of case only is a rename, not a clash with itself.
    status, body = await call(studio, "PATCH", "/v1/audio/voices/renamed%20voice", json={"name": "Renamed Voice"})
    assert status == 200 and json.loads(body)["name"] == "Renamed Voice", body
    assert (folders[0] / "Renamed Voice.wav").is_file() and not (folders[0] / "renamed voice.wav").exists()

    status, body = await call(studio, "DELETE", "/v1/audio/voices/Renamed%20Voice")
    assert status == 200 and json.loads(body) == {"deleted": "Renamed Voice"}
    assert not [p for p in folders[0].iterdir() if p.stem.casefold() == "renamed voice"]
    assert "Renamed Voice" not in await wyoming_voices(studio)


@pytest.mark.full
@pytest.mark.parametrize("name", [5, True, ["x"], {"id": "x"}])
async def test_a_name_that_is_not_a_string_is_invalid_type(studio: Server, folders: tuple[Path, Path], name: Any) -> None:
    """A wrong-typed ``name`` is reported as the speech request's wrong-typed fields are
    (400 ``invalid-type``, "'name' must be a string"), not as an empty name."""
    voice_files = {n: b for n, b in snapshot(folders[0]).items() if n != LOCK_FILE}
    status, data = await call(studio, "PATCH", "/v1/audio/voices/clone", json={"name": name})
    error = json.loads(data)["error"]
    assert (status, error["code"], error["param"]) == (400, "invalid-type", "name"), error
    assert error["message"] == "'name' must be a string"
    assert {n: b for n, b in snapshot(folders[0]).items() if n != LOCK_FILE} == voice_files


@pytest.mark.full
async def test_deleting_a_voice_in_use_lets_the_request_finish(studio: Server) -> None:
    status, body = await call(studio, "POST", "/v1/audio/voices", data=upload("busy", encoded(tone(2.0), "wav"), "Busy."))
    assert status == 201, body
    text = "One sentence here. And a second one, spoken after the delete."
    async with aiohttp.ClientSession(timeout=_GUARD) as session:
        body_json = {"input": text, "voice": "busy", "response_format": "pcm"}
        async with session.post(studio.http_url + "/v1/audio/speech", json=body_json, headers=AUTH) as resp:
            assert resp.status == 200  # headers come with the first audio: the request is running
            first = await resp.content.read(2)
            status, _ = await call(studio, "DELETE", "/v1/audio/voices/busy")
            assert status == 200
            rest = await resp.read()
    samples = (len(first) + len(rest)) // 2
    budget = (frame_budget("One sentence here.") + frame_budget("And a second one, spoken after the delete.")) * SAMPLES_PER_FRAME
    assert budget - 2 * SAMPLES_PER_FRAME <= samples <= budget  # both sentences, whole
    status, body = await call(studio, "POST", "/v1/audio/speech", json={"input": TEXT, "voice": "busy"})
    assert status == 404 and json.loads(body)["error"]["code"] == "unknown-voice"


# --- design ---------------------------------------------------------------------------------


@pytest.mark.full
async def test_design_candidates_keep_one_and_override_a_shipped_preset(studio: Server, folders: tuple[Path, Path]) -> None:
    request = {"description": "A gravelly old sea captain.", "language": "en", "text": "Ahoy there, friends.", "count": 2, "seed": 40}
    status, body = await call(studio, "POST", "/v1/audio/designs", json=request)
    assert status == 200, body
    design = json.loads(body)
    assert [c["seed"] for c in design["candidates"]] == [40, 41]
    cap = min(frame_budget("Ahoy there, friends."), ANCHOR_MAX_FRAMES)
    clips = []
    for candidate in design["candidates"]:
        status, wav = await call(studio, "GET", "/" + candidate["sample"])
        audio, rate = sf.read(io.BytesIO(wav), dtype="float32")
        assert status == 200 and rate == SAMPLE_RATE and cap - 1 <= len(audio) / SAMPLES_PER_FRAME <= cap
        clips.append(wav)
    assert clips[0] != clips[1]  # each candidate its own seed

    kept = design["candidates"][1]
    status, body = await call(studio, "POST", f"/v1/audio/designs/{kept['id']}/keep", json={"name": "captain", "summary": "Sea captain"})
    assert status == 201, body
    preset = json.loads(body)
    assert preset["kind"] == "voice_design" and preset["source"] == "user"
    assert preset["served"] == "anchor" and preset["anchor"] == "ready"
    status, sample = await call(studio, "GET", "/v1/audio/voices/captain/sample")
    assert status == 200 and sample == clips[1]  # the kept clip is the preset's anchor
    presets = (folders[0] / "presets.toml").read_text()
    assert "[captain]" in presets and "seed = 41" in presets and 'anchor_text = "Ahoy there, friends."' in presets
    assert "captain" in await wyoming_voices(studio)
    assert frames_ok(await wyoming_samples(studio, "captain"))

    status, body = await call(studio, "POST", f"/v1/audio/designs/{kept['id']}/keep", json={"name": "james"})
    assert status == 409 and json.loads(body)["error"]["code"] == "name-taken"
    assert '"replace": true' in json.loads(body)["error"]["message"], body  # how to override it is said
    status, body = await call(studio, "POST", f"/v1/audio/designs/{kept['id']}/keep", json={"name": "captain"})
    message = json.loads(body)["error"]["message"]  # your own preset: replace does not apply
    assert status == 409 and "replace" not in message and "choose another name" in message, body
    status, body = await call(studio, "POST", f"/v1/audio/designs/{kept['id']}/keep", json={"name": "james", "replace": True})
    assert status == 201, body
    james = (await voices_of(studio))["james"]
    assert james["source"] == "user" and james["summary"] == "A gravelly old sea captain." and "onyx" in james["aliases"]
    status, body = await call(studio, "DELETE", "/v1/audio/voices/james")  # the override goes, the shipped one comes back
    assert status == 200
    assert (await voices_of(studio))["james"]["source"] == "shipped"


@pytest.mark.full
async def test_a_clone_under_a_shipped_presets_name_is_told_what_works_for_a_clone(
    studio: Server, folders: tuple[Path, Path]
) -> None:
    """An upload (even with a ``replace`` field) or a clone voice's rename onto a shipped
    preset's name was told to keep it again with ``"replace": true``, which only a kept
    design has: a dead end. The refusal now says to choose another name, or to copy the clip
    into the voices folder by hand, and that advice works (the clone is spoken in the
    preset's place; deleting it brings the preset back)."""
    voices = folders[0]
    form = upload("lena", encoded(tone(2.0), "wav"))
    form.add_field("replace", "true")
    status, body = await call(studio, "POST", "/v1/audio/voices", data=form)
    renamed, renamed_body = await call(studio, "PATCH", "/v1/audio/voices/clone", json={"name": "lena"})
    assert (voices / "clone.wav").is_file() and not list(voices.glob("lena.*"))
    for status, body in ((status, body), (renamed, renamed_body)):
        error = json.loads(body)["error"]
        assert (status, error["code"]) == (409, "name-taken"), body
        assert "replace" not in error["message"] and "choose another name" in error["message"], body
        assert f"copied by hand into the voices folder as {voices / 'lena.wav'}" in error["message"], body

    sf.write(voices / "lena.wav", tone(2.0, freq=170.0), 24000)  # the advice followed
    try:
        lena = (await voices_of(studio))["lena"]
        assert lena["source"] == "clone" and lena["shadows"] == "shipped", lena
    finally:
        status, body = await call(studio, "DELETE", "/v1/audio/voices/lena")
    assert status == 200 and not (voices / "lena.wav").exists(), body
    assert (await voices_of(studio))["lena"]["source"] == "shipped"


@pytest.mark.full
async def test_a_presets_rename_onto_a_shipped_name_is_told_what_works_for_a_rename(
    studio: Server, folders: tuple[Path, Path]
) -> None:
    """A user preset's rename onto a shipped preset's name was told to "keep it again with
    "replace": true", though a rename has no ``replace`` (a ``PATCH`` with one got the same
    409). The refusal now says a rename cannot, and how: design it again and keep it under
    that name with ``replace``, then delete the old one; the advice works."""
    status, body = await call(studio, "POST", "/v1/audio/designs", json={"description": "A calm narrator.", "language": "en", "count": 1, "seed": 7})
    candidate = json.loads(body)["candidates"][0]
    status, body = await call(studio, "POST", f"/v1/audio/designs/{candidate['id']}/keep", json={"name": "calm"})
    assert status == 201, body
    before = (folders[0] / "presets.toml").read_text()
    for patch in ({"name": "james"}, {"name": "james", "replace": True}):
        status, body = await call(studio, "PATCH", "/v1/audio/voices/calm", json=patch)
        error = json.loads(body)["error"]
        assert (status, error["code"]) == (409, "name-taken"), body
        assert "a rename cannot override a shipped preset" in error["message"], body
        assert "keep it as 'james' with \"replace\": true, then delete 'calm'" in error["message"], body
    assert (folders[0] / "presets.toml").read_text() == before

    status, body = await call(studio, "POST", "/v1/audio/designs", json={"description": "A calm narrator.", "language": "en", "count": 1, "seed": 7})
    again = json.loads(body)["candidates"][0]  # the advice followed
    status, body = await call(studio, "POST", f"/v1/audio/designs/{again['id']}/keep", json={"name": "james", "replace": True})
    assert status == 201, body
    status, body = await call(studio, "DELETE", "/v1/audio/voices/calm")
    assert status == 200, body
    listed = await voices_of(studio)
    assert "calm" not in listed and listed["james"]["source"] == "user" and listed["james"]["summary"] == "A calm narrator."
    status, body = await call(studio, "DELETE", "/v1/audio/voices/james")
    assert status == 200 and (await voices_of(studio))["james"]["source"] == "shipped", body


@pytest.mark.full
@pytest.mark.parametrize(
    ("body", "code"),
    [
        ({"language": "en"}, "missing-field"),
        ({"description": "A voice.", "language": "auto"}, "invalid-value"),
        ({"description": "A voice.", "language": "klingon"}, "unsupported-language"),
        ({"description": "A voice.", "language": "en", "count": 9}, "invalid-value"),
        ({"description": "A voice.", "language": "en", "text": "word " * 40}, "text-too-long"),
        ({"description": "A voice.", "language": "en", "text": "🎉"}, "empty-text"),
        ({"description": "A voice.", "language": "en", "seed": -1}, "invalid-value"),
        ({"description": "A voice.", "language": "en", "count": "2"}, "invalid-type"),
        ({"description": "A voice.", "language": "en", "count": True}, "invalid-type"),
        ({"description": "A voice.", "language": "en", "seed": 4.5}, "invalid-type"),
    ],
)
async def test_bad_design_requests(studio: Server, body: dict[str, Any], code: str) -> None:
    status, data = await call(studio, "POST", "/v1/audio/designs", json=body)
    assert status == 400 and json.loads(data)["error"]["code"] == code, data


@pytest.mark.full
async def test_keep_refuses_unknown_candidates_and_bad_names(studio: Server, folders: tuple[Path, Path]) -> None:
    status, body = await call(studio, "POST", "/v1/audio/designs/nope/keep", json={"name": "x"})
    assert status == 404 and json.loads(body)["error"]["code"] == "unknown-candidate"
    status, body = await call(studio, "POST", "/v1/audio/designs", json={"description": "A whisper.", "language": "de", "text": "Hallo.", "count": 1})
    candidate = json.loads(body)["candidates"][0]["id"]
    before = snapshot(folders[0])
    for name in ["", "../up", "a" * 60, "clone"]:
        status, body = await call(studio, "POST", f"/v1/audio/designs/{candidate}/keep", json={"name": name})
        assert status in (400, 409), body
    assert snapshot(folders[0]) == before


# --- anchors --------------------------------------------------------------------------------


@pytest.mark.full
async def test_preset_anchor_is_stable_across_requests_and_restarts(
    studio: Server, folders: tuple[Path, Path], checkpoints: Path
) -> None:
    voices_dir, home = folders
    first = await call(studio, "GET", "/v1/audio/voices/aria/sample")
    again = await call(studio, "GET", "/v1/audio/voices/alloy/sample")
    assert first[0] == 200 and first == again
    audio, rate = sf.read(io.BytesIO(first[1]), dtype="float32")
    assert 6.0 <= len(audio) / rate <= 10.0  # the anchor sentence, within the 10 s cap
    aria = (await voices_of(studio))["aria"]
    assert aria["served"] == "anchor" and aria["anchor"] == "ready"
    meta = [json.loads(p.read_text()) for p in (home / "data" / "anchors").glob("*.json") if p.name != "model-digests.json"]
    assert any(m["preset"] == "aria" and m["text"] == ANCHOR_TEXTS["english"] for m in meta)
    # The anchored preset: same request, same audio (the Base model clones the anchor).
    assert await speech(studio, "aria", seed=3) == await speech(studio, "aria", seed=3)
    assert "voice aria (anchor)" in studio.output()
    live = studio.output().count("http request ok: voice aria, ")
    await speech(studio, "aria", instructions="A whispering voice.")  # a one-off design: live
    assert studio.output().count("http request ok: voice aria, ") == live + 1

    # Another process on the same folders (a restart) reuses the stored anchor byte for
    # byte; with its Base model off, presets are designed live and still speak.
    (home / "restart").mkdir()
    other = start_server(
        checkpoints, voices_dir, home / "restart" / "server.log",
        extra=["--no-zeroconf", "--custom-voice-model", "none", "--clone-model", "none",
               "--anchors", "used", "--api-key", KEY, "--data-dir", str(home / "data")],
    )
    try:
        assert await call(other, "GET", "/v1/audio/voices/aria/sample") == first
        listed = await voices_of(other)
        assert listed["aria"]["served"] == "designed-live" and listed["aria"]["anchor"] == "ready"
        assert frames_ok(len(await speech(other, "aria")) // 2)
        assert frames_ok(await wyoming_samples(other, "nova"))
        log = other.output()
        assert "Rendering the anchor" not in log and "presets are designed live" in log
        assert "voice aria (anchor)" not in log
    finally:
        stop_server(other)


@pytest.mark.full
async def test_a_new_description_gets_a_new_anchor(studio: Server, folders: tuple[Path, Path]) -> None:
    voices_dir, home = folders
    status, before = await call(studio, "GET", "/v1/audio/voices/aria/sample")
    assert status == 200
    with (voices_dir / "presets.toml").open("a", encoding="utf-8") as presets:
        presets.write('\n[aria]\nlanguage = "en"\ninstruct = "A deep, rough male voice."\n')
    status, changed = await call(studio, "GET", "/v1/audio/voices/aria/sample")
    assert status == 200 and changed != before
    meta = [json.loads(p.read_text()) for p in (home / "data" / "anchors").glob("*.json") if p.name != "model-digests.json"]
    assert {m["instruct"] for m in meta if m["preset"] == "aria"} >= {"A deep, rough male voice."}
    aria = (await voices_of(studio))["aria"]
    assert aria["source"] == "user" and "alloy" in aria["aliases"] and aria["served"] == "anchor"


@pytest.mark.full
async def test_on_the_cpu_a_kept_design_keeps_the_clip_heard_and_no_anchor_is_rendered(
    checkpoints: Path, tmp_path: Path
) -> None:
    """The CPU default, ``--anchors auto`` (``kept``), as the README's try-it server runs:
    no anchor is rendered (each would take minutes there), shipped presets are designed
    live and have no sample, but a design kept in the studio keeps the candidate's clip as
    its anchor and is spoken by the Base model from it."""
    voices = tmp_path / "voices"
    voices.mkdir()
    srv = start_server(checkpoints, voices, tmp_path / "server.log",
                       extra=["--no-zeroconf", "--custom-voice-model", "none", "--api-key", KEY, "--voice", "ALLOY"])
    try:
        status, body = await call(srv, "GET", "/v1/audio/voices")
        assert json.loads(body)["default"] == "aria"  # --voice by alias, any case: the voice's own name
        assert json.loads(body)["default_pinned"] is True  # chosen with --voice: the studio keeps it
        listed = await voices_of(srv)
        assert listed["aria"]["served"] == "designed-live" and listed["aria"]["anchor"] == "off"
        status, body = await call(srv, "GET", "/v1/audio/voices/aria/sample")
        assert status == 404 and json.loads(body)["error"]["code"] == "no-sample"
        request = {"description": "A bright young voice.", "language": "en", "text": "Hello there.", "count": 1, "seed": 7}
        status, body = await call(srv, "POST", "/v1/audio/designs", json=request)
        assert status == 200, body
        candidate = json.loads(body)["candidates"][0]
        status, heard = await call(srv, "GET", "/" + candidate["sample"])
        assert status == 200
        status, body = await call(srv, "POST", f"/v1/audio/designs/{candidate['id']}/keep", json={"name": "bright"})
        assert status == 201, body
        assert json.loads(body)["served"] == "anchor"
        assert await call(srv, "GET", "/v1/audio/voices/bright/sample") == (200, heard)
        assert frames_ok(len(await speech(srv, "bright")) // 2)
        log = srv.output()
        assert "voice bright (anchor)" in log and "Rendering the anchor" not in log
        assert "this mode renders none" in log and "--anchors auto chooses it on the CPU, where one anchor takes minutes" in log
    finally:
        stop_server(srv)


# --- a server that starts with no voice -------------------------------------------------------


async def _wyoming_exchange(client: AsyncTcpClient, *events: Any, until: str) -> list[Any]:
    """Send ``events`` on an open connection; the events answered up to ``until`` (or an error)."""
    for event in events:
        await client.write_event(event.event())
    answered = []
    while True:
        event = await asyncio.wait_for(client.read_event(), 300)
        assert event is not None, f"the server closed the connection after {[e.type for e in answered]}"
        answered.append(event)
        if event.type == until or Error.is_type(event.type):
            return answered


@pytest.mark.full
async def test_the_clone_model_alone_with_no_clip_starts_and_its_first_upload_is_spoken(
    checkpoints: Path, tmp_path: Path
) -> None:
    """A new user who enables only the clone model has no clip yet: the server starts all the
    same (with its studio, which is where the first clip comes from), says so in one WARNING
    naming the studio's address and the clips it skipped, describes itself with no voice,
    refuses speech on both doors with how to add one (connection and server staying up),
    and speaks the first uploaded clip at once, as its default voice, without a restart.
    That default is automatic (no --voice): the studio may delete it, and when its clip is
    gone another voice is picked by the same rule, on both doors and in the listing."""
    from wyoming.tts import SynthesizeChunk, SynthesizeStart, SynthesizeStop

    from wyoming_qwen3tts.common.audio import SAMPLE_RATE as RATE

    voices = tmp_path / "voices"
    voices.mkdir()
    (voices / "later.txt").write_text("A transcript, its clip not copied yet.")
    (voices / "broken.wav").write_bytes(b"RIFF....not a wav file")
    sf.write(voices / "tab\there.wav", tone(1.5), 24000)  # a name with a control character
    sf.write(voices / "hush.wav", np.zeros(24000, np.float32), 24000)  # a readable header, but silent
    srv = start_server(
        checkpoints, voices, tmp_path / "server.log",
        extra=["--no-zeroconf", "--design-model", "none", "--custom-voice-model", "none"],
    )
    try:
        log = srv.output()
        said = [line for line in log.splitlines() if "No voice yet" in line]
        assert len(said) == 1 and " WARNING " in said[0], log[-3000:]
        assert f"voice studio (http://127.0.0.1:{srv.http_port}/)" in said[0] and str(voices.resolve()) in said[0]
        assert "broken.wav (the file could not be decoded as audio: Format not recognised)" in said[0] and "'tab\\there.wav' (control characters in its name)" in said[0]
        assert "hush.wav (the clip is silent" in said[0] and said[0].count("broken.wav") == 1

        # Wyoming: a valid info with no voice; speech refused with the way out, then the
        # connection ends (a refused synthesize's end, as wyoming-piper's).
        async with AsyncTcpClient("127.0.0.1", srv.port) as client:
            info = Info.from_event((await _wyoming_exchange(client, Describe(), until="info"))[-1])
            assert len(info.tts) == 1 and info.tts[0].installed and info.tts[0].voices == []
            refused = await _wyoming_exchange(client, Synthesize(text="Hello there."), until="audio-stop")
            assert [e.type for e in refused] == ["error"]
            error = Error.from_event(refused[0])
            assert error.code == "no-voices" and "voice studio" in error.text, error
            assert f"http://127.0.0.1:{srv.http_port}/" in error.text
            assert await asyncio.wait_for(client.read_event(), 60) is None
        async with AsyncTcpClient("127.0.0.1", srv.port) as client:
            # Home Assistant's streaming path: an error for the start, then synthesize-stopped.
            await client.write_event(SynthesizeStart().event())
            stream = await _wyoming_exchange(client, until="audio-stop")
            assert Error.from_event(stream[0]).code == "no-voices"
            stopped = await _wyoming_exchange(
                client, SynthesizeChunk(text="Turned on the lights."), SynthesizeStop(), until="synthesize-stopped"
            )
            assert [e.type for e in stopped] == ["synthesize-stopped"]
            again = await _wyoming_exchange(client, Describe(), until="info")
            assert [e.type for e in again] == ["info"]

        # HTTP: empty listings, probes as usual, and OpenAI's error shape from the SDK.
        status, body = await call(srv, "GET", "/v1/audio/voices", auth=False)
        empty = {"default": None, "default_pinned": False, "voices": [], "voices_folder": str(voices.resolve()),
                 "default_served": True}
        skipped = json.loads(body).pop("skipped")
        assert status == 200 and {k: v for k, v in json.loads(body).items() if k != "skipped"} == empty  # the folder: the studio's hint names it
        assert [(c["name"], c["file"]) for c in skipped] == [
            ("broken", "broken.wav"), ("hush", "hush.wav"), ("later", "later.txt"), ("tab\there", "tab\there.wav")
        ], skipped  # later.txt: a transcript with no clip beside it, listed so the page can show and delete it
        status, described = await call(srv, "GET", "/openapi.json", auth=False)
        document = json.loads(described)
        listing = {**document["components"]["schemas"]["VoiceList"], "components": document["components"]}
        jsonschema.validate(json.loads(body), listing)  # the served description allows it
        assert (await call(srv, "GET", "/health", auth=False))[0] == 200
        status, body = await call(srv, "GET", "/ready", auth=False)
        assert status == 200 and json.loads(body)["status"] == "ready", body
        sdk = openai.AsyncOpenAI(base_url=f"{srv.http_url}/v1", api_key="unused", max_retries=0, timeout=300)
        with pytest.raises(openai.NotFoundError) as caught:
            await sdk.audio.speech.create(model="tts-1", voice="alloy", input="Hello there.")
        refusal = caught.value.body
        assert isinstance(refusal, dict) and refusal["code"] == "no-voices" and refusal["param"] == "voice", refusal
        assert "voice studio" in refusal["message"] and "VoiceDesign" in refusal["message"]  # why 'alloy' is none
        status, body = await call(srv, "POST", "/v1/audio/speech", auth=False, json={"input": "Hi"})
        error_body = json.loads(body)["error"]
        assert status == 404 and error_body["code"] == "no-voices" and error_body["type"] == "invalid_request_error"

        # The first clip, uploaded in the studio: spoken at once over both doors, as the default voice.
        status, body = await call(
            srv, "POST", "/v1/audio/voices", auth=False, data=upload("First", encoded(tone(2.0), "wav"), "Hello, this is me.")
        )
        assert status == 201, body
        status, body = await call(srv, "GET", "/v1/audio/voices", auth=False)
        listing = json.loads(body)
        assert listing["default"] == "First" and [v["name"] for v in listing["voices"]] == ["First"]
        async with AsyncTcpClient("127.0.0.1", srv.port) as client:
            info = Info.from_event((await _wyoming_exchange(client, Describe(), until="info"))[-1])
            assert [v.name for v in info.tts[0].voices] == ["First"]
            spoken = await _wyoming_exchange(client, Synthesize(text=TEXT), until="audio-stop")  # no voice: the default
            chunks = [AudioChunk.from_event(e) for e in spoken if AudioChunk.is_type(e.type)]
            assert chunks and {(c.rate, c.width, c.channels) for c in chunks} == {(RATE, 2, 1)}, [e.type for e in spoken]
            assert frames_ok(sum(len(c.audio) for c in chunks) // 2)
        wav = await sdk.audio.speech.create(model="tts-1", voice="First", input=TEXT, response_format="wav")
        audio, rate = sf.read(io.BytesIO(wav.content), dtype="float32")
        assert rate == RATE and frames_ok(len(audio)) and np.abs(audio).max() > 0
        async with (
            aiohttp.ClientSession(timeout=_GUARD) as session,
            session.post(srv.http_url + "/v1/audio/speech", json={"input": TEXT, "response_format": "pcm"}) as resp,
        ):
            assert resp.status == 200 and resp.headers["X-Voice"] == "First"
            assert frames_ok(len(await resp.read()) // 2)
        await sdk.close()

        # An automatic default (no --voice) follows the rule: the studio may delete it, and
        # with no voice left, speech is refused as before (no-voices, not an unknown 'First').
        status, body = await call(srv, "DELETE", "/v1/audio/voices/First", auth=False)
        assert status == 200, body
        status, body = await call(srv, "GET", "/v1/audio/voices", auth=False)
        assert status == 200 and json.loads(body) == {**empty, "skipped": skipped}
        async with AsyncTcpClient("127.0.0.1", srv.port) as client:
            refused = await _wyoming_exchange(client, Synthesize(text="Hello there."), until="audio-stop")
            assert Error.from_event(refused[0]).code == "no-voices" and "First" not in Error.from_event(refused[0]).text
        # A new first clip, then its files removed by hand and another clip copied in: the
        # default is picked again (the user trial: 'Zed' stayed the default, every request
        # that named no voice was refused with unknown-voice 'Zed').
        status, body = await call(
            srv, "POST", "/v1/audio/voices", auth=False, data=upload("Zed", encoded(tone(2.0), "wav"), "Hello, this is me.")
        )
        assert status == 201, body
        assert json.loads((await call(srv, "GET", "/v1/audio/voices", auth=False))[1])["default"] == "Zed"
        for path in voices.glob("Zed.*"):
            path.unlink()
        async with AsyncTcpClient("127.0.0.1", srv.port) as client:
            refused = await _wyoming_exchange(client, Synthesize(text="Hello there."), until="audio-stop")
            error = Error.from_event(refused[0])
            assert error.code == "no-voices" and "Zed" not in error.text, error
        sf.write(voices / "Amy.wav", tone(2.0, freq=230.0), 24000)
        (voices / "Amy.txt").write_text(CLONE_TRANSCRIPT)
        status, body = await call(srv, "GET", "/v1/audio/voices", auth=False)
        listing = json.loads(body)
        assert listing["default"] == "Amy" and [v["name"] for v in listing["voices"]] == ["Amy"], listing
        assert await wyoming_voices(srv) == {"Amy"}
        async with AsyncTcpClient("127.0.0.1", srv.port) as client:  # Home Assistant names no voice
            spoken = await _wyoming_exchange(client, Synthesize(text=TEXT), until="audio-stop")
            assert not any(Error.is_type(e.type) for e in spoken), spoken
            assert frames_ok(sum(len(AudioChunk.from_event(e).audio) for e in spoken if AudioChunk.is_type(e.type)) // 2)
        async with (
            aiohttp.ClientSession(timeout=_GUARD) as session,
            session.post(srv.http_url + "/v1/audio/speech", json={"input": TEXT, "response_format": "pcm"}) as resp,
        ):
            assert resp.status == 200 and resp.headers["X-Voice"] == "Amy"
            await resp.read()
        # A voice added, then the default's clip removed while another is left: picked again at once.
        status, body = await call(
            srv, "POST", "/v1/audio/voices", auth=False, data=upload("Bob", encoded(tone(2.0), "wav"), "Hello, this is me.")
        )
        assert status == 201, body
        for path in voices.glob("Amy.*"):
            path.unlink()
        async with AsyncTcpClient("127.0.0.1", srv.port) as client:
            spoken = await _wyoming_exchange(client, Synthesize(text=TEXT), until="audio-stop")
            assert not any(Error.is_type(e.type) for e in spoken), spoken
        status, body = await call(srv, "GET", "/v1/audio/voices", auth=False)
        assert json.loads(body)["default"] == "Bob", body
        changes = [line.split(": ", 1)[1] for line in srv.output().splitlines() if "service.default_voice: Default voice:" in line]
        assert changes[-3:] == [  # each change logged once
            "Default voice: none, Zed is gone and no voice is left",
            "Default voice: Amy, the first voice added (--voice chooses another)",
            "Default voice: Bob, as Amy is gone (--voice chooses one to keep)",
        ], changes
        assert srv.alive()
    finally:
        stop_server(srv)
    assert "Traceback" not in srv.output()


# --- overrides of the default voice, an unreadable presets.toml, files of one voice name --------


def _voice_files(folder: Path) -> dict[str, bytes]:
    """``snapshot`` without the lock file (the first edit of a server makes it)."""
    return {name: data for name, data in snapshot(folder).items() if name != LOCK_FILE}


@pytest.mark.full
async def test_an_override_of_the_default_voice_can_be_deleted_and_the_shipped_preset_comes_back(
    studio: Server, folders: tuple[Path, Path]
) -> None:
    """A design kept as ``aria`` (the default voice, with ``replace``) overrides the shipped
    preset; deleting or renaming that override never removes the name, so it is allowed for
    the default voice too (it was refused with ``default-voice``, and the page hid Delete):
    the shipped ``aria``, with its aliases, is the default voice again. The listing marks
    such a user preset with ``overrides``."""
    import tomllib

    presets = folders[0] / "presets.toml"
    status, body = await call(studio, "GET", "/v1/audio/voices")
    assert json.loads(body)["default"] == "aria"
    request = {"description": "A robot voice", "language": "de", "text": "Hallo.", "count": 1}
    status, body = await call(studio, "POST", "/v1/audio/designs", json=request)
    assert status == 200, body
    candidate = json.loads(body)["candidates"][0]["id"]
    if (await voices_of(studio))["aria"]["source"] != "user":  # (an earlier test may have overridden it)
        status, body = await call(studio, "POST", f"/v1/audio/designs/{candidate}/keep", json={"name": "aria", "replace": True})
        assert status == 201, body
    listed = await voices_of(studio)
    assert listed["aria"]["source"] == "user" and listed["aria"]["overrides"] is True
    assert listed["aria"]["shadows"] == "shipped"
    assert {"alloy", "shimmer", "coral"} <= set(listed["aria"]["aliases"])
    assert "overrides" not in listed["clone"] and "overrides" not in listed["james"]
    assert listed["clone"]["shadows"] is None and "shadows" not in listed["james"]

    status, body = await call(studio, "DELETE", "/v1/audio/voices/aria")
    assert status == 200 and json.loads(body) == {"deleted": "aria"}, body
    status, body = await call(studio, "GET", "/v1/audio/voices")
    listing = json.loads(body)
    aria = next(v for v in listing["voices"] if v["name"] == "aria")
    assert listing["default"] == "aria" and aria["source"] == "shipped" and "overrides" not in aria
    assert "shadows" not in aria
    assert {"alloy", "shimmer", "coral"} <= set(aria["aliases"])
    assert "aria" not in {k.casefold() for k in tomllib.loads(presets.read_text())}
    assert "voice aria deleted; the shipped preset aria is back" in studio.output()
    async with (
        aiohttp.ClientSession(timeout=_GUARD) as session,
        session.post(studio.http_url + "/v1/audio/speech", json={"input": TEXT, "response_format": "pcm"}, headers=AUTH) as resp,
    ):
        assert resp.status == 200 and resp.headers["X-Voice"] == "aria"
        assert frames_ok(len(await resp.read()) // 2)

    # Renaming the override leaves the name to the shipped preset too.
    status, body = await call(studio, "POST", f"/v1/audio/designs/{candidate}/keep", json={"name": "aria", "replace": True})
    assert status == 201, body
    status, body = await call(studio, "PATCH", "/v1/audio/voices/alloy", json={"name": "robot"})
    assert status == 200 and json.loads(body)["name"] == "robot", body
    listed = await voices_of(studio)
    assert listed["aria"]["source"] == "shipped" and listed["robot"]["source"] == "user"
    assert listed["robot"]["overrides"] is False and listed["robot"]["shadows"] is None
    assert listed["robot"]["languages"] == ["de"]
    status, _ = await call(studio, "DELETE", "/v1/audio/voices/robot")
    assert status == 200


@pytest.mark.full
async def test_while_presets_toml_is_unreadable_no_edit_touches_a_name_it_may_hold(
    studio: Server, folders: tuple[Path, Path]
) -> None:
    """With a syntax error in the voices folder's presets.toml the catalogue serves none of
    its presets, so their names look free: a delete or rename of one said "There is no
    voice", and a clone could take a preset's name (shadowing the user's design once the
    file was fixed). Every such edit is refused with 409 ``presets-unreadable``, naming the
    file and the error, and changes nothing; a table with a mistake in a readable file still
    holds its name."""
    voices_dir = folders[0]
    presets = voices_dir / "presets.toml"
    original = presets.read_text() if presets.exists() else ""
    granny = '\n[Granny]\nlanguage = "en"\ninstruct = "An old woman\'s warm, slow voice."\n'
    presets.write_text(original + granny)
    status, body = await call(studio, "POST", "/v1/audio/voices", data=upload("d4 clone", encoded(tone(2.0), "wav"), "Words."))
    assert status == 201, body
    try:
        assert (await voices_of(studio))["Granny"]["source"] == "user"
        presets.write_text(original + granny + "[broken\n")
        before = _voice_files(voices_dir)
        for method, path, kwargs in [
            ("DELETE", "/v1/audio/voices/Granny", {}),
            ("PATCH", "/v1/audio/voices/Granny", {"json": {"name": "Nana"}}),
            ("PATCH", "/v1/audio/voices/d4%20clone", {"json": {"name": "Granny"}}),
            ("PATCH", "/v1/audio/voices/d4%20clone", {"json": {"name": "anything"}}),
            ("DELETE", "/v1/audio/voices/nobody", {}),
            ("POST", "/v1/audio/voices", {"data": upload("Granny", encoded(tone(2.0), "wav"))}),
        ]:
            status, data = await call(studio, method, path, **kwargs)
            error = json.loads(data)["error"]
            assert (status, error["code"]) == (409, "presets-unreadable"), (method, path, error)
            assert str(presets) in error["message"] and "line" in error["message"], error  # the file, the parse error
        assert _voice_files(voices_dir) == before

        presets.write_text(original + granny)  # fixed: the design and the clone as they were
        listed = await voices_of(studio)
        assert listed["Granny"]["source"] == "user" and listed["d4 clone"]["source"] == "clone"
        assert "takes the name of the preset Granny" not in studio.output()

        presets.write_text(original + granny + '\n[Halfdone]\nlanguage = "en"\n')  # no instruct: skipped
        for method, path, kwargs in [
            ("POST", "/v1/audio/voices", {"data": upload("halfdone", encoded(tone(2.0), "wav"))}),
            ("PATCH", "/v1/audio/voices/d4%20clone", {"json": {"name": "HalfDone"}}),
        ]:
            status, data = await call(studio, method, path, **kwargs)
            error = json.loads(data)["error"]
            assert (status, error["code"]) == (409, "name-taken") and "presets.toml" in error["message"], error
    finally:
        presets.write_text(original)
        status, _ = await call(studio, "DELETE", "/v1/audio/voices/d4%20clone")
        assert status == 200


@pytest.mark.full
async def test_deleting_a_clone_voice_removes_every_file_of_its_name(studio: Server, folders: tuple[Path, Path]) -> None:
    """``KIMBERLY.wav`` and ``kimberly.flac`` are one voice name (the first is spoken, the
    second ignored with a warning): a delete removed only the first, and the voice stayed,
    speaking from the second. Now it removes every file of the name, transcripts in any
    case included; a rename, which would leave the others speaking as the old name, is
    refused with ``duplicate-files`` and changes nothing."""
    voices_dir = folders[0]
    sf.write(voices_dir / "KIMBERLY.wav", tone(2.0, freq=150.0), 24000)
    (voices_dir / "KIMBERLY.txt").write_text(CLONE_TRANSCRIPT)
    sf.write(voices_dir / "kimberly.flac", tone(2.0, freq=260.0), 24000, format="FLAC")
    (voices_dir / "Kimberly.txt").write_text("Another transcript.")
    assert "KIMBERLY" in await voices_of(studio)

    before = _voice_files(voices_dir)
    status, data = await call(studio, "PATCH", "/v1/audio/voices/KIMBERLY", json={"name": "Kim"})
    error = json.loads(data)["error"]
    assert (status, error["code"]) == (409, "duplicate-files"), error
    # Only the other clip refuses it: a transcript alone never speaks.
    assert "kimberly.flac" in error["message"] and "Kimberly.txt" not in error["message"], error
    assert _voice_files(voices_dir) == before

    status, body = await call(studio, "DELETE", "/v1/audio/voices/kimberly")
    assert status == 200 and json.loads(body) == {"deleted": "KIMBERLY"}, body
    assert not [p.name for p in voices_dir.iterdir() if p.stem.casefold() == "kimberly"]
    assert not [n for n in await voices_of(studio) if n.casefold() == "kimberly"]
    status, body = await call(studio, "POST", "/v1/audio/speech", json={"input": TEXT, "voice": "kimberly"})
    assert status == 404 and json.loads(body)["error"]["code"] == "unknown-voice", body
    assert "also its files 'Kimberly.txt', 'kimberly.flac'" in studio.output()


@pytest.mark.full
async def test_a_transcript_attached_as_a_file_reads_as_the_voices_folder_reads_one(
    studio: Server, folders: tuple[Path, Path]
) -> None:
    """``curl -F transcript=@notes.txt`` with a file saved as Windows Notepad's "Unicode"
    (UTF-16 with a byte-order mark) was refused with Python's own words ("The form cannot be
    read: 'utf-8' codec can't decode byte 0xff ...", ``invalid-body``), though the voices
    folder reads such a transcript; a UTF-8 one's byte-order mark was kept in the saved text.
    Now an attached transcript decodes as a folder one (``voices.decode_transcript``), and one
    in another encoding is 400 ``invalid-transcript`` in plain words."""
    voices = folders[0]
    said = "Grüße aus Köln."
    for name, data in (("u16", codecs.BOM_UTF16_LE + said.encode("utf-16-le")), ("bom8", codecs.BOM_UTF8 + said.encode())):
        form = upload(name, encoded(tone(2.0), "wav"))
        form.add_field("transcript", data, filename="notes.txt", content_type="application/octet-stream")
        status, body = await call(studio, "POST", "/v1/audio/voices", data=form)
        assert status == 201, body
        assert (voices / f"{name}.txt").read_text(encoding="utf-8").strip() == said, name  # no BOM kept
    form = upload("ansi", encoded(tone(2.0), "wav"))
    form.add_field("transcript", said.encode("cp1252"), filename="notes.txt", content_type="application/octet-stream")
    status, body = await call(studio, "POST", "/v1/audio/voices", data=form)
    error = json.loads(body)["error"]
    assert (status, error["code"], error["param"]) == (400, "invalid-transcript", "transcript"), body
    assert error["message"] == "The transcript is not UTF-8 text, it was saved in another encoding; save it as UTF-8", body
    assert not list(voices.glob("ansi.*"))


@pytest.mark.full
@pytest.mark.parametrize("field", ["name", "file", "transcript"])
async def test_an_upload_with_a_field_twice_is_refused_and_keeps_nothing(
    studio: Server, folders: tuple[Path, Path], field: str
) -> None:
    """A form with two ``file`` (or ``name``, ``transcript``) parts was taken silently, the
    last one winning: which clip or name the user meant is not known. It is now 400
    ``duplicate-field`` naming the field, and nothing is kept."""
    form = upload("twice", encoded(tone(2.0), "wav"), "Hello there.")
    if field == "file":
        form.add_field("file", encoded(tone(2.0, freq=300.0), "wav"), filename="other.wav", content_type="application/octet-stream")
    else:
        form.add_field(field, "other")
    before = snapshot(folders[0])
    status, body = await call(studio, "POST", "/v1/audio/voices", data=form)
    error = json.loads(body)["error"]
    assert (status, error["code"], error["param"]) == (400, "duplicate-field", field), body
    assert snapshot(folders[0]) == before and "twice" not in await voices_of(studio)


@pytest.mark.full
async def test_a_rename_without_a_name_says_the_field_is_missing(studio: Server) -> None:
    """``PATCH /v1/audio/voices/clone {"nom": "x"}`` was told "The voice name is empty"
    (``invalid-name``): the field is missing, not empty."""
    status, body = await call(studio, "PATCH", "/v1/audio/voices/clone", json={"nom": "x"})
    error = json.loads(body)["error"]
    assert (status, error["code"], error["param"]) == (400, "missing-field", "name"), body
    assert (await voices_of(studio))["clone"]["name"] == "clone"


@pytest.mark.full
async def test_an_upload_with_a_transcript_removes_stale_ones_and_unread_transcripts_do_not_block_a_rename(
    studio: Server, folders: tuple[Path, Path]
) -> None:
    """Transcripts of a name in other cases or forms (``Orph.TXT``, ``"orph .txt"``) stayed
    beside an upload ``orph`` with its own transcript, and then refused its rename with
    ``duplicate-files`` (transcripts alone cannot speak). Now the upload removes them, and a
    rename moves the clip and the transcript read, removing transcripts of the old name the
    catalogue does not read (logged), instead of refusing."""
    voices_dir = folders[0]
    (voices_dir / "Orph.TXT").write_text("Stale words.")
    (voices_dir / "orph .txt").write_text("Older words.")
    status, body = await call(
        studio, "POST", "/v1/audio/voices", data=upload("orph", encoded(tone(2.0), "wav"), "new words")
    )
    assert status == 201, body
    assert sorted(p.name for p in voices_dir.iterdir() if "orph" in p.name.casefold()) == ["orph.txt", "orph.wav"]
    assert (voices_dir / "orph.txt").read_text() == "new words\n"
    (voices_dir / "ORPH.TXT").write_text("Unread: orph.txt is read.")  # copied in by hand later
    status, body = await call(studio, "PATCH", "/v1/audio/voices/orph", json={"name": "orph2"})
    assert status == 200 and json.loads(body)["name"] == "orph2", body
    assert sorted(p.name for p in voices_dir.iterdir() if "orph" in p.name.casefold()) == ["orph2.txt", "orph2.wav"]
    assert (voices_dir / "orph2.txt").read_text() == "new words\n"
    assert "Renaming clone voice orph to orph2: removing its unread transcripts 'ORPH.TXT'" in studio.output()
    assert "removing the transcripts 'Orph.TXT', 'orph .txt' left without a clip" in studio.output()
    status, _ = await call(studio, "DELETE", "/v1/audio/voices/orph2")
    assert status == 200


@pytest.mark.full
async def test_an_upload_without_a_transcript_never_reads_an_orphan_one_in_another_case(
    studio: Server, folders: tuple[Path, Path]
) -> None:
    """A transcript waiting for its clip (``Lonely.txt``) is read by a clip of its name in
    any case: an upload ``LONELY`` without a transcript removes it, as it removed
    ``LONELY.txt``, so the voice is cloned from the clip alone (x-vector), as asked."""
    voices_dir = folders[0]
    (voices_dir / "Lonely.txt").write_text("A transcript of some other clip.")
    status, body = await call(studio, "POST", "/v1/audio/voices", data=upload("LONELY", encoded(tone(2.0), "wav")))
    assert status == 201, body
    assert "x-vector only" in json.loads(body)["summary"], body
    assert sorted(p.name for p in voices_dir.iterdir() if p.stem.casefold() == "lonely") == ["LONELY.wav"]
    status, _ = await call(studio, "DELETE", "/v1/audio/voices/LONELY")
    assert status == 200


@pytest.mark.full
async def test_a_clip_named_with_spaces_or_decomposed_accents_is_listed_spoken_renamed_and_deleted_by_its_name(
    studio: Server, folders: tuple[Path, Path]
) -> None:
    """Clips copied into the folder as ``"trail .wav"`` (with ``"trail .txt"``) and as an NFD
    ``Renée.wav`` (macOS over Samba) are the voices ``trail`` and ``Renée`` (NFC): listed and
    described so, spoken when asked for as listed, with the space, or typed composed; an
    upload of ``Renée`` in NFC is refused as taken (no two voices that look alike); the
    studio renames ``trail`` (asked for as ``trail%20``) and deletes ``Renée`` (asked for in
    NFC), moving and removing the files as they are spelled."""
    voices = folders[0]
    nfc, nfd = "Ren\u00e9e", "Rene\u0301e"
    sf.write(voices / "trail .wav", tone(2.0, freq=210.0), 24000)
    (voices / "trail .txt").write_text("Trail speaking.")
    sf.write(voices / f"{nfd}.wav", tone(2.0, freq=230.0), 24000)
    listed = await voices_of(studio)
    assert {"trail", nfc} <= set(listed) and "trail " not in listed and nfd not in listed, sorted(listed)
    assert {"trail", nfc} <= await wyoming_voices(studio)
    assert frames_ok(len(await speech(studio, "trail ")) // 2)
    assert frames_ok(len(await speech(studio, nfc)) // 2)
    assert frames_ok(await wyoming_samples(studio, nfc))

    before = snapshot(voices)
    status, body = await call(studio, "POST", "/v1/audio/voices", data=upload(nfc, encoded(tone(2.0), "wav")))
    assert status == 409 and json.loads(body)["error"]["code"] == "name-taken", body
    assert snapshot(voices) == before

    status, body = await call(studio, "PATCH", "/v1/audio/voices/trail%20", json={"name": "trail moved"})
    assert status == 200 and json.loads(body)["name"] == "trail moved", body
    assert (voices / "trail moved.txt").read_text() == "Trail speaking." and (voices / "trail moved.wav").is_file()
    assert not (voices / "trail .wav").exists() and not (voices / "trail .txt").exists()
    status, body = await call(studio, "DELETE", "/v1/audio/voices/Ren%C3%A9e")
    assert status == 200 and json.loads(body) == {"deleted": nfc}, body
    assert not (voices / f"{nfd}.wav").exists()
    status, body = await call(studio, "DELETE", "/v1/audio/voices/trail%20moved")
    assert status == 200, body
    assert not {"trail", "trail moved", nfc} & set(await voices_of(studio))


@pytest.mark.full
async def test_clips_skipped_for_their_name_or_format_are_listed_and_deleted_alone_as_the_page_asks(
    studio: Server, folders: tuple[Path, Path]
) -> None:
    """``twin.mp3`` beside the ``twin.wav`` spoken, a clip whose name holds a tab, and a MIDI
    file were in the log only (the MIDI file not even there): the listing's ``skipped``, the
    studio page's Skipped files, did not show them, so a user saw no reason why they gave no
    voice. Now each is listed with its reason, in the listing's schema, and the page's Delete
    (``DELETE /v1/audio/voices/{name}?skipped=true``) removes it (with its transcript where
    no voice reads that) and never the clip spoken or its transcript, answering every file it
    removed (``files``: it named one clip only). A transcript with no clip beside it
    (``wavv.txt``, its clip misnamed) was not listed either: now it is, and deleted so."""
    voices = folders[0]
    sf.write(voices / "twin.wav", tone(2.0), 24000)
    (voices / "twin.txt").write_text(CLONE_TRANSCRIPT)
    (voices / "twin.mp3").write_bytes(encoded(tone(2.0, freq=260.0), "mp3"))
    sf.write(voices / "tab\tname.wav", tone(2.0), 24000)
    (voices / "tab\tname.txt").write_text("Tabbed.")
    (voices / "tune.mid").write_bytes(b"MThd\0\0\0\6\0\0\0\1\0\x60")
    (voices / "wavv.txt").write_text("Its clip is misnamed.")
    ours = {"twin.mp3", "tab\tname.wav", "tune.mid", "wavv.txt"}
    try:
        status, body = await call(studio, "GET", "/v1/audio/voices")
        listing = json.loads(body)
        skipped = {c["file"]: c for c in listing["skipped"] if c["file"] in ours}
        assert skipped == {
            "twin.mp3": {"name": "twin", "file": "twin.mp3", "reason": "twin.wav gives the same voice name and is used "
                         "instead (lossless .wav is preferred to lossy .mp3); rename or remove this file"},
            "tab\tname.wav": {"name": "tab\tname", "file": "tab\tname.wav",
                              "reason": "its name holds control characters; rename the file"},
            "tune.mid": {"name": "tune", "file": "tune.mid", "reason": skipped["tune.mid"]["reason"]},
            "wavv.txt": {"name": "wavv", "file": "wavv.txt", "reason": "no clip beside it: not a voice yet; add an "
                         "audio clip wavv.wav (or .flac, .mp3, .m4a, .ogg, ...)"},
        }, listing["skipped"]
        assert skipped["tune.mid"]["reason"].startswith("the voices folder does not read .mid files; save the clip "
                                                        "as tune.wav (or .flac, "), skipped
        status, described = await call(studio, "GET", "/openapi.json")
        document = json.loads(described)
        jsonschema.validate(listing, {**document["components"]["schemas"]["VoiceList"], "components": document["components"]})

        for name, file, files in [("twin", "twin.mp3", ["twin.mp3"]), ("tab%09name", "tab\tname.wav",
                                   ["tab\tname.txt", "tab\tname.wav"]), ("tune", "tune.mid", ["tune.mid"]),
                                  ("wavv", "wavv.txt", ["wavv.txt"])]:
            status, body = await call(studio, "DELETE", f"/v1/audio/voices/{name}?skipped=true")
            assert status == 200 and json.loads(body) == {"deleted": name.replace("%09", "\t"), "skipped": file,
                                                          "files": files}, body
        assert sorted(p.name for p in voices.iterdir() if p.stem in ("twin", "tab\tname", "tune", "wavv")) == [
            "twin.txt", "twin.wav"]
        status, body = await call(studio, "GET", "/v1/audio/voices")
        assert not ours & {c["file"] for c in json.loads(body)["skipped"]}, body
        assert (await voices_of(studio))["twin"]["summary"] == "Cloned voice twin (reference transcript)"
    finally:
        for leftover in ("twin.mp3", "tab\tname.wav", "tab\tname.txt", "tune.mid", "wavv.txt"):
            (voices / leftover).unlink(missing_ok=True)
        status, _ = await call(studio, "DELETE", "/v1/audio/voices/twin")
        assert status == 200


# --- voices in the place of another of their name ---------------------------------------------


def test_a_pinned_default_may_go_exactly_when_a_voice_of_its_name_lies_beneath_it(tmp_path: Path) -> None:
    """The listing's ``shadows`` names what a voice of the user's is spoken in place of: a
    clone over a shipped preset (``lena``), a built-in speaker (``ryan``) or the user's
    preset (``camille``, itself over the shipped one), a user preset over a shipped one
    (``mateo``). Deleting or renaming such a voice leaves the name served, so a default voice
    chosen with ``--voice`` may go then; a clone over nothing (``solo``) stays protected.
    A default clone ``lena`` over the shipped preset was refused with ``default-voice``
    (the page hid Delete), though a user preset in its place could go."""
    from wyoming_qwen3tts.catalogue.library import VoiceEditError, VoiceLibrary
    from wyoming_qwen3tts.common.metrics import Metrics
    from wyoming_qwen3tts.service.speech import TtsService
    from wyoming_qwen3tts.doors.http.studio import listed_voice
    from wyoming_qwen3tts.common.vocabulary import ModelKind
    from wyoming_qwen3tts.catalogue.voices import VoiceCatalog, VoiceSource

    for name in ("lena", "ryan", "camille", "solo"):
        sf.write(tmp_path / f"{name}.wav", tone(1.0), 24000)
    (tmp_path / "presets.toml").write_text(
        '[mateo]\nlanguage = "es"\ninstruct = "A robot voice."\n\n[camille]\nlanguage = "fr"\ninstruct = "A calm voice."\n'
    )
    kinds = {ModelKind.BASE, ModelKind.VOICE_DESIGN, ModelKind.CUSTOM_VOICE}
    catalog = VoiceCatalog(tmp_path, kinds, custom_speakers=["ryan"])
    service = TtsService(catalog, {}, "lena", Metrics(), default_explicit=True)
    listed = {v.name: listed_voice(service, v) for v in catalog.voices()}
    shadows = {name: listed[name].get("shadows", "absent") for name in ("lena", "ryan", "camille", "mateo", "solo", "aria")}
    assert shadows == {"lena": "shipped", "ryan": "builtin", "camille": "user", "mateo": "shipped", "solo": None, "aria": "absent"}
    assert "overrides" not in listed["lena"] and listed["mateo"]["overrides"] is True

    library = VoiceLibrary(catalog, lambda: service.pinned_default)
    assert library.delete("lena").source is VoiceSource.CLONE  # refused with default-voice before
    assert catalog.get("lena").source is VoiceSource.SHIPPED and service.default_voice == "lena"
    with pytest.raises(VoiceEditError) as refused:  # the shipped preset itself stays
        library.delete("lena")
    assert refused.value.code == "shipped-preset"

    for default, edit in [("ryan", lambda: library.rename("ryan", "ryan two")), ("camille", lambda: library.delete("camille"))]:
        service = TtsService(catalog, {}, default, Metrics(), default_explicit=True)
        library = VoiceLibrary(catalog, lambda: service.pinned_default)
        edit()
        assert catalog.get(default).source is not VoiceSource.CLONE and service.default_voice == default
    assert catalog.get("ryan").source is VoiceSource.BUILTIN and catalog.get("camille").source is VoiceSource.USER

    service = TtsService(catalog, {}, "solo", Metrics(), default_explicit=True)
    library = VoiceLibrary(catalog, lambda: service.pinned_default)
    for edit in (lambda: library.delete("solo"), lambda: library.rename("solo", "duo")):
        with pytest.raises(VoiceEditError) as refused:
            edit()
        assert (refused.value.status, refused.value.code) == (409, "default-voice")

    # Without the VoiceDesign model no preset is served: a clone lena takes no name, and
    # as the --voice default it stays.
    sf.write(tmp_path / "lena.wav", tone(1.0), 24000)
    clones_only = VoiceCatalog(tmp_path, {ModelKind.BASE})
    service = TtsService(clones_only, {}, "lena", Metrics(), default_explicit=True)
    assert listed_voice(service, clones_only.get("lena"))["shadows"] is None
    with pytest.raises(VoiceEditError) as refused:
        VoiceLibrary(clones_only, lambda: service.pinned_default).delete("lena")
    assert refused.value.code == "default-voice"
    # An upload under a shipped preset's name is refused there too: with a clone's way to
    # take it, not "replace": true (a kept design's, and no design is kept without the model).
    with pytest.raises(VoiceEditError) as refused:
        VoiceLibrary(clones_only, lambda: service.pinned_default).check_free("aria", replace_skipped=True)
    message = str(refused.value)
    assert refused.value.code == "name-taken" and "replace" not in message and str(tmp_path / "aria.wav") in message


@pytest.mark.full
async def test_a_gone_pinned_default_refuses_only_requests_it_would_have_spoken(checkpoints: Path, tmp_path: Path) -> None:
    """A skipped clip under a shipped preset's name: DELETE and an upload of the name are
    refused, saying how to clear it. With the --voice default's clip removed by hand, a request naming no voice is refused
    (default-voice-gone), and so is one naming the clone model alone (the default would have
    spoken it); one naming another model, or describing a voice, never used the default and
    is spoken as when it was served (it was refused with default-voice-gone)."""
    voices = tmp_path / "voices"
    voices.mkdir()
    for name in ("bob", "kim"):
        sf.write(voices / f"{name}.wav", tone(2.0), 24000)
    sf.write(voices / "lena.wav", tone(0.8), 24000)  # skipped, under a shipped preset's name
    srv = start_server(checkpoints, voices, tmp_path / "server.log", extra=["--no-zeroconf", "--voice", "bob"])
    try:
        # The skipped clip under a preset's name: the refusals say how to clear it (they did not).
        status, body = await call(srv, "DELETE", "/v1/audio/voices/lena", auth=False)
        error = json.loads(body)["error"]
        assert status == 403 and error["code"] == "shipped-preset" and "lena.wav" in error["message"], body
        assert "/v1/audio/voices/lena?skipped=true" in error["message"], body
        status, body = await call(srv, "POST", "/v1/audio/voices", auth=False, data=upload("lena", encoded(tone(2.0), "wav")))
        error = json.loads(body)["error"]
        assert status == 409 and error["code"] == "name-taken" and "skipped (" in error["message"], body
        assert "replace the file in the folder" in error["message"] and "?skipped=true" in error["message"], body
        status, body = await call(srv, "DELETE", "/v1/audio/voices/lena?skipped=true", auth=False)
        assert status == 200 and not (voices / "lena.wav").exists(), body
        (voices / "bob.wav").unlink()
        for refused in ({}, {"model": "qwen3-tts-clone"}):
            status, body = await call(srv, "POST", "/v1/audio/speech", auth=False, json={"input": "Hi", **refused})
            assert status == 404 and json.loads(body)["error"]["code"] == "default-voice-gone", (refused, body)
        for served, said in (({"model": "qwen3-tts-custom-voice"}, None), ({"model": "qwen3-tts-voice-design"}, None),
                             ({"instructions": "A calm low voice."}, "(designed)"),
                             ({"model": "qwen3-tts-voice-design", "instructions": "A calm low voice."}, "(designed)")):
            async with aiohttp.ClientSession() as session:
                async with session.post(f"{srv.http_url}/v1/audio/speech",
                                        json={"input": "Hi", "response_format": "pcm", **served}) as response:
                    body = await response.read()
                    assert response.status == 200, (served, body)
                    assert said is None or response.headers["X-Voice"] == said, (served, dict(response.headers))
            assert len(body) > 0
    finally:
        stop_server(srv)


@pytest.mark.full
async def test_a_skipped_clip_is_listed_replaced_by_an_upload_and_deleted_and_a_pinned_default_gone_says_so(
    checkpoints: Path, tmp_path: Path
) -> None:
    """A clip the server skips (0.8 s, under MIN_CLIP_SECONDS) blocked its name: DELETE said
    there was no such voice, an upload of the name said only that the file exists. Now the
    listing names it with the reason, an upload of its name replaces it (its stale transcript
    goes), DELETE on a skipped clip's name removes its files, and a rename onto one says it
    is skipped and how to replace it. Then the --voice default's clip is removed by hand:
    a request naming no voice gets default-voice-gone (not 'Unknown voice') on both doors,
    with how to fix it, the listing says default_served false, and the log warns once when
    it goes and once when it comes back."""
    voices = tmp_path / "voices"
    voices.mkdir()
    sf.write(voices / "bob.wav", tone(2.0), 24000)
    sf.write(voices / "tiny.wav", tone(0.8), 24000)
    (voices / "tiny.txt").write_text("Too short.")
    srv = start_server(
        checkpoints, voices, tmp_path / "server.log",
        extra=["--no-zeroconf", "--design-model", "none", "--custom-voice-model", "none", "--voice", "bob"],
    )
    try:
        status, body = await call(srv, "GET", "/v1/audio/voices", auth=False)
        listing = json.loads(body)
        assert [(c["name"], c["file"]) for c in listing["skipped"]] == [("tiny", "tiny.wav")], listing
        assert "0.80 s long, under the 1 s" in listing["skipped"][0]["reason"] and listing["default_served"] is True
        status, described = await call(srv, "GET", "/openapi.json", auth=False)
        document = json.loads(described)
        jsonschema.validate(listing, {**document["components"]["schemas"]["VoiceList"], "components": document["components"]})

        # A rename onto the skipped clip's name: refused, saying why and how to replace it.
        sf.write(voices / "kim.wav", tone(2.0), 24000)
        status, body = await call(srv, "PATCH", "/v1/audio/voices/kim", auth=False, json={"name": "tiny"})
        error = json.loads(body)["error"]
        assert status == 409 and error["code"] == "name-taken", body
        assert "skipped" in error["message"] and "0.80 s" in error["message"] and "to replace it" in error["message"]

        # An upload of its name replaces it (the old transcript goes with it), spoken at once.
        status, body = await call(srv, "POST", "/v1/audio/voices", auth=False, data=upload("tiny", encoded(tone(2.0), "wav")))
        assert status == 201, body
        assert sorted(p.name for p in voices.iterdir() if not p.name.startswith(".")) == ["bob.wav", "kim.wav", "tiny.wav"]
        status, body = await call(srv, "GET", "/v1/audio/voices", auth=False)
        assert json.loads(body)["skipped"] == [] and "tiny" in {v["name"] for v in json.loads(body)["voices"]}
        assert frames_ok(await wyoming_samples(srv, "tiny"))

        # DELETE on a skipped clip's name removes the clip and its transcripts.
        sf.write(voices / "Short.wav", tone(0.5), 24000)
        (voices / "short.txt").write_text("Too short.")
        (voices / "SHORT.TXT").write_text("Too short.")
        status, body = await call(srv, "GET", "/v1/audio/voices", auth=False)
        assert [c["file"] for c in json.loads(body)["skipped"]] == ["Short.wav"]
        status, body = await call(srv, "DELETE", "/v1/audio/voices/short", auth=False)
        assert status == 200 and json.loads(body) == {
            "deleted": "Short", "skipped": "Short.wav", "files": ["SHORT.TXT", "Short.wav", "short.txt"]}, body
        assert not any(p.stem.lower() == "short" for p in voices.iterdir())
        status, body = await call(srv, "DELETE", "/v1/audio/voices/short", auth=False)
        assert status == 404 and json.loads(body)["error"]["code"] == "unknown-voice"

        # The pinned default's clip removed by hand.
        (voices / "bob.wav").unlink()
        sdk = openai.AsyncOpenAI(base_url=f"{srv.http_url}/v1", api_key="unused", max_retries=0, timeout=300)
        for _ in range(2):
            status, body = await call(srv, "POST", "/v1/audio/speech", auth=False, json={"input": "Hi"})
            error = json.loads(body)["error"]
            assert status == 404 and error["code"] == "default-voice-gone", body
        message = error["message"]  # short, for Home Assistant's pipeline error; the log has the detail
        assert message == ("The default voice 'bob' (--voice) is no longer in the voices folder. Put it back, or "
                           "choose another default voice"), message
        async with AsyncTcpClient("127.0.0.1", srv.port) as client:
            refused = await _wyoming_exchange(client, Synthesize(text="Hello there."), until="audio-stop")
            assert Error.from_event(refused[0]).code == "default-voice-gone", refused
        assert len(await speech(srv, "kim")) > 0  # a voice named is served
        status, body = await call(srv, "GET", "/v1/audio/voices", auth=False)
        assert json.loads(body)["default"] == "bob" and json.loads(body)["default_served"] is False
        warned = [line for line in srv.output().splitlines() if "is no longer served" in line]
        assert len(warned) == 1 and " WARNING " in warned[0] and "put its clip back (bob.wav" in warned[0], warned
        assert "(--voice bob) is no longer served" in warned[0] and "available: kim" in warned[0], warned

        # Put back: spoken again, said once.
        sf.write(voices / "bob.wav", tone(2.0), 24000)
        audio = await sdk.audio.speech.create(model="tts-1", voice="", input="Hi", response_format="pcm")
        assert len(audio.content) > 0
        await sdk.audio.speech.create(model="tts-1", voice="", input="Hi", response_format="pcm")
        back = [line for line in srv.output().splitlines() if "is served again" in line]
        assert len(back) == 1 and " WARNING " in back[0] and "(--voice bob) is served again" in back[0], back
    finally:
        stop_server(srv)
