"""GPU memory on CUDA (``pytest -m gpu``): the defaults with 8 GB free while another process
holds the rest of the card (full-size random checkpoints, built by ``benchmarks/gpu.sh ckpt``),
50 swaps of two models taking turns with flat memory, the VoiceDesign model leaving and
coming back for a studio design, and float16 against float32."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from wyoming_qwen3tts.engine import Sampling, Segment, load_engine
from wyoming_qwen3tts.engine.batched.engine import BatchedEngine
from wyoming_qwen3tts.common.vocabulary import ModelKind

from .conftest import ROOT, Server, start_server, stop_server
from .engine_driver import Collect, run

pytestmark = pytest.mark.gpu

#: Full-size random checkpoints (``benchmarks/gpu.sh ckpt`` builds them).
FULL = Path(os.environ.get("QWEN3TTS_FULL_CHECKPOINTS", ROOT / ".ckpt" / "full"))


def _need_full(*kinds: str) -> None:
    missing = [k for k in kinds if not (FULL / k / "config.json").exists()]
    if missing:
        pytest.skip(f"full-size checkpoints {missing} not in {FULL} (benchmarks/gpu.sh ckpt builds them)")


def _speak(server: Server, body: dict[str, object], timeout: float = 180) -> bytes:
    request = urllib.request.Request(
        f"{server.http_url}/v1/audio/speech", data=json.dumps({"response_format": "pcm", **body}).encode(),
        headers={"content-type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=timeout) as resp:
        return bytes(resp.read())


@pytest.fixture
def eight_gb_free() -> Iterator[float]:
    """Another process holds all but 8 GiB of the GPU (as an LLM would); yields the GiB it left."""
    from benchmarks.memory import hold_gpu

    holder, free = hold_gpu(8.0)
    try:
        yield free
    finally:
        holder.kill()
        holder.wait(10)


def test_defaults_speak_every_voice_kind_with_8gb_free_held_by_another_process(
    voices_dir: Path, tmp_path: Path, eight_gb_free: float
) -> None:
    """1.7B Base and VoiceDesign in 8 GB free: the weight precision chosen is int8, with which
    both stay on the GPU (bfloat16 made them take turns), and a clone, a preset, a design
    (instructions) and the clone again are all spoken, with no model leaving."""
    _need_full("base", "voice_design")
    assert 7.5 < eight_gb_free < 8.5
    server = start_server(
        FULL, voices_dir, tmp_path / "server.log", device="cuda", timeout=400,
        extra=["--no-zeroconf", "--custom-voice-model", "none", "--anchors", "used", "--fixed-frames", "12"],
    )
    try:
        frames = 12 * 1920 * 2
        assert len(_speak(server, {"input": "A clone speaks.", "voice": "clone"})) == frames
        assert len(_speak(server, {"input": "A preset speaks.", "voice": "aria"})) == frames
        assert len(_speak(server, {"input": "A design speaks.", "voice": "aria", "instructions": "A deep, slow voice."})) == frames
        assert len(_speak(server, {"input": "The clone again.", "voice": "clone"})) == frames
        log = server.output()
        assert "Weight precision: int8" in log and "the VoiceDesign model stays in GPU memory" in log
        assert "left GPU memory" not in log and "do not fit on the GPU together" not in log
        assert "Traceback" not in log and "could not be loaded" not in log and server.alive()
    finally:
        stop_server(server)


def test_the_base_model_with_4gb_free_speaks_every_clip_of_a_library_of_thirteen(tmp_path: Path) -> None:
    """4 GB free (another process holds the rest): the 1.7B Base model alone, one stream. At
    stop 32 it prepared 13 clips at start (12 preset anchors and a clone), left the driver
    nothing, and every request then failed in ``cublasCreate``. Now clips are prepared only
    while ``PRIME_HEADROOM_BYTES`` stays free, the prompt worker's cuBLAS handle exists from the
    warm-up on, and each of 13 clips is spoken."""
    _need_full("base")
    import soundfile as sf

    from benchmarks.memory import hold_gpu

    voices = tmp_path / "voices"
    voices.mkdir()
    t = np.arange(3 * 24000) / 24000
    for i in range(13):
        tone = 0.2 * np.sin(2 * np.pi * (120 + 10 * i) * t) * (1 + 0.3 * np.sin(2 * np.pi * 3 * t))
        sf.write(voices / f"clip{i}.wav", tone.astype(np.float32), 24000)
        (voices / f"clip{i}.txt").write_text("This is a short reference recording for the test.")
    holder, free = hold_gpu(4.0)
    try:
        assert 3.5 < free < 4.5
        server = start_server(
            FULL, voices, tmp_path / "server.log", device="cuda", timeout=400,
            extra=["--no-zeroconf", "--custom-voice-model", "none", "--design-model", "none",
                   "--voice", "clip0", "--fixed-frames", "12"],
        )
        try:
            for i in range(13):
                assert len(_speak(server, {"input": f"Clip {i} speaks.", "voice": f"clip{i}"})) == 12 * 1920 * 2
            log = server.output()
            assert "CUBLAS_STATUS_ALLOC_FAILED" not in log and "out of GPU memory" not in log, log[-3000:]
            assert "Traceback" not in log and server.alive()
        finally:
            stop_server(server)
    finally:
        holder.kill()
        holder.wait(10)


def test_fifty_swaps_leave_gpu_memory_flat_and_the_streams_the_same(
    checkpoints: Path, voices_dir: Path, eight_gb_free: float
) -> None:
    """Base and VoiceDesign taking turns (tiny checkpoints, streams sized automatically),
    swapped 50 times by alternating a clone and a design: after each swap the memory this
    process holds (allocated, and the card's free memory as the driver reports it) stays
    within 50 MB of the first, and every load gets the same streams."""
    import asyncio
    import gc

    import torch

    from wyoming_qwen3tts.engine import Engine
    from wyoming_qwen3tts.engine.gpu.lease import GpuLease
    from wyoming_qwen3tts.engine.gpu.on_demand import OnDemandEngine
    from wyoming_qwen3tts.common.metrics import Metrics
    from wyoming_qwen3tts.service.speech import SpeechRequest, TtsService
    from wyoming_qwen3tts.common.vocabulary import Reference
    from wyoming_qwen3tts.catalogue.voices import VoiceCatalog

    lease = GpuLease()

    def loader(kind: ModelKind, folder: str) -> Any:
        return lambda shrink=1.0: load_engine(kind, checkpoints / folder, "cuda", 1, "batched", None, max_len=512, shrink=shrink)

    tone = 0.1 * np.sin(2 * np.pi * 220 * np.arange(24000) / 24000)
    clone_warm = Segment("Hello.", "auto", 2, seed=0, reference=Reference.from_audio(tone, 24000, None))
    design_warm = Segment("Hello.", "auto", 2, seed=0, instruct="A calm voice.")

    def warm(segment: Segment) -> Any:
        return lambda _engine: segment

    base = OnDemandEngine(ModelKind.BASE, 1, loader(ModelKind.BASE, "base"), warm(clone_warm), idle_s=None, lease=lease,
                          home=True, auto_streams=True)
    design = OnDemandEngine(ModelKind.VOICE_DESIGN, 1, loader(ModelKind.VOICE_DESIGN, "voice_design"), warm(design_warm),
                            idle_s=60, lease=lease, auto_streams=True)
    base.warm(clone_warm)
    design.warm(design_warm)
    kinds = {ModelKind.BASE, ModelKind.VOICE_DESIGN}
    engines: dict[ModelKind, Engine] = {ModelKind.BASE: base, ModelKind.VOICE_DESIGN: design}

    async def run() -> tuple[list[float], list[float], list[int], list[int]]:
        service = TtsService(VoiceCatalog(voices_dir, kinds), engines, "aria", Metrics(), fixed_frames=4)
        allocated, free, base_streams, design_streams = [], [], [], []
        try:
            for _ in range(25):
                for voice, kind in (("aria", ModelKind.VOICE_DESIGN), ("clone", ModelKind.BASE)):
                    async for _chunk in service.speak(SpeechRequest(voice=voice), "One short sentence."):
                        pass
                    engine = base if kind is ModelKind.BASE else design
                    assert engine.resident
                    (base_streams if kind is ModelKind.BASE else design_streams).append(engine.capacity)
                gc.collect()
                torch.cuda.synchronize()
                allocated.append(torch.cuda.memory_allocated() / 2**20)
                free.append(torch.cuda.mem_get_info()[0] / 2**20)
        finally:
            await asyncio.to_thread(service.stop)
        return allocated, free, base_streams, design_streams

    allocated, free, base_streams, design_streams = asyncio.run(run())
    assert base.loads >= 25 and design.loads >= 25
    print(f"after each pair of swaps: allocated MB {allocated}, free MB {free}")
    assert max(allocated) - min(allocated) < 50, allocated
    assert max(free) - min(free) < 50, free
    assert len(set(base_streams)) == 1 and len(set(design_streams)) == 1, (base_streams, design_streams)


def test_voice_design_leaves_and_comes_back_for_a_studio_design(checkpoints: Path, voices_dir: Path, tmp_path: Path) -> None:
    server = start_server(
        checkpoints, voices_dir, tmp_path / "server.log", device="cuda",
        extra=["--no-zeroconf", "--design-model-memory", "on-demand", "--design-model-idle", "1", "--anchors", "off"],
    )
    try:
        deadline = time.monotonic() + 30
        while "voice_design model left GPU memory" not in server.output() and time.monotonic() < deadline:
            time.sleep(0.2)
        assert "voice_design model left GPU memory (no work for 1 s)" in server.output()
        request = {"description": "A calm narrator.", "language": "en", "text": "Hello there.", "count": 1, "seed": 5}
        req = urllib.request.Request(f"{server.http_url}/v1/audio/designs", data=json.dumps(request).encode(),
                                     headers={"content-type": "application/json"})
        with urllib.request.urlopen(req, timeout=120) as resp:
            assert resp.status == 200 and json.loads(resp.read())["candidates"]
        assert "voice_design model: loading it into GPU memory for a waiting request" in server.output()
        assert len(_speak(server, {"input": "A clone, meanwhile.", "voice": "clone"})) > 0
    finally:
        stop_server(server)


def _codes(engine: BatchedEngine, segment: Segment) -> tuple[np.ndarray, Collect]:
    sink = Collect()
    codes = run(engine, {0: [(segment, sink)]}, record_codes=True)
    return np.stack(codes[0])[: sink.frames], sink


def test_float16_greedy_codes_equal_float32s_first_frames(checkpoints: Path) -> None:
    segment = Segment("Parity in half precision.", "english", 8, 2, seed=3, instruct="A calm voice.", sampling=Sampling.greedy())
    codes = {}
    for dtype in ("float32", "float16"):
        engine = load_engine(ModelKind.VOICE_DESIGN, checkpoints / "voice_design", "cuda", 1, "batched", 2, dtype=dtype, max_len=512)
        assert isinstance(engine, BatchedEngine)
        engine.warm(segment)
        codes[dtype], sink = _codes(engine, segment)
        assert np.isfinite(sink.pcm).all()
        del engine
    np.testing.assert_array_equal(codes["float16"][:4], codes["float32"][:4])


def test_float16_full_size_long_generation_stays_finite() -> None:
    _need_full("voice_design")
    engine = load_engine(ModelKind.VOICE_DESIGN, FULL / "voice_design", "cuda", 1, "batched", 2, dtype="float16", max_len=1024)
    assert isinstance(engine, BatchedEngine)
    segment = Segment("A long generation in half precision. " * 4, "english", 600, 600, seed=1, instruct="A deep voice.")
    engine.warm(Segment("Warm.", "english", 2, instruct="A voice."))
    codes, sink = _codes(engine, segment)
    pcm = sink.pcm
    assert sink.error is None and len(codes) >= 500
    assert np.isfinite(pcm).all() and float(np.abs(pcm).max()) > 0
    assert (codes >= 0).all() and (codes < 2048).all()
