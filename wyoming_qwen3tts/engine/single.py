"""faster-qwen3-tts's own single-stream CUDA-graph generator, one segment at a time."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np

from ..common.vocabulary import ModelKind
from .segment import Segment
from .serial import SerialEngine


class SingleStreamEngine(SerialEngine):
    """faster-qwen3-tts's streaming generators: each chunk of ``chunk_frames`` codec frames
    is decoded and delivered as soon as it is generated; one stream at a time (the library
    is neither thread-safe nor re-entrant)."""

    backend = "faster-qwen3-tts single-stream CUDA graphs"

    def __init__(self, kind: ModelKind, tts: Any, chunk_frames: int) -> None:
        super().__init__(kind, tts.model, chunk_frames)
        self._tts = tts  # faster_qwen3_tts.FasterQwen3TTS

    def warmup(self, segment: Segment) -> None:
        self._tts.warmup()
        super().warmup(segment)

    def stream(self, segment: Segment) -> Iterator[np.ndarray]:
        import torch

        if segment.seed is not None:
            torch.manual_seed(segment.seed)
        s = segment.sampling
        common = dict(
            language=segment.language,
            max_new_tokens=segment.max_new_tokens,
            min_new_tokens=segment.min_new_tokens,
            chunk_size=self.chunk_frames,
            temperature=s.temperature or 1.0,
            do_sample=s.temperature > 0,
            top_k=s.top_k,
            top_p=s.top_p,
            repetition_penalty=s.repetition_penalty,
            # Whole text in the prefill: feeding it step by step makes long clone text drift.
            non_streaming_mode=True,
        )
        if self.kind is ModelKind.BASE:
            assert segment.reference is not None
            generator = self._tts.generate_voice_clone_streaming(
                text=segment.text,
                voice_clone_prompt=self.prompts.get(segment.reference),
                ref_text=segment.reference.transcript or "",
                **common,
            )
        elif self.kind is ModelKind.VOICE_DESIGN:
            generator = self._tts.generate_voice_design_streaming(
                text=segment.text, instruct=segment.instruct or "", **common
            )
        else:
            generator = self._tts.generate_custom_voice_streaming(
                text=segment.text, speaker=segment.speaker, instruct=segment.instruct, **common
            )
        try:
            for audio, _sample_rate, _timing in generator:
                yield np.asarray(audio, dtype=np.float32).reshape(-1)
        finally:
            generator.close()
