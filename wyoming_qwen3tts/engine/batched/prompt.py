"""A segment's prefill: the talker input embeddings, built by faster-qwen3-tts's own code."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch

from ...voices import ModelKind
from ..prompts import ClonePrompts
from ..segment import Segment


@dataclass
class Prompt:
    """What a segment starts from.

    Attributes:
        embeds: talker input embeddings [P, hidden] in the model's dtype.
        pad_embed: the ``tts_pad`` embedding [hidden] added to every generated frame.
        ref_codes: ICL reference codes int64 [T, 16] (the codec decoder's left context), or None.
        ref_key: identifies ``ref_codes`` (the reference's digest), or None.
    """

    embeds: torch.Tensor
    pad_embed: torch.Tensor
    ref_codes: torch.Tensor | None = None
    ref_key: str | None = None


class PromptBuilder:
    """Builds prefill embeddings with ``FasterQwen3TTS._prepare_generation`` (Base) and
    ``_prepare_generation_custom`` (VoiceDesign, CustomVoice), always with the whole text in
    the prefill (``non_streaming_mode=True``: feeding text step by step makes long clone text
    drift).

    Args:
        kind: the model kind.
        tts: a ``faster_qwen3_tts.FasterQwen3TTS`` around the loaded model. Its own CUDA graphs
            are never captured or used.
        prompts: clone-prompt cache (Base only).
    """

    def __init__(self, kind: ModelKind, tts: Any, prompts: ClonePrompts) -> None:
        self.kind = kind
        self._tts = tts
        self._tts._warmed_up = True  # we never use (or capture) its single-stream graphs
        self._prompts = prompts

    def build(self, segment: Segment) -> Prompt:
        """The prompt of one segment.

        Raises:
            ValueError / NotImplementedError: unknown language or speaker, missing reference.
        """
        tts = self._tts
        qwen = tts.model
        with torch.inference_mode():
            if self.kind is ModelKind.BASE:
                reference = segment.reference
                if reference is None:
                    raise ValueError("the Base model needs a clone reference")
                _m, _t, _c, embeds, _mask, _trail, pad, ref_codes = tts._prepare_generation(
                    text=segment.text,
                    language=segment.language,
                    ref_text=reference.transcript or "",
                    non_streaming_mode=True,
                    voice_clone_prompt=self._prompts.get(reference),
                )
                key = reference.digest if ref_codes is not None else None
                return Prompt(embeds[0], pad.reshape(-1), ref_codes, key)
            qwen._validate_languages([segment.language])
            instruct = segment.instruct
            if self.kind is ModelKind.CUSTOM_VOICE:
                qwen._validate_speakers([segment.speaker])
                if qwen.model.tts_model_size in "0b6":  # the 0.6B CustomVoice takes no instruct
                    instruct = None
            else:
                instruct = instruct or ""
            _m, _t, _c, embeds, _mask, _trail, pad = tts._prepare_generation_custom(
                text=segment.text,
                language=segment.language,
                speaker=segment.speaker if self.kind is ModelKind.CUSTOM_VOICE else None,
                instruct=instruct,
                non_streaming_mode=True,
            )
            return Prompt(embeds[0], pad.reshape(-1))
