"""The GGML engine (qwentts.cpp through the realtimetts-qwen-native-cpu wheel) on random
checkpoints converted by our own converter: every voice kind, chunks, seeds, cancellation,
clear errors, greedy float32 parity with qwen_tts, the engine choice, and both doors.

The checkpoints are ``checkpoint.GGML``: the tiny talker with a speaker encoder and codec of
the widths qwentts.cpp hard-codes (ECAPA 512/1536, codec latent 1024, RVQ hidden 512, DAC
1536..96); the plain tiny checkpoints' codec trips its shape asserts (a process abort).
"""

from __future__ import annotations

import asyncio
import logging
import re
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest

from wyoming_qwen3tts.common.audio import SAMPLES_PER_FRAME
from wyoming_qwen3tts.engine import ModelMismatchError, Sampling, Segment
from wyoming_qwen3tts.engine.cpu.ggml import GgmlEngine, native_support
from wyoming_qwen3tts.engine import loader
from wyoming_qwen3tts.common.vocabulary import ModelKind, Reference

from .conftest import CHECKPOINTS, CLONE_TRANSCRIPT, Server, build_checkpoints, chunk_times_at_once, start_server, stop_server

SUPPORTED, WHY = native_support()
pytestmark = pytest.mark.skipif(not SUPPORTED, reason=f"GGML engine unavailable: {WHY}")

#: Built once, like the tiny checkpoints (about 440 MB a kind, mostly the codec).
GGML_CHECKPOINTS = Path(os.environ.get("QWEN3TTS_TEST_GGML_CHECKPOINTS", CHECKPOINTS.parent / "ggml"))
TEXT = "Hello there, this is a test of the CPU engine."


@pytest.fixture(scope="session")
def ggml_checkpoints() -> Path:
    return build_checkpoints(GGML_CHECKPOINTS, "ggml")


