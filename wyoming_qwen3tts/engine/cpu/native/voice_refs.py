"""Clone clips' x-vectors and codec codes, extracted by the qwentts.cpp wheel itself.

The wheel's ``QwenTTS.extract_voice_ref`` runs qwentts.cpp's speaker encoder (ECAPA-TDNN) and
codec encoder over a 24 kHz clip, as the wheel engine (``engine.cpu.ggml``) does for its
clones; the same clip handling is used here (resampling to 24 kHz, and for an in-context
clone the 0.5 s of silence the other engines append). A wheel context holds all of its
model's weights, so by default one is made for an extraction and freed right after it (a
clip is extracted once: results are cached by its digest); ``keep_context`` keeps it.
Its loader prints its lines to the console, as the wheel engine's do while serving
(``quiet.native_output`` redirects the process's descriptors, which is safe at start only).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np

from ....common.vocabulary import Reference
from ...prompts import PROMPT_CACHE_SIZE, REFERENCE_TAIL_SECONDS
from ..ggml import NATIVE_RATE, _at_native_rate, _route_native_log
from .prompt import CloneVoice


class WheelVoiceRefs:
    """``refs(reference, icl) -> CloneVoice`` through a wheel context. Thread-safe (one
    extraction at a time).

    Args:
        talker, codec: the model's GGUF files (the wheel loads both).
        threads: the wheel context's CPU threads.
        keep_context: keep the context between extractions (its weights stay in memory).
    """

    def __init__(self, talker: Path, codec: Path, threads: int = 1, keep_context: bool = False) -> None:
        self.files = (talker, codec)
        self.threads = threads
        self.keep_context = keep_context
        self._context: Any = None
        self._lock = threading.Lock()
        self._cache: OrderedDict[tuple[str, bool], tuple[np.ndarray, np.ndarray]] = OrderedDict()

    def __call__(self, reference: Reference, icl: bool) -> CloneVoice:
        """The clip's x-vector, and with ``icl`` (and a transcript) its codes int64 [T, 16].

        Raises:
            qwentts_cpp_cpu.QwenTTSError: the library refused the clip or the files.
        """
        icl = icl and bool(reference.transcript)
        key = (reference.digest, icl)
        with self._lock:
            cached = self._cache.get(key)
            if cached is None:
                cached = self._extract(reference, icl)
                self._cache[key] = cached
                if len(self._cache) > PROMPT_CACHE_SIZE:
                    self._cache.popitem(last=False)
            else:
                self._cache.move_to_end(key)
        speaker, codes = cached
        if not icl:
            return CloneVoice(speaker, key=reference.digest)
        return CloneVoice(speaker, codes, reference.transcript, key=reference.digest)

    def _extract(self, reference: Reference, icl: bool) -> tuple[np.ndarray, np.ndarray]:
        audio = _at_native_rate(reference.audio, reference.sample_rate)
        if icl:  # end the ICL prompt on silence, as the other engines do
            audio = np.concatenate([audio, np.zeros(int(REFERENCE_TAIL_SECONDS * NATIVE_RATE), np.float32)])
        context = self._open()
        try:
            ref = context.extract_voice_ref(audio)
        finally:
            if not self.keep_context:
                self.close()
        codes = np.ascontiguousarray(np.asarray(ref.ref_codes, dtype=np.int64).T)  # [16, T] -> [T, 16]
        return np.asarray(ref.ref_spk_emb, dtype=np.float32).copy(), codes

    def _open(self) -> Any:
        if self._context is None:
            import qwentts_cpp_cpu

            _route_native_log()
            talker, codec = self.files
            self._context = qwentts_cpp_cpu.QwenTTS(talker, codec, cpu_threads=self.threads)
        return self._context

    def close(self) -> None:
        """Free the wheel context (the cache stays)."""
        if self._context is not None:
            self._context.close()
            self._context = None
