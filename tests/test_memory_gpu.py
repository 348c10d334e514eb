"""GPU memory on CUDA (``pytest -m gpu``): the defaults under an 8 GB cap (full-size random
checkpoints, built by ``benchmarks/gpu.sh ckpt``), the VoiceDesign model leaving and coming
back for a studio design, and float16 against float32."""

from __future__ import annotations

import json
import os
import subprocess
import time
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from wyoming_qwen3tts.engine import Sampling, Segment, load_engine
from wyoming_qwen3tts.engine.batched.engine import BatchedEngine
from wyoming_qwen3tts.voices import ModelKind

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


def _gpu_gb(pid: int) -> float:
    out = subprocess.run(["nvidia-smi", "--query-compute-apps=pid,used_memory", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True).stdout
    return sum(float(m) / 1024 for p, m in (line.split(",") for line in out.splitlines() if "," in line) if int(p) == pid)


def test_defaults_start_under_an_8gb_cap_and_speak_a_preset_and_a_clone(voices_dir: Path, tmp_path: Path) -> None:
    """1.7B Base and VoiceDesign do not fit together in 7.5 GB (an 8 GB card less its CUDA
    context): they take turns, and both a clone and a preset are spoken."""
    _need_full("base", "voice_design")
    server = start_server(
        FULL, voices_dir, tmp_path / "server.log", device="cuda", timeout=400,
        extra=["--no-zeroconf", "--custom-voice-model", "none", "--gpu-memory", "7.5", "--anchors", "used", "--fixed-frames", "12"],
    )
    try:
        peak = _gpu_gb(server.proc.pid)
        assert len(_speak(server, {"input": "A clone speaks.", "voice": "clone"})) == 12 * 1920 * 2
        peak = max(peak, _gpu_gb(server.proc.pid))
        assert len(_speak(server, {"input": "A preset speaks.", "voice": "aria"})) == 12 * 1920 * 2
        peak = max(peak, _gpu_gb(server.proc.pid))
        assert len(_speak(server, {"input": "The clone again.", "voice": "clone"})) == 12 * 1920 * 2
        peak = max(peak, _gpu_gb(server.proc.pid))
        log = server.output()
        assert "do not fit on the GPU together" in log
        assert "voice_design model is in GPU memory" in log and "left GPU memory (another model needs the GPU)" in log
        assert "Traceback" not in log and server.alive()
        # nvidia-smi counts the CUDA context too (about 0.5 GB on an 8 GB card, up to 0.8 GB on
        # the H200's 132 SMs), which --gpu-memory leaves out: 7.5 GB cap + context.
        assert peak <= 8.3, f"{peak:.2f} GB with a 7.5 GB cap"
    finally:
        stop_server(server)


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