@pytest.fixture(scope="session")
def gguf(ggml_checkpoints: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Q8_0 GGUF pairs of the three kinds, plus float32 CustomVoice ("custom_voice-F32")."""
    from wyoming_qwen3tts.gguf import convert

    out = tmp_path_factory.mktemp("gguf")
    pairs = {kind.value: convert(ggml_checkpoints / kind.value, out / kind.value, "Q8_0") for kind in ModelKind}
    pairs["custom_voice-F32"] = convert(ggml_checkpoints / "custom_voice", out / "cv-f32", "F32")
    return pairs


@pytest.fixture(scope="module")
def engines(gguf: dict[str, tuple[Path, Path]]) -> Iterator[dict[ModelKind, GgmlEngine]]:
    """One engine per kind; the Base one clones in context (ICL) where a clip has a transcript."""
    loaded = {kind: GgmlEngine(kind, *gguf[kind.value], chunk_frames=1, contexts=1, icl=True) for kind in ModelKind}
    yield loaded
    for engine in loaded.values():
        engine.close()


def _reference(transcript: str | None) -> Reference:
    t = np.arange(2 * 16000) / 16000  # 16 kHz: the engine resamples to 24 kHz
    return Reference.from_audio((0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 16000, transcript)


def _segment(kind: ModelKind, **kw: object) -> Segment:
    voice: dict[str, object] = {
        ModelKind.BASE: {"reference": _reference(CLONE_TRANSCRIPT)},
        ModelKind.CUSTOM_VOICE: {"speaker": "ryan"},
        ModelKind.VOICE_DESIGN: {"instruct": "A calm, low voice."},
    }[kind]
    return Segment(**{"text": TEXT, "language": "english", "max_new_tokens": 8, "seed": 7, **voice, **kw})  # type: ignore[arg-type]


def _speak(engine: GgmlEngine, segment: Segment) -> list[np.ndarray]:
    return list(engine.stream(segment))


@pytest.mark.full
@pytest.mark.parametrize(
    "kind, extra",
    [
        (ModelKind.BASE, {}),  # ICL: codes and x-vector of the clip, with its transcript
        (ModelKind.BASE, {"reference": _reference(None)}),  # x-vector only
        (ModelKind.CUSTOM_VOICE, {}),
        (ModelKind.CUSTOM_VOICE, {"instruct": "Speak slowly."}),
        (ModelKind.VOICE_DESIGN, {}),
    ],
    ids=["icl", "xvector", "speaker", "speaker-instruct", "design"],
)
def test_each_voice_kind_streams_whole_frames(engines: dict[ModelKind, GgmlEngine], kind: ModelKind, extra: dict) -> None:
    chunks = _speak(engines[kind], _segment(kind, **extra))
    assert chunks, "no audio"
    assert all(len(c) % SAMPLES_PER_FRAME == 0 and len(c) > 0 for c in chunks)
    assert len(chunks) >= 2, "audio came in one piece, not streamed"
    total = sum(len(c) for c in chunks) // SAMPLES_PER_FRAME
    assert 1 <= total <= 8  # max_new_tokens caps the codec frames
    audio = np.concatenate(chunks)
    assert audio.dtype == np.float32 and np.abs(audio).max() <= 1.0 and np.abs(audio).max() > 0.01


@pytest.mark.full
def test_clones_go_by_x_vector_unless_in_context_cloning_is_asked(
    engines: dict[ModelKind, GgmlEngine], gguf: dict[str, tuple[Path, Path]]
) -> None:
    """By default a clip with a transcript is cloned by its x-vector alone (no reference codes
    in the prompt: the native codec would run over the whole clip before each segment's first
    audio); with ``icl`` its codes and transcript go in too. What reaches the library is
    recorded at its ``stream`` call."""
    default = GgmlEngine(ModelKind.BASE, *gguf["base"], chunk_frames=1, contexts=1)
    try:
        asked: dict[str, list[str]] = {}
        for name, engine in (("default", default), ("icl", engines[ModelKind.BASE])):
            context = engine._contexts[0]
            real = context.stream
            context.stream = lambda real=real, name=name, **kw: (asked.setdefault(name, sorted(kw)), real(**kw))[1]
            try:
                assert _speak(engine, _segment(ModelKind.BASE)), name
            finally:
                del context.stream
        assert "ref_spk_emb" in asked["default"] and "ref_codes" not in asked["default"] and "ref_text" not in asked["default"]
        assert {"ref_spk_emb", "ref_codes", "ref_text"} <= set(asked["icl"])
        # prime: an ICL engine generates once with the clip's codes on every context (its
        # first-time decode of the clip is paid at start); an x-vector one only extracts.
        primed: dict[str, list[list[str]]] = {"default": [], "icl": []}
        clip = _reference("A new clip, primed before serving.")
        for name, engine in (("default", default), ("icl", engines[ModelKind.BASE])):
            for context in engine._contexts:
                real = context.stream
                context.stream = lambda real=real, name=name, **kw: (primed[name].append(sorted(kw)), real(**kw))[1]
            try:
                assert engine.prime(clip)
            finally:
                for context in engine._contexts:
                    del context.stream
        assert primed["default"] == [] and len(primed["icl"]) == len(engines[ModelKind.BASE]._contexts)
        assert all("ref_codes" in kw for kw in primed["icl"])
        assert "clones by x-vector" in default.backend and "clones in context" in engines[ModelKind.BASE].backend
    finally:
        default.close()


@pytest.mark.full
def test_a_seed_replays_byte_for_byte(engines: dict[ModelKind, GgmlEngine]) -> None:
    engine = engines[ModelKind.CUSTOM_VOICE]
    first = np.concatenate(_speak(engine, _segment(ModelKind.CUSTOM_VOICE, seed=1234)))
    again = np.concatenate(_speak(engine, _segment(ModelKind.CUSTOM_VOICE, seed=1234)))
    other = np.concatenate(_speak(engine, _segment(ModelKind.CUSTOM_VOICE, seed=99)))
    assert first.tobytes() == again.tobytes()
    assert first.tobytes() != other.tobytes()


@pytest.mark.full
def test_the_language_reaches_the_prompt(engines: dict[ModelKind, GgmlEngine]) -> None:
    engine = engines[ModelKind.CUSTOM_VOICE]
    english = np.concatenate(_speak(engine, _segment(ModelKind.CUSTOM_VOICE, language="english")))
    german = np.concatenate(_speak(engine, _segment(ModelKind.CUSTOM_VOICE, language="german")))
    assert english.tobytes() != german.tobytes()


@pytest.mark.full
def test_cancel_stops_within_a_chunk_and_the_context_serves_on(engines: dict[ModelKind, GgmlEngine]) -> None:
    engine = engines[ModelKind.VOICE_DESIGN]
    flag = threading.Event()
    stream = engine.stream(_segment(ModelKind.VOICE_DESIGN, max_new_tokens=200), cancelled=flag.is_set)
    first = next(stream)
    assert len(first) > 0
    flag.set()  # the client left
    started = time.monotonic()
    rest = list(stream)
    assert time.monotonic() - started < 5.0
    assert sum(len(c) for c in rest) < 8 * SAMPLES_PER_FRAME  # at most the chunks already in flight
    assert _speak(engine, _segment(ModelKind.VOICE_DESIGN))  # the context is free again


@pytest.mark.full
def test_unknown_speaker_and_bad_files_give_clear_errors(
    engines: dict[ModelKind, GgmlEngine], gguf: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    with pytest.raises(ValueError, match="unknown speaker 'nobody'.*ryan"):
        _speak(engines[ModelKind.CUSTOM_VOICE], _segment(ModelKind.CUSTOM_VOICE, speaker="nobody"))
    bad = tmp_path / "qwen-talker-bad.gguf"
    bad.write_bytes(b"GGUF but not really")
    with pytest.raises(ValueError, match="not a Qwen3-TTS talker GGUF"):
        GgmlEngine(ModelKind.BASE, bad, gguf["base"][1], chunk_frames=1)
    with pytest.raises(ModelMismatchError, match="custom_voice.*expected 'base'"):
        GgmlEngine(ModelKind.BASE, *gguf["custom_voice"], chunk_frames=1)



@pytest.mark.full
def test_checkpoints_narrower_than_the_release_are_refused_not_crashed(checkpoints: Path, tmp_path: Path) -> None:
    """The tiny test checkpoints' codec is narrower than qwentts.cpp's hard-coded widths: the
    engine says so (and ``--engine auto`` falls back to the reference engine for it)."""
    from wyoming_qwen3tts.engine.cpu.ggml import NativeWidthError
    from wyoming_qwen3tts.gguf import convert

    pair = convert(checkpoints / "base", tmp_path, "Q8_0")
    with pytest.raises(NativeWidthError, match="--engine reference"):
        GgmlEngine(ModelKind.BASE, *pair, chunk_frames=1)


@pytest.mark.full
def test_greedy_float32_frames_equal_qwen_tts(ggml_checkpoints: Path, gguf: dict[str, tuple[Path, Path]]) -> None:
    """Greedy, float32, no repetition penalty: each 80 ms frame of the GGML engine's audio
    matches qwen_tts's (the PyTorch reference) for the same prompt. The codes themselves are
    not exposed by the library, so the check is on the decoded audio: equal codes decode to
    the same frame up to qwentts.cpp's float16 convolution kernels (correlation > 0.999,
    measured 0.9999), while one differing code changes its frames completely."""
    import torch
    from qwen_tts import Qwen3TTSModel

    engine = GgmlEngine(ModelKind.CUSTOM_VOICE, *gguf["custom_voice-F32"], chunk_frames=1, contexts=1)
    greedy = Sampling(0.0, 50, 1.0, 1.0, 0.0, 50, 1.0)
    ours = np.concatenate(_speak(engine, _segment(ModelKind.CUSTOM_VOICE, sampling=greedy, max_new_tokens=10)))
    engine.close()
    qwen = Qwen3TTSModel.from_pretrained(str(ggml_checkpoints / "custom_voice"), device_map="cpu", dtype=torch.float32)
    wavs, _ = qwen.generate_custom_voice(
        text=TEXT, speaker="ryan", language="english", max_new_tokens=10, do_sample=False,
        subtalker_dosample=False, repetition_penalty=1.0, non_streaming_mode=True,
    )
    theirs = np.asarray(wavs[0], dtype=np.float32)
    frames = min(len(ours), len(theirs)) // SAMPLES_PER_FRAME
    assert frames >= 5
    for f in range(frames):
        a = ours[f * SAMPLES_PER_FRAME : (f + 1) * SAMPLES_PER_FRAME]
        b = theirs[f * SAMPLES_PER_FRAME : (f + 1) * SAMPLES_PER_FRAME]
        assert np.corrcoef(a, b)[0, 1] > 0.999, f"frame {f} differs"


@pytest.mark.parametrize(
    "support, device, expected, line",
    [
        ((True, "ok"), "cpu", "ggml", "Engine on the CPU: ggml"),  # the pipeline engine refused (below)
        ((False, "the CPU lacks AVX2"), "cpu", "reference", "because the CPU lacks AVX2"),
        ((False, "the qwentts.cpp wheel (realtimetts-qwen-native-cpu) does not load: No module"), "cpu", "reference", "does not load"),
        ((True, "ok"), "cuda", "batched", "because a CUDA GPU is available"),
    ],
    ids=["wheel-and-avx2", "no-avx2", "no-wheel", "cuda"],
)
def test_auto_picks_the_engine_and_says_why(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, support, device, expected, line
) -> None:
    """The wheel's and the reference's turn: the pipeline engine cannot run (its own pick:
    ``test_pipeline_engine.test_auto_picks_the_pipeline_engine_and_falls_back_saying_why``)."""
    from wyoming_qwen3tts.engine.cpu import ggml, pipeline_load

    monkeypatch.setattr(ggml, "native_support", lambda: support)
    monkeypatch.setattr(pipeline_load, "pipeline_support", lambda: (False, "test: no pipeline"))
    monkeypatch.setattr(loader, "_ggml_why", None)
    _clear_picks()
    with caplog.at_level(logging.INFO, logger="wyoming_qwen3tts.engine.loader"):
        assert loader.pick_engine("auto", device) == expected
        if expected == "ggml":  # said once a GGML engine has loaded (a model may fall back before)
            assert line not in caplog.text
            loader._say_ggml_chosen()
    _clear_picks()
    assert line in caplog.text
    if not support[0]:
        with pytest.raises(ValueError, match="GGML engine cannot run here"):
            loader.pick_engine("ggml", "cpu")


def test_the_ggml_line_waits_for_a_ggml_engine_to_load(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, tmp_path: Path
) -> None:
    """``auto`` on the CPU picks the GGML engine before any model is looked at; a checkpoint
    qwentts.cpp cannot run (its GGUF files narrower than the release) then goes to the
    reference engine: "Engine on the CPU: ggml" is logged by the first GGML engine that
    loads, once, and never by one that failed. (A real start-up whose only model falls back:
    ``test_named_models_on_the_cpu_get_nothing_added_and_narrow_ones_are_not_converted``.)"""
    from wyoming_qwen3tts.engine.cpu import ggml, pipeline_load

    monkeypatch.setattr(pipeline_load, "pipeline_support", lambda: (False, "test: no pipeline"))
    made: list[ModelKind] = []

    def fake_engine(kind: ModelKind, talker: Path, *args: object, **kwargs: object) -> object:
        if talker.name == "narrow.gguf":
            raise ggml.NativeWidthError("tok_dec.pre_conv.weight is 16 wide; this checkpoint needs --engine reference")
        made.append(kind)
        return object()

    monkeypatch.setattr(ggml, "native_support", lambda: (True, "qwentts.cpp test loads"))
    monkeypatch.setattr(ggml, "GgmlEngine", fake_engine)
    monkeypatch.setattr(loader, "_ggml_why", None)
    _clear_picks()
    narrow, wide = (tmp_path / "narrow.gguf", tmp_path / "codec.gguf"), (tmp_path / "talker.gguf", tmp_path / "codec.gguf")
    line = "Engine on the CPU: ggml (qwentts.cpp), because qwentts.cpp test loads"
    try:
        with caplog.at_level(logging.DEBUG, logger="wyoming_qwen3tts.engine.loader"):
            assert loader.pick_engine("auto", "cpu") == "ggml"
            assert "Engine on the CPU" not in caplog.text
            with pytest.raises(ggml.NativeWidthError):
                loader.load_engine(ModelKind.BASE, tmp_path, "cpu", 1, "ggml", gguf=narrow)
            assert "Engine on the CPU" not in caplog.text  # that model goes elsewhere
            loader.load_engine(ModelKind.CUSTOM_VOICE, tmp_path, "cpu", 1, "ggml", gguf=wide)
            loader.load_engine(ModelKind.VOICE_DESIGN, tmp_path, "cpu", 1, "ggml", gguf=wide)
    finally:
        _clear_picks()
    assert made == [ModelKind.CUSTOM_VOICE, ModelKind.VOICE_DESIGN]
    infos = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO and "pipeline" not in r.getMessage()]
    assert infos == [line], infos  # once, after the first GGML engine loaded


def _clear_picks() -> None:
    """Forget the engine picks ``loader`` caches (each logged once a process)."""
    for cached in (loader._auto_engine, loader._pipeline_engine, loader._wheel_or_reference):
        cached.cache_clear()


def test_native_support_reads_the_cpu_flags(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from wyoming_qwen3tts.engine.cpu import ggml

    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor : 0\nflags : fpu sse2 avx fma f16c\n")
    real = Path.read_text
    monkeypatch.setattr(ggml.platform, "machine", lambda: "x86_64")
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: real(cpuinfo if str(self) == "/proc/cpuinfo" else self, *a, **k))
    ok, why = ggml.native_support()
    assert not ok and "AVX2/BMI2" in why


@pytest.fixture(scope="module")
def ggml_server(ggml_checkpoints: Path, voices_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """The server as a user starts it on the CPU: ``--engine ggml`` on checkpoint folders,
    converted to Q8_0 GGUF into the data folder at start-up; streams and threads chosen from
    the machine (``cpu.machine.plan``); the clone voice ``clone`` as the default voice."""
    folder = tmp_path_factory.mktemp("server-ggml")
    srv = start_server(
        ggml_checkpoints, voices_dir, folder / "server.log", engine="ggml",
        extra=[
            "--no-zeroconf", "--anchors", "off", "--design-model", "none",
            "--voice", "clone",
        ],
    )
    yield srv
    stop_server(srv)


@pytest.mark.full
def test_both_doors_speak_and_a_seed_replays(ggml_server: Server) -> None:
    import openai
    from wyoming.audio import AudioChunk, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.tts import Synthesize, SynthesizeVoice

    log = ggml_server.output()
    assert "Converting" in log and "GGML" in log
    # the defaults from the machine in plain words (at least 2 streams: a second client is heard at once)
    assert re.search(r"INFO .*CPU engine, custom_voice model: [2-4] requests at once, \d threads? each, .*core", log), log[-3000:]
    assert "a stream (" not in log[: log.index("Ready: Wyoming")]  # the reasons: at DEBUG only
    assert re.search(r"[2-4] stream\(s\) x [12] threads", log)
    start = log[: log.index("Ready: Wyoming")]
    assert "[GGUF]" not in start and "[KVCache]" not in start  # the native loader's lines: at DEBUG only

    async def wyoming(voice: str) -> list[int]:
        sizes: list[int] = []
        async with AsyncTcpClient("127.0.0.1", ggml_server.port) as client:
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
    # Every context loaded its speaker and codec encoders in the warm-up: the first clone
    # requests print no loader lines. The default voice's clip was extracted at start (its
    # line at DEBUG): only the other clip's one "[SpkExtract]" line is printed while serving.
    served = ggml_server.output()[len(start):]
    assert not any(tag in served for tag in ("[WeightCtx]", "[SpeakerEncoder]", "[SEANet]")), served[-3000:]
    assert "Default voice clone: its clip prepared" in start and served.count("[SpkExtract]") == 1, served[-3000:]
    client = openai.OpenAI(base_url=f"{ggml_server.http_url}/v1", api_key="unused")

    def speak(seed: int) -> bytes:
        return client.audio.speech.create(
            model="tts-1", voice="ryan", input=TEXT, response_format="pcm", extra_body={"seed": seed}
        ).read()

    assert speak(5) == speak(5) != speak(6)
    with pytest.raises(openai.NotFoundError, match="Unknown voice .nobody."):
        client.audio.speech.create(model="tts-1", voice="nobody", input=TEXT, response_format="pcm")
    # leave mid-stream: the server cancels, logs it, and serves the next request
    with client.audio.speech.with_streaming_response.create(
        model="tts-1", voice="ryan", input=TEXT * 6, response_format="pcm"
    ) as response:
        next(response.iter_bytes(4096))
    deadline = time.monotonic() + 60
    while "cancelled" not in ggml_server.output() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert "cancelled" in ggml_server.output()
    assert len(speak(5)) > 0 and ggml_server.alive()


@pytest.mark.full
def test_two_clients_of_one_model_are_heard_at_once(ggml_server: Server) -> None:
    """A Wyoming client and an OpenAI client ask the same model for one long sentence each,
    at once: each hears its first audio before the other's reply ends (with one native
    context the second waited for the whole first reply: 43 s in the issue's trial)."""
    text = "Welcome home, the door is locked"  # one sentence: with one context the second waits for all of it
    w, o = chunk_times_at_once(ggml_server, text)
    assert len(w) >= 2 and len(o) >= 2
    assert w[0] < o[-1] and o[0] < w[-1], (w[0], w[-1], o[0], o[-1])  # neither waited for the other's whole reply


