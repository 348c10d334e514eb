"""Turns probe (GPU; a diagnosis, not a test): does a Base model that leaves GPU memory, taking
turns with the VoiceDesign model, give its memory back?

In one process, through the real service and on-demand engines, on the full-size random
checkpoints (``.ckpt/full``), optionally under an allocator cap like the server's
``--gpu-memory`` (``CAP_GB=7.5``: streams then sized automatically, as the server does), and
optionally after ``gc.freeze()`` as the server does once its models are loaded (``FREEZE=1``).

``CAP_GB=7.5 python -m benchmarks.turns_probe`` prints GPU memory after each phase (loaded,
clones spoken, the preset designed live once the Base model left), whether the Base engine
object is still alive after it left, and the big CUDA tensors that remain.

On the H200 (2026-12-01, ``benchmarks/results/nvidia-h200/turns-probe/``) it spoke the preset
with and without the cap, where the real server under the same cap could not: the server froze
its models out of the garbage collector's reach (``gc.freeze``), so the Base model that left
was never collected. ``OnDemandEngine`` now thaws and collects when a model leaves.
"""

from __future__ import annotations

import asyncio
import gc
import logging
import os
import weakref
from pathlib import Path
from typing import Any

import numpy as np
import soundfile as sf
import torch

from wyoming_qwen3tts.engine import Engine, Segment, load_engine
from wyoming_qwen3tts.engine.gpu.lease import GpuLease
from wyoming_qwen3tts.engine.gpu.on_demand import OnDemandEngine
from wyoming_qwen3tts.common.metrics import Metrics
from wyoming_qwen3tts.service.speech import SpeechRequest, TtsService
from wyoming_qwen3tts.common.vocabulary import ModelKind, Reference
from wyoming_qwen3tts.catalogue.voices import VoiceCatalog

FULL = Path(os.environ.get("QWEN3TTS_FULL_CHECKPOINTS", ".ckpt/full"))
VOICES = Path("/tmp/turns-probe-voices")
SAMPLE_RATE = 24_000


async def _speak(service: TtsService, text: str, voice: str = "aria") -> int:
    """Samples of one request's audio."""
    samples = 0
    async for chunk in service.speak(SpeechRequest(voice=voice), text):
        samples += len(chunk)
    return samples


def _design_warm(_engine: Engine) -> Segment:
    return Segment("Hello.", "auto", 2, seed=0, instruct="A calm voice.")


def _clone_warm(_engine: Engine | None = None) -> Segment:
    tone = 0.1 * np.sin(2 * np.pi * 220 * np.arange(SAMPLE_RATE) / SAMPLE_RATE)
    return Segment("Hello.", "auto", 2, seed=0, reference=Reference.from_audio(tone, SAMPLE_RATE, None))


def _memory(tag: str) -> None:
    gc.collect()
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    print(f"{tag}: allocated {torch.cuda.memory_allocated() / 1e9:.2f} GB, "
          f"reserved {torch.cuda.memory_reserved() / 1e9:.2f} GB", flush=True)


async def main() -> None:
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    VOICES.mkdir(exist_ok=True)
    t = np.arange(3 * SAMPLE_RATE) / SAMPLE_RATE
    sf.write(VOICES / "clone.wav", (0.2 * np.sin(2 * np.pi * 190 * t)).astype("float32"), SAMPLE_RATE)
    (VOICES / "clone.txt").write_text("This is a short reference recording.")
    cap = float(os.environ.get("CAP_GB", "0"))
    if cap:
        torch.cuda.set_per_process_memory_fraction(cap * 1e9 / torch.cuda.mem_get_info()[1])

    def loader(kind: ModelKind, folder: str) -> Any:
        return lambda shrink=1.0: load_engine(
            kind, FULL / folder, "cuda", 4, "batched", None if cap else 4, max_len=1024, cap_gb=cap or None, shrink=shrink,
        )

    _memory("start")
    lease = GpuLease()
    base = OnDemandEngine(ModelKind.BASE, 4, loader(ModelKind.BASE, "base"), _clone_warm, idle_s=None,
                          lease=lease, home=True, auto_streams=bool(cap))
    design = OnDemandEngine(ModelKind.VOICE_DESIGN, 4, loader(ModelKind.VOICE_DESIGN, "voice_design"), _design_warm,
                            idle_s=60, lease=lease, auto_streams=bool(cap))
    await asyncio.to_thread(base.warm, _clone_warm())
    await asyncio.to_thread(design.warm, _design_warm(design))
    _memory("Base model loaded")
    assert base.inner is not None
    first = weakref.ref(base.inner)
    service = TtsService(VoiceCatalog(VOICES, {ModelKind.BASE, ModelKind.VOICE_DESIGN}),
                         {ModelKind.BASE: base, ModelKind.VOICE_DESIGN: design}, "aria", Metrics())
    if os.environ.get("FREEZE"):
        gc.freeze()  # as __main__ does once the models are loaded
    try:
        print("clone samples", await _speak(service, "A clone first.", voice="clone"), flush=True)
        clones = [_speak(service, f"Clone number {i} speaks.", voice="clone") for i in range(4)]
        print("4 clones' samples", await asyncio.gather(*clones), flush=True)
        _memory("after the clones")
        try:
            print("preset samples", await _speak(service, "A preset, designed live."), flush=True)
        except Exception as err:  # noqa: BLE001 - the probe reports it
            print("preset failed:", repr(err)[:300], flush=True)
        print("resident: Base", base.resident, "VoiceDesign", design.resident, flush=True)
        _memory("VoiceDesign in, Base out")
        print("Base engine alive after leaving:", first() is not None, flush=True)
        big = [o for o in gc.get_objects() if torch.is_tensor(o) and o.is_cuda and o.numel() * o.element_size() > 50e6]
        print("big CUDA tensors alive:", len(big), [(tuple(o.shape), str(o.dtype)) for o in big][:8], flush=True)
    finally:
        gc.unfreeze()
        await asyncio.to_thread(service.stop)


if __name__ == "__main__":
    asyncio.run(main())
