"""The CPU path: qwen_tts's reference model, one whole segment per call (slow)."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

from ..audio import SAMPLES_PER_FRAME
from ..voices import ModelKind
from .segment import Segment
from .serial import SerialEngine


class ReferenceEngine(SerialEngine):
    """qwen_tts on the CPU (float32). It has no streaming API: a segment's audio is generated
    whole, then cut into chunks of ``chunk_frames`` frames."""

    backend = "qwen_tts reference model (CPU)"

    def stream(self, segment: Segment) -> Iterator[np.ndarray]:
        import torch

        if segment.seed is not None:
            torch.manual_seed(segment.seed)
        common = dict(
            language=segment.language, max_new_tokens=segment.max_new_tokens, non_streaming_mode=True
        )
        if self.kind is ModelKind.BASE:
            assert segment.reference is not None
            wavs, _sr = self._qwen.generate_voice_clone(
                text=segment.text, voice_clone_prompt=self.prompts.get(segment.reference), **common
            )
        elif self.kind is ModelKind.VOICE_DESIGN:
            wavs, _sr = self._qwen.generate_voice_design(
                text=segment.text, instruct=segment.instruct or "", **common
            )
        else:
            wavs, _sr = self._qwen.generate_custom_voice(
                text=segment.text, speaker=segment.speaker, instruct=segment.instruct, **common
            )
        audio = np.asarray(wavs[0], dtype=np.float32).reshape(-1)
        step = self.chunk_frames * SAMPLES_PER_FRAME
        for start in range(0, len(audio), step):
            yield audio[start : start + step]