def test_threads_split_between_generation_and_the_codec() -> None:
    from wyoming_qwen3tts.engine.cpu.ggml import thread_split

    assert thread_split(1) == (1, 0)  # one thread: the codec takes turns with generation
    assert [thread_split(n) for n in (2, 3, 4, 8)] == [(1, 1), (2, 1), (2, 2), (4, 4)]
    assert all(sum(thread_split(n)) == n for n in range(2, 65))


@pytest.mark.full
def test_a_thread_count_per_stream_is_taken_and_checked(gguf: dict[str, tuple[Path, Path]]) -> None:
    """``--ggml-threads``: 3 (2 generating, 1 decoding) speaks; more generating
    threads than CPUs is refused before the library sees them."""
    if (os.cpu_count() or 1) < 2:
        pytest.skip("one CPU: 2 generating threads are more than it has")
    engine = GgmlEngine(ModelKind.CUSTOM_VOICE, *gguf["custom_voice"], chunk_frames=1, contexts=1, threads=3)
    try:
        assert "1 stream(s) x 3 threads" in engine.backend
        assert sum(len(c) for c in _speak(engine, _segment(ModelKind.CUSTOM_VOICE))) > 0
    finally:
        engine.close()
    with pytest.raises(ValueError, match="more than twice this machine's"):
        GgmlEngine(ModelKind.CUSTOM_VOICE, *gguf["custom_voice"], chunk_frames=1, contexts=1, threads=2 * (os.cpu_count() or 1) + 2)


