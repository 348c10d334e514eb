"""Clone prompts: a reference clip turned into qwen_tts ``VoiceClonePromptItem``s, cached."""

from __future__ import annotations

import threading
from collections import OrderedDict
from typing import Any

import numpy as np

from ..common.vocabulary import Reference

#: Silence appended to an ICL reference so the prompt ends on silence, not on a phoneme
#: that would bleed into the first generated word (faster-qwen3-tts does the same), in s.
REFERENCE_TAIL_SECONDS = 0.5
#: Speaker prompts kept in memory (each a few hundred KB at most).
PROMPT_CACHE_SIZE = 64


class ClonePrompts:
    """Speaker prompts of a Base model, computed once per reference content (LRU).

    Args:
        qwen: the loaded ``qwen_tts.Qwen3TTSModel``.
    """

    def __init__(self, qwen: Any) -> None:
        self._qwen = qwen
        self._cache: OrderedDict[str, list[Any]] = OrderedDict()
        self._lock = threading.Lock()

    def get(self, reference: Reference) -> list[Any]:
        """The prompt items for ``reference``: ICL (codec codes + transcript) when it has a
        transcript, else x-vector only. Keyed by ``reference.digest``.

        Raises:
            ValueError / RuntimeError: from qwen_tts for clips it cannot encode.
        """
        with self._lock:
            cached = self._cache.get(reference.digest)
            if cached is not None:
                self._cache.move_to_end(reference.digest)
                return cached
        audio = reference.audio
        if reference.transcript:
            tail = np.zeros(int(REFERENCE_TAIL_SECONDS * reference.sample_rate), dtype=np.float32)
            audio = np.concatenate([audio, tail])
        items = self._qwen.create_voice_clone_prompt(
            ref_audio=(audio, reference.sample_rate),
            ref_text=reference.transcript,
            x_vector_only_mode=reference.transcript is None,
        )
        with self._lock:
            self._cache[reference.digest] = items
            if len(self._cache) > PROMPT_CACHE_SIZE:
                self._cache.popitem(last=False)
        return items
