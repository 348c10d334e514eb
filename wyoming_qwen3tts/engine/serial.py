"""Engines that generate one segment at a time (no slot pool)."""

from __future__ import annotations

import logging
from abc import abstractmethod
from collections.abc import Iterator
from typing import Any

import numpy as np

from ..common.audio import SAMPLES_PER_FRAME
from ..common.vocabulary import ModelKind
from .base import Engine, ModelMismatchError, Work, WorkSource
from .prompts import ClonePrompts
from .segment import Segment

_LOGGER = logging.getLogger(__name__)


class SerialEngine(Engine):
    """One generation at a time: take a segment, stream its chunks to its sink, repeat.

    Args:
        kind: the model kind.
        qwen: the loaded ``qwen_tts.Qwen3TTSModel``.
        chunk_frames: codec frames per chunk.

    Raises:
        ModelMismatchError: the checkpoint is of another kind.
    """

    def __init__(self, kind: ModelKind, qwen: Any, chunk_frames: int) -> None:
        super().__init__(kind, chunk_frames, capacity=1)
        model_type = getattr(qwen.model, "tts_model_type", None)
        if model_type != kind.value:
            raise ModelMismatchError(f"checkpoint is a {model_type!r} model, expected {kind.value!r}")
        self._qwen = qwen
        self.prompts = ClonePrompts(qwen)

    def speakers(self) -> list[str]:
        if self.kind is not ModelKind.CUSTOM_VOICE:
            return []
        return list(self._qwen.get_supported_speakers() or [])

    @abstractmethod
    def stream(self, segment: Segment) -> Iterator[np.ndarray]:
        """Generate one segment, yielding float32 [n_samples] chunks at 24 kHz in [-1, 1].

        Closing the iterator between chunks stops generation.

        Raises:
            ValueError / RuntimeError: from the model, for inputs it cannot take.
        """

    def warmup(self, segment: Segment) -> None:
        if sum(len(chunk) for chunk in self.stream(segment)) == 0:
            raise RuntimeError("warm-up generation produced no audio")

    def serve(self, source: WorkSource) -> None:
        while not source.closed():
            work = source.take(wait=None)
            if work is None:
                continue
            if work.sink.cancelled():
                work.sink.done(0)
                continue
            deliver(work, self.stream(work.segment))


def deliver(work: Work, chunks: Iterator[np.ndarray]) -> None:
    """Stream a generator's chunks (float32 [n_samples] at 24 kHz) into ``work``'s sink, one
    segment at a time: stop (closing the generator) when the client leaves, report a failure
    to the sink only (the engine lives on), and end with the frames delivered."""
    sink = work.sink
    samples = 0
    try:
        for chunk in chunks:
            if sink.cancelled():
                break
            samples += len(chunk)
            sink.audio(chunk)
    except Exception as err:  # noqa: BLE001 - reported to the client, the engine lives on
        _LOGGER.exception("Generation failed for %r", work.segment.text[:80])
        sink.failed(err)
        return
    finally:
        chunks.close()  # type: ignore[attr-defined]
    sink.done(samples // SAMPLES_PER_FRAME)