# Fast set: the GGML engine's smoke tests, on a real server process (it converts the checkpoints,
# warms every context up and serves Wyoming).
def test_the_wyoming_program_description_names_the_shared_engine_once(ggml_server: Server) -> None:
    """Home Assistant shows the TTS program's description: the Base and CustomVoice models
    share the GGML engine, which it names once, with what is the Base model's own after it
    (the user trial: "qwentts.cpp GGML on the CPU (Q8_0, 2 stream(s) x 2 threads),
    qwentts.cpp GGML on the CPU (Q8_0, 2 stream(s) x 2 threads, clones by x-vector)")."""
    from wyoming.client import AsyncTcpClient
    from wyoming.info import Info

    from .test_wyoming import describe

    async def info() -> Info:
        async with AsyncTcpClient("127.0.0.1", ggml_server.port) as client:
            return await describe(client)

    (program,) = asyncio.run(info()).tts
    description = program.description or ""
    assert description.count("qwentts.cpp GGML") == 1 and "stream(s)" not in description, description
    assert re.fullmatch(r"Qwen3-TTS on qwentts\.cpp GGML on the CPU \(Q8_0, .*\): base model .*clones by x-vector", description), description


def test_the_ggml_server_holds_no_torch(ggml_server: Server) -> None:
    """It converted the checkpoints (in a child process) and served: PyTorch never entered
    its process (its shared library would be mapped)."""
    assert "Converting" in ggml_server.output()
    maps = Path(f"/proc/{ggml_server.proc.pid}/maps")
    if not maps.exists():
        pytest.skip("no /proc here")
    assert "libtorch" not in maps.read_text()


