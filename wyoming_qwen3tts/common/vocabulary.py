"""The engine's vocabulary: what a segment asks the engine for, in words the service, the
voice catalogue and the engine all use.

* ``ModelKind``: which of the three Qwen3-TTS models speaks (Base clones, VoiceDesign
  describes, CustomVoice has built-in speakers);
* ``Reference``: a clone's reference clip as samples, its transcript and its digest;
* the limits the engine's memory plan is sized from: ``MAX_REFERENCE_SECONDS`` of reference
  audio and ``MAX_SEGMENT_SECONDS`` of speech a segment.

The voice catalogue (``catalogue.voices``) builds references from files and presets; the
engine only reads them. So this module stands below both and imports nothing of the project:
the engine never reaches the catalogue.
"""

from __future__ import annotations

import enum
import hashlib
from dataclasses import dataclass

import numpy as np

#: Longest reference clip used for cloning, in seconds. Longer clips are cut: the reference's
#: codec frames (12.5 per second) sit in the prompt and share the static KV cache.
MAX_REFERENCE_SECONDS = 20.0
#: Shortest audio any reference is built from (``Reference.from_audio``), in seconds: clone
#: clips are held to ``catalogue.voices.MIN_CLIP_SECONDS``, this lets a preset's rendered
#: anchor of a short ``anchor_text`` through.
MIN_REFERENCE_SECONDS = 0.5
#: Longest speech one segment may be estimated to need, in seconds. With the text front end's
#: budget (``text.segmenter.frame_budget``: 2x the estimate + 1 s) a segment generates at
#: most ~640 frames, which leaves >1400 of faster-qwen3-tts's default 2048-token static KV
#: cache for the prompt. The segmenter cuts text to it; the engine's memory plan
#: (``engine.gpu.sizing``) sizes a slot for it.
MAX_SEGMENT_SECONDS = 25.0


class ModelKind(str, enum.Enum):
    """Qwen3-TTS model kinds; each voice is spoken by exactly one."""

    BASE = "base"
    VOICE_DESIGN = "voice_design"
    CUSTOM_VOICE = "custom_voice"


class ClipTooShortError(ValueError):
    """A clip shorter than a minimum.

    Attributes:
        seconds: the clip's length (at most ``MAX_REFERENCE_SECONDS``: only that much is read).
        minimum: the length it fell short of, in seconds (``MIN_REFERENCE_SECONDS`` when a
            ``Reference`` refuses it).
    """

    def __init__(self, seconds: float, minimum: float) -> None:
        super().__init__(f"the clip is {seconds:.2f} s long, shorter than {minimum:g} s")
        self.seconds = seconds
        self.minimum = minimum


@dataclass(frozen=True, eq=False)
class Reference:
    """A clone reference clip.

    Built from samples (``from_audio``); the catalogue reads one from a file with
    ``catalogue.voices.load_reference``.

    Attributes:
        audio: float32 [n_samples], mono, in [-1, 1], at ``sample_rate``; at most
            ``MAX_REFERENCE_SECONDS`` long.
        sample_rate: Hz, as recorded (the model resamples).
        transcript: what the clip says, or None for x-vector-only cloning.
        digest: SHA-256 of the audio samples and transcript; keys the speaker-prompt cache,
            so an edited file gets a new prompt and a renamed one keeps its old one.
    """

    audio: np.ndarray
    sample_rate: int
    transcript: str | None
    digest: str

    @classmethod
    def from_audio(cls, audio: np.ndarray, sample_rate: int, transcript: str | None) -> Reference:
        """Build a reference from samples (any shape ``[n]`` or ``[n, channels]``, any dtype).

        Raises:
            ClipTooShortError: if the clip is empty or shorter than ``MIN_REFERENCE_SECONDS``.
        """
        mono = np.asarray(audio, dtype=np.float32)
        if mono.ndim > 1:
            mono = mono.mean(axis=1)
        mono = mono[: int(MAX_REFERENCE_SECONDS * sample_rate)]
        if len(mono) < sample_rate * MIN_REFERENCE_SECONDS:
            raise ClipTooShortError(len(mono) / sample_rate, MIN_REFERENCE_SECONDS)
        text = transcript.strip() if transcript and transcript.strip() else None
        digest = hashlib.sha256(mono.tobytes() + str(sample_rate).encode() + (text or "").encode())
        return cls(np.ascontiguousarray(mono), sample_rate, text, digest.hexdigest())
