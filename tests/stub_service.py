"""A real ``TtsService`` on a stand-in engine, for in-process tests of the doors' parsing
and limits (the fuzz targets, overload unit tests): generation is instant and
deterministic, so a test spends its time in the code under test. Everything else (voice
catalogue, text cleaning and segmentation, scheduler, metrics) is the real thing. The
end-to-end tests use the real engine on tiny checkpoints instead.
"""

from __future__ import annotations

import asyncio
import contextlib
import threading
from collections.abc import AsyncIterator, Iterator

import numpy as np

from wyoming_qwen3tts.common.audio import SAMPLES_PER_FRAME
from wyoming_qwen3tts.engine import Engine, Segment
from wyoming_qwen3tts.engine.serial import SerialEngine
from wyoming_qwen3tts.common.metrics import Metrics
from wyoming_qwen3tts.service.speech import TtsService
from wyoming_qwen3tts.common.vocabulary import ModelKind
from wyoming_qwen3tts.catalogue.voices import VoiceCatalog

#: The stand-in CustomVoice model's speakers.
SPEAKERS = ["ryan", "vivian"]


class StubEngine(SerialEngine):
    """Noise instead of speech: ``frames`` codec frames a segment (at most its cap), in
    chunks of one frame; ``gate``, when given, must be set before each chunk."""

    def __init__(self, kind: ModelKind, frames: int = 2, gate: threading.Event | None = None) -> None:
        Engine.__init__(self, kind, chunk_frames=1, capacity=1)
        self.frames = frames
        self.gate = gate

    def speakers(self) -> list[str]:
        return list(SPEAKERS) if self.kind is ModelKind.CUSTOM_VOICE else []

    def stream(self, segment: Segment) -> Iterator[np.ndarray]:
        rng = np.random.default_rng(segment.seed or 0)
        for _ in range(min(self.frames, segment.max_new_tokens)):
            if self.gate is not None:
                self.gate.wait()
            yield (0.1 * rng.standard_normal(SAMPLES_PER_FRAME)).astype(np.float32)


@contextlib.asynccontextmanager
async def stub_service(
    max_queue: int = 32, frames: int = 2, gate: threading.Event | None = None
) -> AsyncIterator[TtsService]:
    """A started ``TtsService`` with VoiceDesign presets and two CustomVoice speakers."""
    engines: dict[ModelKind, Engine] = {
        kind: StubEngine(kind, frames, gate) for kind in (ModelKind.VOICE_DESIGN, ModelKind.CUSTOM_VOICE)
    }
    for engine in engines.values():
        engine.ready.set()
    service = TtsService(
        VoiceCatalog(None, set(engines), SPEAKERS), engines, "aria", Metrics(), max_queue=max_queue
    )
    try:
        yield service
    finally:
        if gate is not None:
            gate.set()
        await asyncio.to_thread(service.stop, 5.0)