class _Sink:
    """Records when audio arrived and how the segment ended."""

    def __init__(self, meet: threading.Barrier | None = None) -> None:
        self.meet = meet  # waited at the first chunk
        self.first: float | None = None
        self.ended: float | None = None
        self.samples = 0
        self.error: BaseException | None = None
        self.finished = threading.Event()

    def cancelled(self) -> bool:
        return False

    def audio(self, chunk: np.ndarray) -> None:
        if self.first is None:
            self.first = time.monotonic()
            if self.meet is not None:
                self.meet.wait()  # BrokenBarrierError: fails this segment
        self.samples += len(chunk)

    def done(self, frames: int) -> None:
        self.ended = time.monotonic()
        self.finished.set()

    def failed(self, error: BaseException) -> None:
        self.error = error
        self.finished.set()


class _Source:
    """A work list handed out once, then closed when every sink finished (a test double of
    the scheduler: only the order of ``take`` calls matters here)."""

    def __init__(self, works: list) -> None:
        self._all = list(works)
        self._works = list(works)
        self._lock = threading.Lock()

    def take(self, wait: float | None):
        with self._lock:
            if self._works:
                return self._works.pop(0)
        time.sleep(0.05)
        return None

    def closed(self) -> bool:
        with self._lock:
            return not self._works and all(w.sink.finished.is_set() for w in self._all)


@pytest.mark.full
def test_two_contexts_generate_two_streams_at_once(gguf: dict[str, tuple[Path, Path]]) -> None:
    from wyoming_qwen3tts.engine import Work

    engine = GgmlEngine(ModelKind.CUSTOM_VOICE, *gguf["custom_voice"], chunk_frames=1, contexts=2, threads=1)
    try:
        assert engine.capacity == 2 and "2 stream(s)" in engine.backend
        # The first two wait at their first chunk until both have one (each on its own
        # context's thread): on a loaded machine one context could otherwise finish its 20
        # frames before the other's thread ran, and the overlap checked below was luck. Two
        # contexts that do not run at once never meet there: the wait times out and fails.
        both = threading.Barrier(2, timeout=60)
        works = [Work(_segment(ModelKind.CUSTOM_VOICE, max_new_tokens=20, seed=s), sink)
                 for s, sink in ((1, _Sink(both)), (2, _Sink(both)), (3, _Sink()))]
        engine.start(_Source(works))
        engine.join(120)
        sinks = [w.sink for w in works]
        assert all(s.error is None and s.samples > 0 for s in sinks)
        a, b, c = sinks
        assert a.first < b.ended and b.first < a.ended  # the first two overlapped
        assert c.first > min(a.ended, b.ended)  # the third waited for a free context
    finally:
        engine.close()


def test_cpu_defaults_swap_only_models_not_named() -> None:
    from wyoming_qwen3tts.__main__ import DEFAULT_MODELS
    from wyoming_qwen3tts.engine.cpu.defaults import cpu_default_voice, cpu_sources

    swapped = cpu_sources(dict(DEFAULT_MODELS), given=set())
    assert swapped == {
        ModelKind.BASE: "Qwen/Qwen3-TTS-12Hz-0.6B-Base",
        ModelKind.VOICE_DESIGN: "Qwen/Qwen3-TTS-12Hz-1.7B-VoiceDesign",
        ModelKind.CUSTOM_VOICE: "Qwen/Qwen3-TTS-12Hz-0.6B-CustomVoice",
    }
    assert cpu_sources(dict(DEFAULT_MODELS), given=set(ModelKind)) == DEFAULT_MODELS
    assert cpu_default_voice(["aiden", "ryan"], "aria") == "ryan"
    assert cpu_default_voice([], "aria") == "aria"


@pytest.mark.full
def test_named_models_on_the_cpu_get_nothing_added_and_narrow_ones_are_not_converted(
    checkpoints: Path, tmp_path: Path
) -> None:
    """A user who names a Base folder on a CPU machine gets that model and nothing more (no
    CustomVoice model fetched for the CPU defaults, which would fail offline); under
    ``--engine auto`` (the pipeline engine here) a checkpoint narrower than the release (the
    GGUF converter and the wheel's clone extraction take only its widths) goes to the reference engine
    before any GGUF conversion (read from its config), with one line saying why. (The GGML
    engine's own fallback: ``test_cli.test_a_cpu_start_whose_every_model_fell_back_says_so``.)"""
    import subprocess
    import sys

    import soundfile as sf

    voices, data, log = tmp_path / "voices", tmp_path / "data", tmp_path / "server.log"
    voices.mkdir()
    t = np.arange(2 * 24000) / 24000
    sf.write(voices / "clone.wav", (0.2 * np.sin(2 * np.pi * 180 * t)).astype(np.float32), 24000)
    (voices / "clone.txt").write_text(CLONE_TRANSCRIPT)
    args = [
        sys.executable, "-m", "wyoming_qwen3tts", "--uri", "tcp://127.0.0.1:0", "--http-port", "0",
        "--data-dir", str(data), "--voices-dir", str(voices), "--no-zeroconf", "--local-files-only",
        "--clone-model", str(checkpoints / "base"), "--design-model", "none", "--device", "cpu", "--engine", "auto",
    ]
    with log.open("w") as handle:
        proc = subprocess.Popen(args, stdout=handle, stderr=subprocess.STDOUT, cwd=tmp_path)
    try:
        deadline = time.monotonic() + 180
        while "Ready: Wyoming" not in log.read_text() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        output = log.read_text()
        assert "Ready: Wyoming" in output, output[-3000:]
    finally:
        proc.terminate()
        proc.wait(20)
    assert "Loading custom_voice" not in output and "No GPU and no model named" not in output, output[-3000:]
    assert ("The base model runs on the reference engine (slower), not on the pipeline engine: its codec's "
            "codebook_dim is") in output, output[-3000:]
    # Every engine line is true: the only model runs on the reference engine, and nothing
    # said "Engine on the CPU: pipeline" (or ggml) before start-up found that out.
    engine_lines = [line for line in output.splitlines() if "engine" in line.lower()]
    assert engine_lines and all("reference engine" in line for line in engine_lines), engine_lines
    assert "ggml (qwentts.cpp)" not in output and "Engine on the CPU: pipeline" not in output, output[:2000]
    assert "our ggml graphs generating on one thread" not in output, output[:2000]
    assert "needs --engine reference" not in output  # the fallback happened: no instruction to give
    assert "GGML, CPU" not in output and not list(data.rglob("*.gguf"))


@pytest.mark.full
def test_4_bit_generation_weights_load_and_stream(ggml_checkpoints: Path, tmp_path: Path) -> None:
    """``Q4_0``: the talker's and code predictor's layer matrices 4-bit, the codec file the
    ``Q8_0`` one (same name, so models of both formats find it); the library loads and streams it."""
    from gguf import GGMLQuantizationType, GGUFReader

    from wyoming_qwen3tts.gguf import convert

    talker, codec = convert(ggml_checkpoints / "custom_voice", tmp_path, "Q4_0")
    assert talker.name.endswith("-Q4_0.gguf") and codec.name == "qwen-tokenizer-12hz-Q8_0.gguf"
    types = {t.name: t.tensor_type for t in GGUFReader(str(talker)).tensors}
    # (the tiny talker's narrower matrices, rows not a multiple of 32 values, stay F16)
    assert types["talker.blk.0.ffn_gate.weight"] == types["code_pred.blk.0.ffn_down.weight"] == GGMLQuantizationType.Q4_0
    assert types["talker.codec_head.weight"] == GGMLQuantizationType.Q8_0  # heads stay 8-bit
    engine = GgmlEngine(ModelKind.CUSTOM_VOICE, talker, codec, chunk_frames=1, contexts=1, quant="Q4_0")
    try:
        chunks = _speak(engine, _segment(ModelKind.CUSTOM_VOICE))
        assert len(chunks) >= 2 and all(len(c) == SAMPLES_PER_FRAME for c in chunks[:-1])
        assert "Q4_0" in engine.backend and "4-bit weights" in engine.plan.describe()
    finally:
        engine.close()


@pytest.mark.full
def test_the_codec_streamed_frame_by_frame_equals_the_reference_decoder(
    ggml_checkpoints: Path, gguf: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """The codec that serves the GGML engine (qwentts.cpp's own, streaming one frame a chunk)
    against the reference decoder (qwen_tts's, PyTorch float32, the whole sequence at once) on
    the same codes: the generation's greedy codes, which the library writes to ``dump_dir``.
    float32 weights, so what differs is qwentts.cpp's float16 convolutions; one wrong frame
    boundary (a lost or repeated past sample) would differ by the signal itself."""
    import torch
    from qwen_tts import Qwen3TTSModel

    engine = GgmlEngine(ModelKind.CUSTOM_VOICE, *gguf["custom_voice-F32"], chunk_frames=1, contexts=1)
    try:
        chunks = [np.asarray(c, np.float32) for c, _ in engine._contexts[0].stream(
            text=TEXT * 2, speaker="ryan", lang="english", seed=0, max_new_tokens=40, do_sample=False,
            subtalker_do_sample=False, repetition_penalty=1.0, dump_dir=str(tmp_path),
        )]
    finally:
        engine.close()
    raw = np.fromfile(tmp_path / "codes-full.bin", dtype=np.int32)  # int32 ndim, dims, float32 values
    codes = raw[1 + raw[0]:].view(np.float32).reshape([int(d) for d in raw[1 : 1 + raw[0]]]).astype(np.int64)
    assert codes.shape[1] == 16 and codes.shape[0] >= 20 and len(chunks) == codes.shape[0]
    assert all(len(c) == SAMPLES_PER_FRAME for c in chunks)  # frame by frame
    qwen = Qwen3TTSModel.from_pretrained(str(ggml_checkpoints / "custom_voice"), device_map="cpu", dtype=torch.float32)
    with torch.inference_mode():
        whole = qwen.model.speech_tokenizer.model.decoder(torch.from_numpy(codes.T.copy())[None])[0, 0].numpy()
    streamed = np.concatenate(chunks)
    assert streamed.shape == whole.shape
    scale = float(np.abs(whole).max())
    assert scale > 0 and float(np.abs(streamed - whole).max()) < 0.02 * scale, float(np.abs(streamed - whole).max()) / scale


class _Queue:
    """Work handed out as it is put, until ``close`` (a test double of the scheduler)."""

    def __init__(self) -> None:
        import queue

        self._queue: queue.Queue = queue.Queue()
        self._closed = threading.Event()

    def put(self, work: object) -> None:
        self._queue.put(work)

    def take(self, wait: float | None):
        import queue

        try:
            return self._queue.get(timeout=wait)
        except queue.Empty:
            return None

    def close(self) -> None:
        self._closed.set()

    def closed(self) -> bool:
        return self._closed.is_set()


@pytest.mark.full
def test_a_clip_handed_over_while_serving_is_prepared_between_requests_on_every_context(
    gguf: dict[str, tuple[Path, Path]],
) -> None:
    """``prime_later`` (a default voice chosen after start) on an ICL engine of two contexts
    that serves: it returns at once; the idle context prepares the clip (one generation with
    the clip's codes, which makes it decode the clip) while the other's request is in
    progress; that context does it only after its request ended; then the clip is prepared
    (the future says True, a second call has nothing to do). A clip replaced before it was
    prepared says False; an x-vector clip is extracted once, by one context."""
    from wyoming_qwen3tts.engine import Work

    engine = GgmlEngine(ModelKind.BASE, *gguf["base"], chunk_frames=1, contexts=2, threads=1, icl=True)
    index = {id(c): i for i, c in enumerate(engine._contexts)}
    events: list[tuple[str, int, str]] = []  # (start/end, context, clip: "held", "new" or other)
    clips = {"held": _reference(None), "new": _reference("A default voice chosen while serving.")}

    def label(kw: dict) -> str:
        if "ref_codes" in kw:
            return "new" if kw.get("ref_text") == clips["new"].transcript else "other"
        return "held" if "ref_spk_emb" in kw else "other"

    for context in engine._contexts:
        real = context.stream

        def recording(real=real, context=context, **kw):  # type: ignore[no-untyped-def]
            events.append(("start", index[id(context)], label(kw)))
            try:
                yield from real(**kw)
            finally:
                events.append(("end", index[id(context)], label(kw)))

        context.stream = recording
    source = _Queue()
    held = threading.Event()

    class HeldSink(_Sink):
        def audio(self, chunk: np.ndarray) -> None:
            super().audio(chunk)
            held.wait(120)  # the request stays in progress until released

    sink = HeldSink()
    try:
        engine.start(source)
        source.put(Work(Segment("Hello there.", "english", 6, seed=1, reference=clips["held"]), sink))
        deadline = time.monotonic() + 120
        while sink.first is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert sink.first is not None
        busy = next(i for kind, i, what in events if kind == "start" and what == "held")
        future = engine.prime_later(clips["new"])
        assert future is not None
        while ("end", 1 - busy, "new") not in events and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ("end", 1 - busy, "new") in events  # the idle context prepared it meanwhile
        assert not future.done() and ("start", busy, "new") not in events  # not the busy one
        held.set()
        assert future.result(timeout=120) is True and sink.finished.wait(120) and sink.error is None
        while ("end", busy, "new") not in events and time.monotonic() < deadline + 120:
            time.sleep(0.05)  # ready at its first audio: its last frame may still be on its way
        mine = [(kind, what) for kind, i, what in events if i == busy]
        assert mine == [("start", "held"), ("end", "held"), ("start", "new"), ("end", "new")], events
        assert engine.prime_later(clips["new"]) is None  # prepared: nothing to do
        # A clip replaced before it was prepared: False; the one that replaced it: True.
        replaced = engine.prime_later(_reference("Replaced before it was prepared."))
        xvector = _reference(None)  # x-vector only: one extraction serves every context
        xvector = Reference.from_audio(xvector.audio[::-1].copy(), xvector.sample_rate, None)
        latest = engine.prime_later(xvector)
        assert replaced is not None and latest is not None
        assert replaced.result(timeout=120) is False and latest.result(timeout=120) is True
        assert engine.prime_later(xvector) is None
    finally:
        held.set()
        source.close()
        engine.join(120)
        engine.close()


def _waiting_in(function: str) -> bool:
    """Whether some thread waits (a future's result, a condition) inside ``function``."""
    import sys

    for frame in sys._current_frames().values():
        names = []
        while frame is not None:
            names.append(frame.f_code.co_name)
            frame = frame.f_back
        if function in names and "wait" in names[: names.index(function)]:
            return True
    return False


@pytest.mark.full
def test_a_request_racing_the_preparer_on_one_clip_shares_one_extraction(
    gguf: dict[str, tuple[Path, Path]],
) -> None:
    """A default clip replaced by hand and a request for it that reaches the server before
    the preparer's poll: the request's context and ``prime_later``'s idle context both
    found the clip missing and both extracted it at once (two "[SpkExtract]" lines; the
    request's first audio waited for both on two cores). Now the second waits for the first
    one's extraction: the clip is extracted once, the request speaks, the future says True."""
    from wyoming_qwen3tts.engine import Work

    engine = GgmlEngine(ModelKind.BASE, *gguf["base"], chunk_frames=1, contexts=2, threads=1)
    clip = _reference(None)
    clip = Reference.from_audio((clip.audio * 0.5).copy(), clip.sample_rate, None)  # a digest of its own
    gate, calls = threading.Event(), []
    for context in engine._contexts:
        real = context.extract_voice_ref

        def gated_extract(audio, real=real):  # type: ignore[no-untyped-def]
            calls.append(threading.get_ident())
            gate.wait(120)  # the first extraction stays in progress until the other caller came
            return real(audio)

        context.extract_voice_ref = gated_extract
    source, sink = _Queue(), _Sink()
    try:
        engine.start(source)
        source.put(Work(Segment("Hello there.", "english", 6, seed=1, reference=clip), sink))
        deadline = time.monotonic() + 120
        while not calls and time.monotonic() < deadline:
            time.sleep(0.02)
        future = engine.prime_later(clip)  # the preparer on the idle context, while it extracts
        assert future is not None
        while len(calls) < 2 and not _waiting_in("_voice_ref") and time.monotonic() < deadline:
            time.sleep(0.02)
        gate.set()
        assert future.result(timeout=120) is True
        assert sink.finished.wait(120) and sink.error is None and sink.samples > 0
        assert len(calls) == 1, calls  # one extraction for both
        assert engine.prime_later(clip) is None
    finally:
        gate.set()
        source.close()
        engine.join(120)
        engine.close()


@pytest.mark.full
def test_a_default_voice_chosen_while_serving_is_prepared_before_its_first_request(
    ggml_checkpoints: Path, gguf: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """The server as started with ``--ggml-icl``, the clone model alone and an empty voices
    folder (its studio takes the first clip): the first clip copied in becomes the default
    voice and is prepared between requests, before anyone asks for it (the log says so, as
    for a default at start), so a request naming no voice extracts nothing more (no new
    ``[SpkExtract]`` line of the library). Once that clip is removed the next default is
    picked and prepared the same way (or found prepared already, as a clip added while
    serving: ``test_a_clip_added_while_serving_...``). Without this only a default at start
    was prepared."""
    import soundfile as sf

    voices = tmp_path / "voices"
    voices.mkdir()
    server = start_server(
        ggml_checkpoints, voices, tmp_path / "server.log", engine="ggml",
        extra=[
            "--no-zeroconf", "--anchors", "off", "--design-model", "none", "--custom-voice-model", "none",
            "--clone-model", str(gguf["base"][0].parent), "--ggml-icl", "--ggml-streams", "2",
        ],
    )

    def copy_in(name: str, freq: float) -> None:
        t = np.arange(int(1.2 * 24000)) / 24000
        sf.write(voices / f".{name}.wav", (0.2 * np.sin(2 * np.pi * freq * t)).astype(np.float32), 24000, format="WAV")
        (voices / f"{name}.txt").write_text(f"Hello, this is {name}.")
        os.replace(voices / f".{name}.wav", voices / f"{name}.wav")

    def wait_for(line: str) -> str:
        deadline = time.monotonic() + 180
        while line not in server.output() and server.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        output = server.output()
        assert line in output, output[-3000:]
        return output

    async def speak_default() -> int:
        return await _speak_samples(server.port, None)

    try:
        assert "No voice yet" in server.output()
        copy_in("kim", 190.0)
        log = wait_for("Default voice kim: its clip prepared in")
        assert log.index("Default voice: kim, the first voice added") < log.index("Default voice kim: its clip prepared")
        extracted = log.count("[SpkExtract]")
        assert extracted == 1 + log[: log.index("Ready: Wyoming")].count("[SpkExtract]")  # kim's, while serving
        assert asyncio.run(speak_default()) > 0
        assert server.output().count("[SpkExtract]") == extracted  # kim's clip was ready

        copy_in("lee", 260.0)  # not the default: the first voice stays it
        os.remove(voices / "kim.wav")  # gone: the next one is picked, and prepared
        log = wait_for("Default voice lee: its clip prepared")  # in N s, or already (prepared as a new clip)
        assert "Default voice: lee, as kim is gone" in log
        extracted = log.count("[SpkExtract]")
        assert asyncio.run(speak_default()) > 0
        assert server.output().count("[SpkExtract]") == extracted
    finally:
        stop_server(server)


async def _speak_samples(port: int, voice: str | None) -> int:
    """Samples of one Wyoming ``synthesize`` of "Hello." in ``voice`` (None: the default)."""
    from wyoming.audio import AudioChunk, AudioStop
    from wyoming.client import AsyncTcpClient
    from wyoming.error import Error
    from wyoming.tts import Synthesize, SynthesizeVoice

    async with AsyncTcpClient("127.0.0.1", port) as client:
        named = SynthesizeVoice(name=voice) if voice is not None else None
        await client.write_event(Synthesize(text="Hello.", voice=named).event())
        samples = 0
        while True:
            event = await asyncio.wait_for(client.read_event(), 300)
            assert event is not None and not Error.is_type(event.type), event
            if AudioChunk.is_type(event.type):
                samples += len(AudioChunk.from_event(event).audio)
            if AudioStop.is_type(event.type):
                return samples


@pytest.mark.full
def test_a_clip_added_while_serving_is_prepared_before_its_first_request(
    ggml_checkpoints: Path, gguf: dict[str, tuple[Path, Path]], tmp_path: Path
) -> None:
    """On the GGML engine only the default voice's clip was prepared: a clip uploaded or
    copied in while serving had its first request wait while qwentts.cpp extracted it (a
    user's trial: 10.6 s for a 20 s clip on 2 cores). Now a clip that appears while serving
    is prepared between requests too (``clips.DefaultVoicePreparer``; the log says so), so its
    first request extracts nothing (no new ``[SpkExtract]`` line of the library); the clips
    there at start are not (only the default's, as before)."""
    import soundfile as sf

    voices = tmp_path / "voices"
    voices.mkdir()

    def copy_in(name: str, freq: float) -> None:  # no transcript: an x-vector clone
        t = np.arange(int(1.5 * 24000)) / 24000
        sf.write(voices / f".{name}.wav", (0.2 * np.sin(2 * np.pi * freq * t)).astype(np.float32), 24000, format="WAV")
        os.replace(voices / f".{name}.wav", voices / f"{name}.wav")

    copy_in("kim", 190.0)
    copy_in("old", 230.0)
    server = start_server(
        ggml_checkpoints, voices, tmp_path / "server.log", engine="ggml",
        extra=[
            "--no-zeroconf", "--anchors", "off", "--design-model", "none", "--custom-voice-model", "none",
            "--clone-model", str(gguf["base"][0].parent), "--voice", "kim",
        ],
    )

    async def speak(voice: str) -> int:
        return await _speak_samples(server.port, voice)

    try:
        at_start = server.output().count("[SpkExtract]")
        copy_in("lee", 260.0)
        deadline = time.monotonic() + 180
        while "Clone voice lee: its clip prepared in" not in server.output() and server.alive() and time.monotonic() < deadline:
            time.sleep(0.2)
        log = server.output()
        assert "Clone voice lee: its clip prepared in" in log, log[-3000:]
        assert "Clone voice old" not in log  # there at start: not prepared ahead
        extracted = log.count("[SpkExtract]")
        assert extracted == at_start + 1  # lee's, while serving
        assert asyncio.run(speak("lee")) > 0
        assert server.output().count("[SpkExtract]") == extracted  # lee's clip was ready
        assert asyncio.run(speak("old")) > 0
        assert server.output().count("[SpkExtract]") == extracted + 1  # old's, at its first request
    finally:
        stop_server(server)
